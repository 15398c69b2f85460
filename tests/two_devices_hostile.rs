//! Hostile uses of two devices, each compared with the same program without the pool: a
//! runtime allocation in a context the program made, a reset of device 1 from another thread,
//! graph allocations of a capture, device 0's kernel on device 1's block while it is freed and
//! given back, IPC handles the summary counts, and driver calls after a thread's first runtime
//! call. The program is
//! `tests/c/two_devices_hostile.c`, on two 1 GiB devices.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use support::{ok, pooled, unpooled};

/// `tests/c/two_devices_hostile.c`, linked with the runtime and `-lcuda`.
fn program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| support::c_program_with_driver("two_devices_hostile"))
        .clone()
}

const DEVICES: [(&str, &str); 3] = [
    ("CUDASIM_DEVICES", "2"),
    ("CUDASIM_MEM", "1GiB"),
    ("CUDASIM_CONTEXT_BYTES", "64MiB"),
];

/// Runs `mode`, with the pool or without, `env` added; (stdout, stderr).
fn run(mode: &str, pool: bool, env: &[(&str, &str)]) -> (String, String) {
    let all: Vec<(&str, &str)> = DEVICES.iter().chain(env).copied().collect();
    let (out, err) = if pool {
        ok(&mut pooled(&program(), &[mode], &all))
    } else {
        ok(&mut unpooled(&program(), &[mode], &all))
    };
    assert!(
        out.ends_with("two devices hostile ok\n"),
        "{mode} pool={pool}\n{out}\n{err}"
    );
    (out, err)
}

/// `mode` prints the same with the pool, in each reuse mode and both kinds of segments, as
/// without it.
fn reads_as_without_the_pool(mode: &str, extra: &[(&str, &str)]) {
    let (alone, _) = run(mode, false, extra);
    for reuse in ["strict", "barrier", "relaxed"] {
        for expandable in ["0", "1"] {
            let mut env = vec![("GPUPOOL_REUSE", reuse), ("GPUPOOL_EXPANDABLE", expandable)];
            env.extend_from_slice(extra);
            let (out, err) = run(mode, true, &env);
            assert_eq!(out, alone, "{mode} {reuse} expandable={expandable}\n{err}");
        }
    }
}

#[test]
fn a_runtime_allocation_in_a_context_the_program_made_is_left_to_cuda_and_dies_with_it() {
    // Before: the pool served these from segments made in that context. cuCtxDestroy freed
    // them, and the next 8 MiB block, in the primary context, was in the freed memory
    // (cudaMemset answered 1 with classic segments); the free of a block that died with the
    // context answered 0 instead of 1, and 16 MiB stayed mapped with expandable segments.
    // The same with the contexts of cuCtxCreate_v3, which a lookup of cuCtxCreate gives from
    // CUDA 11.4 to 12.4, and of cuCtxCreate_v4, CUDA 13's cuCtxCreate.
    for mode in ["own-context", "own-context-v3", "own-context-v4"] {
        reads_as_without_the_pool(mode, &[]);
        let (_, err) = run(mode, true, &[("GPUPOOL_SUMMARY", "stderr")]);
        assert!(
            err.contains("2 allocations (16.0 MiB) in a CUDA context the program created"),
            "{mode}\n{err}"
        );
    }
}

#[test]
fn a_reset_of_device_1_from_another_thread_keeps_device_0_and_reads_as_without_the_pool() {
    // Device 0's blocks intact and freed with device 1 current, nothing freed twice, device 1's
    // old blocks refused, its new ones served, and its free memory as without the pool.
    reads_as_without_the_pool("reset-other", &[]);
    reads_as_without_the_pool("reset-other", &[("GPUPOOL_RELEASE_THRESHOLD", "0")]);
}

#[test]
fn a_threads_first_runtime_call_served_by_the_pool_gives_it_the_context_cuda_would() {
    // Before: a thread whose first CUDA call the pool served (a cached cudaMalloc, a cudaFree
    // of device 1's block with device 0 current, cudaFreeAsync, cudaMallocAsync) made no runtime
    // call, so the runtime never made device 0's primary context the thread's. Its next driver
    // calls, cuMemcpyHtoD and cuMemAlloc, failed with CUDA_ERROR_INVALID_CONTEXT (201) where
    // without the pool they succeed.
    let (alone, _) = run("fresh-thread", false, &[]);
    assert_eq!(
        alone
            .lines()
            .filter(|l| l.ends_with("context=1 copy=0 driver_alloc=0"))
            .count(),
        4,
        "{alone}"
    );
    reads_as_without_the_pool("fresh-thread", &[]);
}

