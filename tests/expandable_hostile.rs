//! Expandable segments against hostile programs (`tests/c/expandable_hostile.c`, linked with
//! the runtime and `-lcuda`): the program's own virtual memory beside the pool's, the cache
//! given back under a kernel still running, peers given access to small blocks, and
//! `cudaMemGetInfo` while freed blocks wait for their kernels.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use support::{number, ok, pooled, unpooled};

const GIB: u64 = 1 << 30;
const DEVICE: [(&str, &str); 2] = [("CUDASIM_MEM", "1GiB"), ("CUDASIM_CONTEXT_BYTES", "0")];

fn program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| support::c_program_with_driver("expandable_hostile"))
        .clone()
}

/// Runs `mode arg` with the pool (`GPUPOOL_EXPANDABLE` at `expandable`) or without it
/// (`None`), `env` added; its stdout.
fn run(expandable: Option<&str>, mode: &str, arg: &str, env: &[(&str, &str)]) -> String {
    let mut all: Vec<(&str, &str)> = DEVICE.iter().chain(env).copied().collect();
    let (out, err) = match expandable {
        Some(e) => {
            all.push(("GPUPOOL_EXPANDABLE", e));
            ok(&mut pooled(&program(), &[mode, arg], &all))
        }
        None => ok(&mut unpooled(&program(), &[mode, arg], &all)),
    };
    assert!(
        out.ends_with(&format!("expandable_hostile {mode} ok\n")),
        "{out}\n{err}"
    );
    out
}

#[test]
fn the_programs_own_cumemcreate_gets_the_memory_the_pool_caches() {
    // 700 MiB freed into the pool's cache on a 1 GiB device, then the program's own 800 MiB
    // of physical memory (PyTorch's expandable segments, NCCL's buffers): without the pool the
    // freed memory is the driver's again. The pool gives its cache back and the driver is asked
    // again, by symbol and through cuGetProcAddress, with and without a mapping of the
    // program's own beside, in expandable and classic segments.
    for mode in ["own-vmm", "own-vmm-map"] {
        for arg in ["symbol", "lookup"] {
            let out = run(None, mode, arg, &[]);
            assert_eq!(number::<i32>(&out, "own_create="), 0, "{out}");
            for expandable in ["1", "0"] {
                let out = run(Some(expandable), mode, arg, &[]);
                assert_eq!(
                    number::<i32>(&out, "own_create="),
                    0,
                    "{mode} {arg} expandable={expandable}: out of memory: {out}"
                );
            }
        }
    }
}

#[test]
fn a_cache_given_back_while_a_freed_blocks_kernel_runs_waits_for_it() {
    // A 64 MiB block freed under a 200 ms kernel on a non-blocking stream, its granules then
    // given back four ways: `cuMemUnmap` waits for nothing, so the pool fences first, in every
    // reuse mode (`relaxed` reuses the block at once, but unmaps it only after a fence).
    for how in ["sync", "trim", "empty", "oom"] {
        for reuse in ["strict", "barrier", "relaxed"] {
            let env = [("GPUPOOL_REUSE", reuse), ("GPUPOOL_RELEASE_THRESHOLD", "0")];
            let out = run(Some("1"), "trim-busy", how, &env);
            let n = |key: &str| number::<u64>(&out, key);
            // What stays mapped is the 1000 MiB block the request that needed them got.
            let kept = if how == "oom" { 1000 << 20 } else { 0 };
            assert_eq!(n("mapped_after="), kept, "{how} {reuse}: {out}");
            assert_eq!(n("unmapped_while_busy="), 0, "{how} {reuse}: {out}");
        }
    }
}

#[test]
fn a_peer_reaches_small_and_large_blocks_mapped_before_and_after_it_was_enabled() {
    // Small blocks come from a range of their own: device 1 gets access to it too.
    for when in ["before", "after"] {
        let out = run(Some("1"), "peer-small", when, &[("CUDASIM_DEVICES", "2")]);
        let n = |key: &str| number::<u64>(&out, key);
        assert_eq!(n("fill_small="), 0, "{when}: {out}");
        assert_eq!(n("fill_big="), 0, "{when}: {out}");
        assert_eq!(n("denied="), 0, "{when}: {out}");
    }
}

#[test]
fn memory_freed_under_a_running_kernel_counts_as_free_and_can_be_had() {
    // Without the pool `cudaFree` waits for the kernel and the memory is free; with it, the
    // block waits for a fence, which the request that needs it takes.
    for reuse in ["strict", "relaxed"] {
        let env = [("GPUPOOL_REUSE", reuse)];
        let out = run(Some("1"), "info-busy", "", &env);
        let n = |key: &str| number::<u64>(&out, key);
        assert_eq!(n("info_free="), GIB, "{reuse}: {out}");
        assert_eq!(n("info_all="), 0, "{reuse}: {out}");
        assert_eq!(n("unmapped_while_busy="), 0, "{reuse}: {out}");
    }
}

