//! What a program on several small devices is told of memory and then gets: the free bytes
//! under a limit that is no multiple of the pool's 512-byte blocks, the release threshold of a
//! device that is not the current one, and the last error of a refused IPC handle. The program
//! is `tests/c/memory_devices.c`, on the simulator with two 1 GiB devices.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use support::{number, ok, pooled, unpooled};

const MIB: u64 = 1 << 20;

fn program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| support::c_program("memory_devices"))
        .clone()
}

/// Two 1 GiB devices with a 64 MiB context each.
const DEVICES: [(&str, &str); 3] = [
    ("CUDASIM_DEVICES", "2"),
    ("CUDASIM_MEM", "1GiB"),
    ("CUDASIM_CONTEXT_BYTES", "64MiB"),
];

fn run(pool: bool, args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let mut all = DEVICES.to_vec();
    all.extend_from_slice(env);
    let exe = program();
    let (out, err) = if pool {
        ok(&mut pooled(&exe, args, &all))
    } else {
        ok(&mut unpooled(&exe, args, &all))
    };
    assert!(out.ends_with("memory devices ok\n"), "{out}\n{err}");
    (out, err)
}

#[test]
fn under_a_limit_of_any_size_the_free_bytes_reported_can_be_allocated() {
    // 500 000 000 bytes and 37% of 1 GiB (397 284 474 bytes) end 256 and 378 bytes past a
    // multiple of 512; the pool's blocks and segments are whole multiples of it.
    for limit in ["500000000", "37%"] {
        for expandable in ["0", "1"] {
            let (out, err) = run(
                true,
                &["exact"],
                &[("GPUPOOL_LIMIT", limit), ("GPUPOOL_EXPANDABLE", expandable)],
            );
            let n = |key: &str| number::<u64>(&out, key);
            for d in ["dev0", "dev1"] {
                let case = format!("{limit} expandable={expandable} {d}\n{out}\n{err}");
                // What the program was told is free, it gets: with a block live and without.
                assert_eq!(n(&format!("{d}_live_rc")), 0, "{case}");
                assert_eq!(n(&format!("{d}_idle_rc")), 0, "{case}");
                // Nothing live: the whole limit is free, and it is the device's size.
                let total = n(&format!("{d}_idle_total"));
                assert_eq!(n(&format!("{d}_idle_free")), total, "{case}");
                let asked = if limit == "37%" {
                    397_284_474
                } else {
                    500_000_000
                };
                assert!(total <= asked && asked - total < 512, "{case}");
            }
        }
    }
}

#[test]
fn on_a_device_that_ends_inside_a_granule_the_free_bytes_reported_can_be_allocated() {
    // A 65 MiB context leaves 959 MiB: the last MiB takes no 2 MiB granule, yet the driver
    // alone serves a request there, and so does the pool, not CUDA after the pool's refusal.
    let ctx = ("CUDASIM_CONTEXT_BYTES", "65MiB");
    let (alone, _) = run(false, &["exact"], &[ctx]);
    assert_eq!(
        number::<u64>(&alone, "dev0_idle_free"),
        959 * MIB,
        "{alone}"
    );
    for expandable in ["0", "1"] {
        let env = [
            ctx,
            ("GPUPOOL_EXPANDABLE", expandable),
            ("GPUPOOL_SUMMARY", "stderr"),
        ];
        let (out, err) = run(true, &["exact"], &env);
        let n = |key: &str| number::<u64>(&out, key);
        for d in ["dev0", "dev1"] {
            let case = format!("expandable={expandable} {d}\n{out}\n{err}");
            assert_eq!(n(&format!("{d}_idle_free")), 959 * MIB, "{case}");
            assert_eq!(n(&format!("{d}_live_rc")), 0, "{case}");
            assert_eq!(n(&format!("{d}_idle_rc")), 0, "{case}");
        }
        assert!(
            !err.contains("ran out of memory"),
            "expandable={expandable}\n{err}"
        );
    }
}

#[test]
fn a_synchronization_gives_back_the_cache_of_a_device_that_is_not_current() {
    // Without the pool the 512 MiB went back at each cudaFree.
    let (alone, _) = run(false, &["release", "env"], &[]);
    assert_eq!(
        number::<u64>(&alone, "held_after_device_sync"),
        0,
        "{alone}"
    );
    for how in ["env", "api", "mempool"] {
        for expandable in ["0", "1"] {
            for reuse in ["strict", "relaxed"] {
                let mut env = vec![("GPUPOOL_EXPANDABLE", expandable), ("GPUPOOL_REUSE", reuse)];
                if how == "env" {
                    env.push(("GPUPOOL_RELEASE_THRESHOLD", "0"));
                }
                let (out, err) = run(true, &["release", how], &env);
                let n = |key: &str| number::<u64>(&out, key);
                let case = format!("{how} expandable={expandable} {reuse}\n{out}\n{err}");
                assert_eq!(n("held_cached"), 512 * MIB, "{case}");
                // The program's next synchronization, of device 0, is a release point of
                // device 1 too: the driver has its memory back.
                assert_eq!(n("held_after_device_sync"), 0, "{case}");
                assert_eq!(n("held_after_stream_sync"), 0, "{case}");
            }
        }
    }
}

#[test]
fn a_refused_ipc_handle_is_also_the_programs_last_error() {
    const INVALID_VALUE: u64 = 1;
    let (alone, _) = run(false, &["ipc"], &[]);
    assert_eq!(number::<u64>(&alone, "small_rc"), 0, "{alone}");
    // A block inside a classic segment, and a block in virtual memory.
    for (expandable, key) in [("0", "small"), ("1", "large")] {
        let (out, err) = run(true, &["ipc"], &[("GPUPOOL_EXPANDABLE", expandable)]);
        let n = |k: &str| number::<u64>(&out, &format!("{key}_{k}"));
        assert_eq!(n("rc"), INVALID_VALUE, "{out}\n{err}");
        // As for every error the runtime returns, cudaGetLastError says it too.
        assert_eq!(n("last"), INVALID_VALUE, "{out}\n{err}");
    }
}
