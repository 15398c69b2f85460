//! What changes for a program when the pool's blocks are CUDA virtual memory (expandable
//! segments, `GPUPOOL_EXPANDABLE=1`), against classic segments and no pool: peer access enabled
//! through the runtime and the driver reaches them, IPC handles are refused with the driver's
//! error and a summary line naming the variable to set, `cuMemGetAddressRange` covers the block
//! and `cudaPointerGetAttributes` reads as without the pool; a device made current through the
//! driver alone reaches the other's blocks; a fence waits for the kernels of the devices given
//! peer access; the program's own context stays current across the pool's calls on another
//! device. The program is `tests/c/vmm_program.c`, on two simulated devices.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use support::{number, ok, pooled, unpooled};

/// `tests/c/vmm_program.c`, linked with the runtime and `-lcuda`.
fn program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| support::c_program_with_driver("vmm_program"))
        .clone()
}

const DEVICES: [(&str, &str); 3] = [
    ("CUDASIM_DEVICES", "2"),
    ("CUDASIM_MEM", "1GiB"),
    ("CUDASIM_CONTEXT_BYTES", "0"),
];

/// How the program runs: without the pool, or with it and `GPUPOOL_EXPANDABLE` at this value.
#[derive(Clone, Copy, Debug)]
enum Under {
    NoPool,
    Pool(&'static str),
}

const ALL: [Under; 3] = [Under::NoPool, Under::Pool("0"), Under::Pool("1")];

/// Runs `mode` under `under` with `env` added; (stdout, stderr).
fn run(mode: &str, under: Under, env: &[(&str, &str)]) -> (String, String) {
    let mut all: Vec<(&str, &str)> = DEVICES.iter().chain(env).copied().collect();
    let (out, err) = match under {
        Under::NoPool => ok(&mut unpooled(&program(), &[mode], &all)),
        Under::Pool(expandable) => {
            all.push(("GPUPOOL_EXPANDABLE", expandable));
            ok(&mut pooled(&program(), &[mode], &all))
        }
    };
    let done = format!("vmm_program {mode}: all checks passed");
    assert!(out.contains(&done), "{under:?}\n{out}\n{err}");
    (out, err)
}

#[test]
fn peer_access_enabled_reaches_pool_blocks_in_virtual_memory() {
    // Device 1 launches on and copies from device 0's blocks, one mapped before the program
    // enabled peer access and one after: the pool gives device 1 access to both.
    for mode in ["peer-runtime", "peer-driver"] {
        for under in ALL {
            let (out, err) = run(mode, under, &[]);
            let n = |key: &str| number::<i64>(&out, key);
            assert_eq!(n("use_before="), 0, "{mode} {under:?}\n{out}\n{err}");
            assert_eq!(n("use_after="), 0, "{mode} {under:?}\n{out}");
            assert_eq!(
                n("denied="),
                0,
                "{mode} {under:?}: refused for lack of access"
            );
            // Enabled twice: the second says so, with or without the pool.
            assert_eq!(n("enable_again="), 704, "{mode} {under:?}");
            assert!(!err.contains("refused device"), "{mode} {under:?}: {err}");
        }
    }
}

#[test]
fn a_copy_with_another_device_in_use_current_works_without_peer_access() {
    // cudaMalloc memory copies from any device current; mapped memory only where access was
    // given: the pool gives the devices in use access to each other's granules.
    for under in ALL {
        let (out, err) = run("copy-current", under, &[]);
        let n = |key: &str| number::<i64>(&out, key);
        for key in [
            "only_current_copy=",
            "to_host_0=",
            "to_host_1=",
            "to_peer_0=",
            "to_peer_1=",
            "denied=",
        ] {
            assert_eq!(n(key), 0, "{key} {under:?}\n{out}\n{err}");
        }
    }
}

#[test]
fn a_device_made_current_through_the_driver_is_in_use() {
    // A driver-API program (a static runtime's too) makes a device current with
    // cuCtxSetCurrent, cuCtxPushCurrent or cuCtxCreate, never cudaSetDevice: that device then
    // copies from and into another device's block, as on cudaMalloc memory.
    for mode in ["driver-set", "driver-push", "driver-create"] {
        let mut no_context = Vec::new();
        for under in ALL {
            let (out, err) = run(mode, under, &[]);
            let n = |key: &str| number::<i64>(&out, key);
            assert_eq!(n("from_block="), 0, "{mode} {under:?}\n{out}\n{err}");
            assert_eq!(n("content="), 1, "{mode} {under:?}\n{out}");
            assert_eq!(n("into_block="), 0, "{mode} {under:?}\n{out}");
            assert_eq!(n("denied="), 0, "{mode} {under:?}\n{out}");
            assert_eq!(n("written="), 1, "{mode} {under:?}\n{out}");
            no_context.push(n("no_context="));
        }
        // No context at all is the driver's business, answered as without the pool.
        assert!(
            no_context.iter().all(|&r| r == no_context[0]),
            "{mode}: {no_context:?}"
        );
    }
}

#[test]
fn ipc_of_a_block_in_virtual_memory_is_refused_and_the_summary_says_what_to_set() {
    let summary = [("GPUPOOL_SUMMARY", "stderr")];
    let (out, err) = run("ipc", Under::Pool("1"), &summary);
    // The driver's own answer for virtual memory: invalid value, from both APIs.
    assert_eq!(number::<i32>(&out, "ipc_runtime="), 1, "{out}");
    assert_eq!(number::<i32>(&out, "ipc_driver="), 1, "{out}");
    // A small block lies in virtual memory too.
    assert_eq!(number::<i32>(&out, "ipc_small="), 1, "{out}");
    assert_eq!(
        err.matches("which IPC handles cannot name").count(),
        1,
        "said once: {err}"
    );
    assert!(err.contains("GPUPOOL_EXPANDABLE=0"), "{err}");
    assert!(
        err.contains(
            " ipc        3 IPC handles refused on blocks in CUDA virtual memory: run with \
             GPUPOOL_EXPANDABLE=0 (classic segments) or GPUPOOL_DISABLE=1"
        ),
        "{err}"
    );
    // What the variable gives: with classic segments, and without the pool, the block shares.
    for under in [Under::NoPool, Under::Pool("0")] {
        let (out, err) = run("ipc", under, &summary);
        for key in ["ipc_runtime=", "ipc_driver=", "ipc_small="] {
            assert_eq!(number::<i32>(&out, key), 0, "{under:?} {key}\n{out}\n{err}");
        }
        assert!(!err.contains(" ipc "), "{under:?}: {err}");
    }
}

#[test]
fn pointer_queries_cover_a_block_in_virtual_memory() {
    for under in ALL {
        let (out, err) = run("queries", under, &[]);
        let n = |key: &str| number::<i64>(&out, key);
        // The range the driver reports holds the whole block (the driver alone would report
        // the one 2 MiB mapping holding the address).
        assert_eq!(n("range_covers="), 1, "{under:?}\n{out}\n{err}");
        assert_eq!(n("range_size_alone="), 1, "{under:?}");
        // Device memory of its own device, the pointer itself, as without the pool.
        assert_eq!(n("attr_type="), 2, "{under:?}");
        assert_eq!(n("attr_device="), 0, "{under:?}");
        assert_eq!(n("attr_pointer="), 1, "{under:?}");
        assert_eq!(n("attr_host_null="), 1, "{under:?}");
        assert_eq!(n("attr1_type="), 2, "{under:?}");
        assert_eq!(n("attr1_device="), 1, "{under:?}");
    }
}

#[test]
fn a_fence_waits_for_the_kernels_of_the_devices_given_peer_access() {
    // Device 1, given access to device 0's memory through the runtime, the driver or device
    // 0's default memory pool (`cudaMemPoolSetAccess`, PyTorch's `cudaMallocAsync` backend's
    // way, or `cuMemPoolSetAccess`, a static runtime's), runs kernels on blocks of device 0 that device 0 then frees. `cuMemUnmap` waits
    // for nothing, and a `strict` block is reusable only after a fence: device 0's fence must
    // wait for device 1's kernels too. The program's own synchronization of device 0 does not
    // prove them done either.
    for mode in [
        "fence-runtime",
        "fence-driver",
        "fence-pool-access",
        "fence-pool-access-driver",
        "fence-sync",
    ] {
        for expandable in ["0", "1"] {
            for reuse in ["strict", "relaxed"] {
                let env = [("GPUPOOL_REUSE", reuse)];
                let (out, err) = run(mode, Under::Pool(expandable), &env);
                let n = |key: &str| number::<u64>(&out, key);
                let case = format!("{mode} expandable={expandable} {reuse}");
                assert_eq!(n("unmapped_while_busy="), 0, "{case}\n{out}\n{err}");
                if reuse == "strict" {
                    // `relaxed` reuses a block freed with `cudaFree` at once, by its contract.
                    assert_eq!(n("reused_busy="), 0, "{case}\n{out}");
                }
                if reuse == "strict" && mode != "fence-sync" {
                    assert!(
                        n("peer_syncs=") >= 1,
                        "{case}: device 1 never waited\n{out}"
                    );
                }
            }
        }
    }
}

#[test]
fn through_the_driver_alone_a_fence_waits_for_the_peer_in_its_primary_context() {
    // No runtime call: the pool's fence is `cuCtxSynchronize`, and device 1's is made with its
    // primary context current for the while, then device 0's again.
    for expandable in ["0", "1"] {
        let env = [
            ("GPUPOOL_REUSE", "strict"),
            ("GPUPOOL_FENCE_BYTES", "512KiB"),
        ];
        let (out, err) = run("fence-driver-only", Under::Pool(expandable), &env);
        let n = |key: &str| number::<u64>(&out, key);
        let case = format!("expandable={expandable}");
        assert_eq!(n("reused="), 1, "{case}\n{out}\n{err}");
        assert_eq!(n("reused_busy="), 0, "{case}\n{out}");
        assert!(n("peer_syncs=") >= 1, "{case}\n{out}");
        assert_eq!(n("context_kept="), 1, "{case}\n{out}");
    }
}

#[test]
fn a_barrier_orders_the_reuse_after_the_kernels_of_the_devices_given_peer_access() {
    // `barrier` mode: a block of device 0 freed under device 1's kernel is handed out after a
    // barrier, with no host wait; device 0's next kernel on it must start after device 1's.
    // The program's own launch on device 0's legacy stream orders nothing of device 1's.
    for mode in ["fence-barrier", "fence-launch"] {
        for expandable in ["0", "1"] {
            let env = [("GPUPOOL_REUSE", "barrier")];
            let (out, err) = run(mode, Under::Pool(expandable), &env);
            let n = |key: &str| number::<u64>(&out, key);
            let case = format!("{mode} expandable={expandable}");
            assert_eq!(n("reused="), 1, "{case}\n{out}\n{err}");
            assert_eq!(n("clobbered="), 0, "{case}\n{out}");
        }
    }
}

#[test]
fn a_fence_waits_for_no_other_device_without_peer_access() {
    // The same kernels on device 1, which was never given access: a fence of device 0 stays
    // one device's synchronization.
    for expandable in ["0", "1"] {
        let env = [("GPUPOOL_REUSE", "strict")];
        let (out, err) = run("fence-none", Under::Pool(expandable), &env);
        assert_eq!(
            number::<u64>(&out, "peer_syncs="),
            0,
            "{expandable}\n{out}\n{err}"
        );
    }
}

#[test]
fn a_context_the_program_made_stays_current_across_the_pools_calls_on_another_device() {
    // The pool acts on device 1 (a fence, a segment's release) with device 1 made current for
    // the while, then puts back exactly the context the program had: `cudaSetDevice(0)` would
    // make device 0's primary context current instead of the program's own.
    for under in ALL {
        for reuse in ["strict", "relaxed"] {
            let (out, err) = run("own-context", under, &[("GPUPOOL_REUSE", reuse)]);
            let n = |key: &str| number::<u64>(&out, key);
            assert_eq!(
                n("own_context_current="),
                1,
                "{under:?} {reuse}\n{out}\n{err}"
            );
            assert_eq!(n("current_device="), 0, "{under:?} {reuse}\n{out}");
        }
    }
}