#[test]
fn a_thread_that_lost_its_context_gets_it_back_from_its_next_runtime_call_the_pool_serves() {
    // A thread with pool memory drops its context (cuCtxSetCurrent(NULL), cuCtxPopCurrent, or
    // cuCtxDestroy of a context it had made current), then calls cudaMalloc, cudaFree,
    // cudaMallocAsync or cudaFreeAsync, then cuMemcpyHtoD. CUDA's runtime call binds the
    // primary context again and the copy succeeds; with no runtime call between, it fails with
    // CUDA_ERROR_INVALID_CONTEXT (201), and the pool must not bind one there either.
    let (alone, _) = run("lost-context", false, &[]);
    let lines = |text: &str, end: &str| text.lines().filter(|l| l.ends_with(end)).count();
    assert_eq!(lines(&alone, "=0 context=1 copy=0"), 12, "{alone}");
    assert_eq!(lines(&alone, "_none=0 context=0 copy=201"), 3, "{alone}");
    reads_as_without_the_pool("lost-context", &[]);
    // The pool answered each of those calls from its cache, with no runtime call of its own
    // making the thread's context.
    let (_, err) = run("lost-context", true, &[]);
    assert_eq!(lines(&err, "runtime_calls=0"), 15, "{err}");
}

#[test]
fn a_captures_stream_ordered_allocations_and_their_frees_reach_cuda() {
    reads_as_without_the_pool("graph", &[]);
}

#[test]
fn a_peers_kernel_on_a_freed_block_given_back_at_once_is_never_unmapped_under_or_clobbered() {
    // Without the pool CUDA's cudaFree on device 1 does not wait for device 0's kernel: only
    // the pool's run is checked, with the cache given back at every release point. `relaxed`
    // trusts stream order, which a peer's stream escapes.
    for reuse in ["strict", "barrier"] {
        for expandable in ["0", "1"] {
            let env = [
                ("GPUPOOL_REUSE", reuse),
                ("GPUPOOL_EXPANDABLE", expandable),
                ("GPUPOOL_RELEASE_THRESHOLD", "0"),
            ];
            let (out, err) = run("peer-release", true, &env);
            let case = format!("{reuse} expandable={expandable}\n{out}\n{err}");
            for line in [
                "unmapped_while_busy=0",
                "disable=0",
                "disable_again=705",
                "enable_again=0",
                "accessed_without_access=0",
            ] {
                assert!(out.lines().any(|l| l == line), "{line}: {case}");
            }
        }
    }
}

#[test]
fn the_summary_counts_only_the_ipc_handles_cuda_would_have_given() {
    // Before: a call with no handle to write (either API) and a handle asked of freed memory
    // the pool caches were counted as refusals too, 6 where the program had 1, and with
    // expandable segments a freed pointer was said to be a block in virtual memory.
    let (alone, _) = run("ipc", false, &[]);
    for expandable in ["0", "1"] {
        let env = [
            ("GPUPOOL_EXPANDABLE", expandable),
            ("GPUPOOL_SUMMARY", "stderr"),
        ];
        let (out, err) = run("ipc", true, &env);
        let case = format!("expandable={expandable}\n{out}\n{err}");
        // The one handle refused is of a pointer inside a block that does not start a segment.
        let differs: Vec<_> = alone
            .lines()
            .zip(out.lines())
            .filter(|(a, b)| a != b)
            .collect();
        assert_eq!(
            differs,
            [("ipc_second_inside=0", "ipc_second_inside=1")],
            "{case}"
        );
        // With expandable segments the 1 MiB blocks lie in virtual memory: that is the reason
        // given, once, for the one handle.
        let (why, virtual_memory) = match expandable {
            "0" => ("inside a segment: run with GPUPOOL_DISABLE=1", 0),
            _ => (
                "in CUDA virtual memory: run with GPUPOOL_EXPANDABLE=0 (classic segments) or \
                 GPUPOOL_DISABLE=1",
                1,
            ),
        };
        let ipc: Vec<_> = err.lines().filter(|l| l.starts_with(" ipc ")).collect();
        assert_eq!(
            ipc,
            [format!(" ipc        1 IPC handle refused on blocks {why}")],
            "{case}"
        );
        assert_eq!(
            err.matches("virtual memory (expandable segments)").count(),
            virtual_memory,
            "{case}"
        );
    }
}
