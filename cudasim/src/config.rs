//! The simulator's configuration: environment variables, read once at the first call.

use crate::errors::{CudaResult, INITIALIZATION_ERROR};
use crate::faults::{self, FaultSpec};
use std::sync::OnceLock;

/// The most devices `CUDASIM_DEVICES` may ask for.
pub const MAX_DEVICES: usize = 72;

#[derive(Debug)]
pub struct Config {
    /// `CUDASIM_DEVICES`: number of devices.
    pub devices: usize,
    /// `CUDASIM_MEM`: capacity of each device, bytes: one size for all, or a comma-separated
    /// list whose last size also holds for the devices after it (`24GiB,48GiB`).
    capacities: Vec<u64>,
    /// `CUDASIM_CONTEXT_BYTES`: what a device's context takes from its capacity once used.
    pub context_bytes: u64,
    /// `CUDASIM_MALLOC_US`: latency of every synchronous device allocation, microseconds.
    pub malloc_us: u64,
    /// `CUDASIM_FREE_US`: latency of every `cudaFree` of a non-NULL pointer, microseconds.
    pub free_us: u64,
    /// `CUDASIM_FAIL`: faults to inject.
    pub faults: Vec<FaultSpec>,
    /// `CUDASIM_NO_DRIVER=1`: the runtime calls its internals directly instead of reaching
    /// the driver through `cuGetProcAddress` (a runtime with no driver behind it).
    pub no_driver: bool,
    /// `CUDASIM_LINK_DELAY_MS`: how long the runtime takes to link the driver at its first call
    /// that needs it, milliseconds (for tests that fork meanwhile).
    pub link_delay_ms: u64,
    /// `CUDASIM_SYNC_DELAY_MS`: how long a device synchronization waits before it looks at the
    /// device's captures, milliseconds (for tests of what begins meanwhile).
    pub sync_delay_ms: u64,
    /// `CUDASIM_VMM_RDMA=0`: the devices do not support GPUDirect RDMA on virtual memory
    /// (`CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED` is 0, and `cuMemCreate`
    /// refuses the flag).
    pub vmm_rdma: bool,
}

static CONFIG: OnceLock<Result<Config, String>> = OnceLock::new();

/// The configuration, read from the environment at the first call. A bad variable makes every
/// call that needs the configuration fail with `cudaErrorInitializationError` (the reason is
/// printed once on stderr).
pub fn get() -> CudaResult<&'static Config> {
    CONFIG
        .get_or_init(|| {
            // The fork handlers first: a fork after any call sees them registered, not being
            // registered by another thread (a child would wait forever for that `Once`).
            crate::state::watch_forks();
            let parsed = from_env(|name| std::env::var(name).ok());
            match &parsed {
                Ok(cfg) => faults::arm_from_config(&cfg.faults),
                Err(why) => eprintln!("cudasim: {why}; every CUDA call will fail"),
            }
            parsed
        })
        .as_ref()
        .map_err(|_| INITIALIZATION_ERROR)
}

/// Builds the configuration from a variable lookup (the environment, or a test's map).
fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
    let value = |name: &str, default: &str, parse: fn(&str) -> Option<u64>| {
        let text = var(name).unwrap_or_else(|| default.to_string());
        parse(text.trim()).ok_or_else(|| format!("bad {name}={text:?}"))
    };
    let devices = value("CUDASIM_DEVICES", "1", |s| s.parse().ok())?;
    if devices == 0 || devices > MAX_DEVICES as u64 {
        return Err(format!(
            "bad CUDASIM_DEVICES={devices} (must be 1..={MAX_DEVICES})"
        ));
    }
    let faults = match var("CUDASIM_FAIL") {
        Some(spec) => faults::parse_spec(&spec).map_err(|e| format!("bad CUDASIM_FAIL: {e}"))?,
        None => Vec::new(),
    };
    Ok(Config {
        devices: devices as usize,
        capacities: capacities(&var("CUDASIM_MEM").unwrap_or_else(|| "80GiB".to_string()))?,
        context_bytes: value("CUDASIM_CONTEXT_BYTES", "300MiB", parse_size)?,
        malloc_us: value("CUDASIM_MALLOC_US", "0", |s| s.parse().ok())?,
        free_us: value("CUDASIM_FREE_US", "0", |s| s.parse().ok())?,
        faults,
        no_driver: value("CUDASIM_NO_DRIVER", "0", flag)? == 1,
        vmm_rdma: value("CUDASIM_VMM_RDMA", "1", flag)? == 1,
        link_delay_ms: value("CUDASIM_LINK_DELAY_MS", "0", |s| s.parse().ok())?,
        sync_delay_ms: value("CUDASIM_SYNC_DELAY_MS", "0", |s| s.parse().ok())?,
    })
}