#[test]
fn a_fence_waits_for_the_kernels_of_a_context_the_program_made() {
    // A pool block used by a 300 ms kernel on a non-blocking stream of the program's own
    // context on the device, freed with the primary context current. Without the pool,
    // `cudaFree` waits for all the device's work; `strict` promises the same of its fence, in
    // classic and expandable segments. CUDA's synchronizations wait for one context alone: the
    // pool's fence synchronizes the program's contexts too, and the program's own
    // `cudaDeviceSynchronize` of the primary context proves nothing about them.
    for expandable in ["1", "0"] {
        for how in ["empty", "trim"] {
            let out = run(Some(expandable), "own-context", how, &[]);
            let n = |key: &str| number::<u64>(&out, key);
            assert_eq!(n("ctx_busy_now="), 0, "{expandable} {how}: {out}");
            assert_eq!(
                n("ctx_unmapped_while_busy_end="),
                0,
                "{expandable} {how}: {out}"
            );
        }
        for (how, budget) in [("reuse", "0"), ("sync-reuse", "256MiB")] {
            let env = [("GPUPOOL_FENCE_BYTES", budget)];
            let out = run(Some(expandable), "own-context", how, &env);
            // 0x55, the new owner's set, not the old kernel's 0x44 landing after it.
            assert_eq!(
                number::<u64>(&out, "ctx_reused_first="),
                0x55,
                "{expandable} {how}: handed out under the kernel: {out}"
            );
        }
    }
    let out = run(None, "own-context", "reuse", &[]);
    assert_eq!(number::<u64>(&out, "ctx_reused_first="), 0x55, "{out}");
}

/// Runs `mode arg` in `reuse` mode, in expandable and classic segments, and without the pool:
/// the first byte the block's new owner set reads 0x55 each time, not the old kernel's 0x44
/// landing after it.
fn assert_new_owner_keeps_its_bytes(mode: &str, arg: &str, reuse: &str) {
    assert_new_owner_keeps_its_bytes_with(mode, arg, &[("GPUPOOL_REUSE", reuse)]);
}

/// `assert_new_owner_keeps_its_bytes` with `env` for the pool (its reuse mode among them).
/// The outputs with the pool, expandable then classic.
fn assert_new_owner_keeps_its_bytes_with(
    mode: &str,
    arg: &str,
    env: &[(&str, &str)],
) -> Vec<String> {
    let mut pooled = Vec::new();
    for expandable in [Some("1"), Some("0"), None] {
        let out = run(expandable, mode, arg, env);
        assert_eq!(
            number::<u64>(&out, "new_owner_first="),
            0x55,
            "{expandable:?} {env:?} {arg}: the old kernel wrote over the new owner's bytes: {out}"
        );
        if expandable.is_some() {
            pooled.push(out);
        }
    }
    pooled
}

#[test]
fn a_barrier_waits_for_the_kernels_of_a_context_the_program_made() {
    // A pool block used by a 300 ms kernel on a blocking stream, or the NULL stream, of the
    // program's own context, freed with the primary context current; then the same size asked
    // for again, after the program's launch on the primary's legacy stream or with the pool's
    // own barrier, and set. Without the pool, `cudaFree` waits for all the device's work. In
    // CUDA each context has its own legacy stream: no barrier of the primary context orders
    // that kernel, so `barrier` mode must not hand the block out after one.
    for how in ["blocking", "null", "blocking-launch", "null-launch"] {
        assert_new_owner_keeps_its_bytes("own-context-ordered", how, "barrier");
    }
}

#[test]
fn a_block_a_barrier_made_reusable_waits_for_its_kernel_once_the_program_makes_a_context() {
    // A block freed under a 300 ms kernel on a blocking stream, reusable after the program's
    // launch on the legacy stream; then the program makes a context and uses the block again
    // there, where no barrier orders its work. Without the pool, `cudaFree` waited for the
    // kernel. The context's creation takes the fence the barrier stood in for.
    assert_new_owner_keeps_its_bytes("own-context-later", "", "barrier");
}

#[test]
fn in_relaxed_mode_a_stream_ordered_free_waits_for_a_fence_while_the_program_has_a_context() {
    // A block freed with `cudaFreeAsync` on the primary context's legacy stream, after the
    // kernel there that uses it, while a context the program made lives. A plain `cudaMalloc`
    // gets it after a barrier in `relaxed` mode; the new owner fills it in the program's
    // context, whose work that barrier does not order. Without the pool the free happens at the
    // kernel's end and the request gets other memory.
    assert_new_owner_keeps_its_bytes("own-context-async", "", "relaxed");
}

#[test]
fn a_barrier_waits_for_the_kernels_of_a_green_context() {
    // A pool block used by a 300 ms kernel on a stream of a green context (`cuGreenCtxCreate`,
    // `cuGreenCtxStreamCreate`), freed with the primary context current; then the same size
    // asked for again, with the pool's own barrier or after the program's launch on the
    // primary's legacy stream, and set. Without the pool, `cudaFree` waits for all the device's
    // work. A green context's streams are its own: no barrier of the primary context orders
    // that kernel, so `barrier` mode must not hand the block out after one.
    for how in ["", "launch"] {
        assert_new_owner_keeps_its_bytes("green-context", how, "barrier");
    }
}

