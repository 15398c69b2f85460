//! The driver API under the pool (`tests/c/driver_pool.c`): a program linked with `-lcuda`, one
//! that reaches the driver as the static CUDA runtime does (`dlopen`, `cuGetProcAddress_v2`
//! with flags 0 and 2), and the `dlsym` fallback of versioned names. Each is pooled on segments
//! from the driver, with no runtime in the process; every other lookup reads as without the
//! pool.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use sim::Sim;
use support::{number, ok, pooled, unpooled};

fn program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| Sim::get().compile_driver(&support::root().join("tests/c/driver_pool.c")))
        .clone()
}

const ENV: &[(&str, &str)] = &[("CUDASIM_MEM", "1GiB"), ("CUDASIM_CONTEXT_BYTES", "0")];

/// Runs `mode` pooled (with `env` added) and unpooled; returns both stdouts and the pooled stderr.
fn both(mode: &str, env: &[(&str, &str)]) -> (String, String, String) {
    let exe = program();
    let all: Vec<(&str, &str)> = ENV.iter().chain(env).copied().collect();
    let (with, stderr) = ok(&mut pooled(&exe, &[mode], &all));
    let (without, _) = ok(&mut unpooled(&exe, &[mode], ENV));
    let done = format!("driver_pool {mode}: all checks passed");
    assert!(with.contains(&done), "{with}\n{stderr}");
    assert!(without.contains(&done), "{without}");
    (with, without, stderr)
}

/// What a user of the driver notices: segments taken from the driver once, not per call; the
/// cache counted as free; a created context's allocations and out-of-memory left to the driver.
fn assert_pooled(mode: &str, with: &str, without: &str) {
    let churn: u64 = number(with, "churn_driver_mallocs=");
    let asynchronous: u64 = number(with, "async_driver_mallocs=");
    assert!(
        churn <= 1,
        "{mode}: 100 cuMemAlloc took {churn} driver allocations"
    );
    assert!(
        asynchronous <= 1,
        "{mode}: 100 cuMemAllocAsync took {asynchronous}"
    );
    assert_eq!(number::<u64>(without, "churn_driver_mallocs="), 100);
    // The free memory the program sees is what it could get: the cache counts as free.
    assert_eq!(
        number::<u64>(with, "info_free="),
        number::<u64>(without, "info_free="),
        "{mode}"
    );
    assert_eq!(number::<u64>(with, "info_total="), 1 << 30);
    assert_eq!(number::<u64>(with, "created_context_driver_mallocs="), 10);
    assert_eq!(
        number::<u64>(with, "oom_after="),
        number::<u64>(without, "oom_after=")
    );
}

#[test]
fn linked_with_lcuda_is_pooled() {
    let (with, without, _) = both("lcuda", &[]);
    assert_pooled("lcuda", &with, &without);
}

#[test]
fn the_static_runtimes_way_is_pooled_with_both_flag_values() {
    for mode in ["static", "static-ptsz"] {
        let (with, without, _) = both(mode, &[]);
        assert_pooled(mode, &with, &without);
    }
}

#[test]
fn versioned_names_taken_with_dlsym_are_pooled() {
    let (with, without, _) = both("fallback", &[]);
    assert_pooled("fallback", &with, &without);
}

#[test]
fn driver_hooks_off_leaves_the_driver_alone() {
    for env in [("GPUPOOL_DRIVER_HOOKS", "0"), ("GPUPOOL_DISABLE", "1")] {
        let (with, _, _) = both("static", &[env]);
        assert_eq!(
            number::<u64>(&with, "churn_driver_mallocs="),
            100,
            "{env:?}"
        );
    }
}

#[test]
fn other_lookups_read_as_without_the_pool() {
    let (with, without, stderr) = both("lookups", &[]);
    assert_eq!(with, without);
    assert!(stderr.is_empty(), "{stderr}");
    assert!(with.contains("rtld_next_is_default=1"), "{with}");
}

#[test]
fn the_summary_counts_a_driver_only_program() {
    let (with, _, stderr) = both("lcuda", &[("GPUPOOL_SUMMARY", "stderr")]);
    assert!(with.contains("driver_pool lcuda"));
    assert!(stderr.contains("gpupool summary"), "{stderr}");
    assert!(stderr.contains("runtime libcuda.so.1"), "{stderr}");
}
