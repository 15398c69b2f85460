//! Expandable segments over a device's life, on the simulator: a reset gives
//! their virtual memory back (the driver keeps it otherwise), and a driver that refuses virtual
//! memory leaves the program served from classic segments. The program is
//! `tests/c/expandable_lifecycle.c`.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use support::{number, ok, pooled, unpooled};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const DEVICE: [(&str, &str); 3] = [
    ("CUDASIM_MEM", "1GiB"),
    ("CUDASIM_CONTEXT_BYTES", "0"),
    ("GPUPOOL_EXPANDABLE", "1"),
];

fn program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| support::c_program("expandable_lifecycle"))
        .clone()
}

fn run(pool: bool, mode: &str, env: &[(&str, &str)]) -> (String, String) {
    let mut all = DEVICE.to_vec();
    all.extend_from_slice(env);
    let exe = program();
    let (out, err) = if pool {
        ok(&mut pooled(&exe, &[mode], &all))
    } else {
        ok(&mut unpooled(&exe, &[mode], &all))
    };
    assert!(out.ends_with("expandable_lifecycle ok\n"), "{out}\n{err}");
    (out, err)
}

#[test]
fn a_reset_gives_the_mapped_memory_back() {
    for mode in ["reset-runtime", "reset-driver"] {
        for reuse in ["strict", "relaxed"] {
            let (out, err) = run(true, mode, &[("GPUPOOL_REUSE", reuse)]);
            let n = |key: &str| number::<u64>(&out, key);
            // The blocks were mapped, live and cached (160 MiB in 2 MiB granules).
            assert!(
                n("mapped_before=") >= 160 * MIB,
                "{mode} {reuse}: {out}\n{err}"
            );
            // A context's destruction leaves virtual memory to whoever mapped it: the pool gave
            // every granule and handle back, so the whole device is free again.
            assert_eq!(n("mapped_after_reset="), 0, "{mode} {reuse}: {out}");
            assert_eq!(n("created_after_reset="), 0, "{mode} {reuse}: {out}");
            assert_eq!(n("live_after_reset="), 0, "{mode} {reuse}: {out}");
            assert_eq!(n("free_after_reset="), GIB, "{mode} {reuse}: {out}");
            assert_eq!(n("unmapped_while_busy="), 0, "{mode} {reuse}: {out}");
        }
        let (without, _) = run(false, mode, &[]);
        assert_eq!(
            number::<u64>(&without, "free_after_reset="),
            GIB,
            "{without}"
        );
    }
}

#[test]
fn a_driver_that_refuses_virtual_memory_leaves_classic_segments() {
    // CUDA_ERROR_NOT_SUPPORTED (801) for the first cuMemCreate: the request is served from a
    // classic segment, with no error left for the program, and no granule is mapped later.
    let (out, err) = run(true, "fallback", &[("CUDASIM_FAIL", "cuMemCreate@1=801")]);
    let n = |key: &str| number::<u64>(&out, key);
    assert_eq!(n("fallback_maps="), 0, "{out}\n{err}");
    assert!(n("fallback_mallocs=") >= 1, "{out}");
    assert_eq!(n("fallback_last_error="), 0, "{out}");
    // Said once, with the setting that chooses classic segments from the start.
    assert_eq!(err.matches("expandable segments off").count(), 1, "{err}");
    assert!(err.contains("GPUPOOL_EXPANDABLE=0"), "{err}");
    // Without the refusal the same program maps granules.
    let (out, _) = run(true, "fallback", &[]);
    assert!(number::<u64>(&out, "fallback_maps=") > 0, "{out}");
}