#[test]
fn a_barrier_waits_for_a_green_contexts_stream_when_the_pool_missed_the_context() {
    // As above, but the green context is made through a pointer the pool did not swap
    // (`cuGetProcAddress` under `GPUPOOL_DRIVER_HOOKS=0`): only `cuGreenCtxStreamCreate`, which
    // the program calls by symbol (`-lcuda`), tells the pool of work beyond its barriers.
    let env = [("GPUPOOL_REUSE", "barrier"), ("GPUPOOL_DRIVER_HOOKS", "0")];
    for how in ["unswapped", "unswapped-launch"] {
        assert_new_owner_keeps_its_bytes_with("green-context", how, &env);
    }
}

#[test]
fn a_barrier_waits_for_a_non_blocking_stream_of_an_execution_context() {
    // A pool block used by a 300 ms kernel on a stream from `cudaExecutionCtxStreamCreate(...,
    // cudaStreamNonBlocking, 0)` in the primary execution context (CUDA 13.1), freed, asked for
    // again (after the pool's barrier or the program's launch on the legacy stream) and set.
    // Without the pool, `cudaFree` waits for the kernel; no barrier orders that stream.
    for how in ["", "launch"] {
        assert_new_owner_keeps_its_bytes("execution-ctx", how, "barrier");
    }
}

#[test]
fn a_barrier_orders_the_per_thread_default_stream() {
    // A pool block used by a 300 ms kernel on `cudaStreamPerThread`, freed, asked for again and
    // filled by a kernel on a blocking stream of the program's. The per-thread default stream is blocking:
    // the pool's barrier on the legacy stream orders it, so the block is reused at once
    // (`per_thread_reused_same=1`) and the new owner's bytes survive. A later launch on the
    // per-thread stream ("ptsz-launch") is no barrier: it orders nothing of other streams.
    for how in ["", "ptsz-launch"] {
        let env = [("GPUPOOL_REUSE", "barrier")];
        for out in assert_new_owner_keeps_its_bytes_with("per-thread", how, &env) {
            assert_eq!(number::<u64>(&out, "per_thread_reused_same="), 1, "{out}");
        }
    }
}

#[test]
fn a_fence_waits_for_the_kernels_of_a_green_context() {
    // The same block asked for again in `strict` mode, where a request takes a fence at once
    // (`GPUPOOL_FENCE_BYTES=0`) and gets the block back. The fence synchronizes the primary
    // context, which CUDA documents to synchronize the device's green contexts too.
    let env = [("GPUPOOL_REUSE", "strict"), ("GPUPOOL_FENCE_BYTES", "0")];
    for out in assert_new_owner_keeps_its_bytes_with("green-context", "", &env) {
        assert_eq!(number::<u64>(&out, "green_reused_same="), 1, "{out}");
    }
}

#[test]
fn a_synchronization_in_a_green_context_is_no_fence() {
    // A pool block used by a 300 ms kernel on a non-blocking stream of the primary context,
    // freed; then the program synchronizes with a green context current (`cudaDeviceSynchronize`
    // or `cuCtxSynchronize`), which waits for that green context's work alone; then the same
    // size is asked for with the primary context current and set on the legacy stream. In
    // `strict` mode (the fence budget not reached: no fence of the pool's own), and in
    // `barrier` mode, where frees wait for fences once a green context is made, that
    // synchronization must not make the block reusable. (`relaxed` reuses a `cudaFree`d block
    // at once, trusting stream order.)
    for reuse in ["strict", "barrier"] {
        for how in ["runtime", "driver"] {
            assert_new_owner_keeps_its_bytes("green-sync", how, reuse);
        }
    }
}

#[test]
fn another_threads_freed_blocks_go_back_for_a_request_that_needs_their_memory() {
    // A live thread allocated and freed 800 small blocks (their own range, some in its cache),
    // or one 900 MiB block; the main thread then asks for 900 MiB in the other range's sizes,
    // and, after 100 freed 5 MiB blocks, for all that cudaMemGetInfo says is free, in 3 MiB
    // blocks: served as without the pool, the cached granules unmapped for it.
    for mode in ["small-then-large", "large-then-small", "mixed-info"] {
        let without = run(None, mode, "", &[]);
        for reuse in ["strict", "relaxed"] {
            let out = run(Some("1"), mode, "", &[("GPUPOOL_REUSE", reuse)]);
            let n = |text: &str, key: &str| number::<u64>(text, key);
            assert_eq!(n(&out, "other_free="), GIB, "{mode} {reuse}: {out}");
            assert_eq!(n(&out, "other_error="), 0, "{mode} {reuse}: {out}");
            assert_eq!(
                n(&out, "other_got="),
                n(&without, "other_got="),
                "{mode} {reuse}: {out}"
            );
        }
    }
}