impl Config {
    /// Device `d`'s capacity, bytes.
    pub fn capacity(&self, d: usize) -> u64 {
        let last = self.capacities.len() - 1;
        self.capacities[d.min(last)]
    }
}

/// `CUDASIM_MEM`'s sizes, one per device from the first (at least one).
fn capacities(text: &str) -> Result<Vec<u64>, String> {
    text.split(',')
        .map(|size| parse_size(size.trim()))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| format!("bad CUDASIM_MEM={text:?}"))
}

/// A switch: `0` or `1`.
fn flag(s: &str) -> Option<u64> {
    match s {
        "0" | "1" => s.parse().ok(),
        _ => None,
    }
}

/// Parses a size: a decimal number followed by an optional unit, `B`, `KiB`, `MiB`, `GiB`, or
/// `K`, `M`, `G` (also binary: 1K = 1024 bytes). No unit means bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        _ => return None,
    };
    number.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<Config, String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        from_env(|name| vars.get(name).cloned())
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("3B"), Some(3));
        assert_eq!(parse_size("2K"), Some(2048));
        assert_eq!(parse_size("2KiB"), Some(2048));
        assert_eq!(parse_size("300MiB"), Some(300 << 20));
        assert_eq!(parse_size("80GiB"), Some(80 << 30));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("1T"), None);
        assert_eq!(parse_size("GiB"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("99999999999999999999G"), None);
    }

    #[test]
    fn defaults_and_errors() {
        let c = config(&[]).unwrap();
        assert_eq!((c.devices, c.capacity(0)), (1, 80 << 30));
        assert_eq!((c.context_bytes, c.malloc_us, c.free_us), (300 << 20, 0, 0));
        assert!(c.faults.is_empty());
        assert!(!c.no_driver);
        assert!(config(&[("CUDASIM_NO_DRIVER", "1")]).unwrap().no_driver);
        assert!(config(&[("CUDASIM_NO_DRIVER", "yes")]).is_err());
        assert!(c.vmm_rdma);
        assert!(!config(&[("CUDASIM_VMM_RDMA", "0")]).unwrap().vmm_rdma);
        assert!(config(&[("CUDASIM_VMM_RDMA", "no")]).is_err());
        let c = config(&[("CUDASIM_DEVICES", "2"), ("CUDASIM_FREE_US", "5")]).unwrap();
        assert_eq!((c.devices, c.free_us), (2, 5));
        assert!(config(&[("CUDASIM_DEVICES", "0")]).is_err());
        assert!(config(&[("CUDASIM_DEVICES", "73")]).is_err());
        assert!(config(&[("CUDASIM_MEM", "lots")]).is_err());
        assert!(config(&[("CUDASIM_MEM", "1GiB,")]).is_err());
        let c = config(&[("CUDASIM_DEVICES", "3"), ("CUDASIM_MEM", "1GiB, 2GiB")]).unwrap();
        assert_eq!(
            (c.capacity(0), c.capacity(1), c.capacity(2)),
            (1 << 30, 2 << 30, 2 << 30)
        );
        assert!(config(&[("CUDASIM_FAIL", "cudaMalloc@x=2")]).is_err());
    }
}
