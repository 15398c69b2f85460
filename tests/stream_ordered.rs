//! The stream-ordered route (PyTorch's `cudaMallocAsync` backend under the preload), attacked:
//! `tests/c/async_hostile.c` frees blocks under slow kernels through `cudaFreeAsync`,
//! `cuMemFreeAsync`, their `_ptsz` forms and `cudaFree`, and asks for them again on other
//! streams, on event chains, after a stream's destruction and with another device current, in
//! every reuse mode, in expandable and classic segments. The device has room for one block, so
//! each request is served by the freed block or by a fence: a block handed out before the old
//! kernel's work is ordered before the new owner's gets its late write over the new data.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use support::{c_program_with_driver, number, ok, pooled};

const MODES: [&str; 3] = ["strict", "barrier", "relaxed"];

/// Runs `async_hostile SCENARIO` in each of `modes`, expandable segments on and off, with
/// `env` added; returns (mode, expandable, rounds that got the freed block back).
fn run(scenario: &str, modes: &[&str], env: &[(&str, &str)]) -> Vec<(String, String, u64)> {
    let exe = c_program_with_driver("async_hostile");
    let mut runs = Vec::new();
    for &mode in modes {
        for expandable in ["1", "0"] {
            let mut all = vec![
                ("GPUPOOL_REUSE", mode),
                ("GPUPOOL_EXPANDABLE", expandable),
                ("CUDASIM_MEM", "20MiB"),
                ("CUDASIM_CONTEXT_BYTES", "0"),
            ];
            all.extend_from_slice(env);
            let (out, _) = ok(&mut pooled(&exe, &[scenario], &all));
            assert!(out.contains("async_hostile ok"), "{scenario} {mode}: {out}");
            runs.push((mode.into(), expandable.into(), number(&out, "reused=")));
        }
    }
    runs
}

/// `run`, and every round reused the block (the hazard was there to catch).
fn every_round_reuses(scenario: &str, modes: &[&str], env: &[(&str, &str)]) {
    for (mode, expandable, reused) in run(scenario, modes, env) {
        assert_eq!(reused, 3, "{scenario} {mode} expandable={expandable}");
    }
}

/// `every_round_reuses` for each of `scenarios`, which destroy a stream and make others until
/// one gets the destroyed one's handle; and a run that shows a handle really was reused.
fn reused_on_a_reborn_handle(scenarios: &[&str], env: &[(&str, &str)]) {
    let exe = c_program_with_driver("async_hostile");
    for &scenario in scenarios {
        every_round_reuses(scenario, &MODES, env);
        let (out, _) = ok(&mut pooled(&exe, &[scenario], env));
        assert!(
            number::<u64>(&out, "reborn=") > 0,
            "{scenario}: no handle was reused: {out}"
        );
    }
}

/// A free on a stream that waits for an event after the kernel: CUDA orders that stream's next
/// work after the kernel, so the block serves its next request at once, and intact.
#[test]
fn a_free_on_a_stream_that_waited_for_the_kernels_event_is_reused_there_intact() {
    every_round_reuses("event_chain", &MODES, &[]);
    every_round_reuses("event_chain_nb", &MODES, &[]);
}

/// A block split by its own stream's smaller request: the rest is not another stream's before
/// the kernel is done.
#[test]
fn the_rest_of_a_block_its_stream_split_is_not_another_streams_under_the_kernel() {
    for scenario in ["split_rest", "split_rest_nb"] {
        for (mode, expandable, reused) in run(scenario, &MODES, &[]) {
            // Classic segments have room for nothing else: the rest serves every round.
            if expandable == "0" {
                assert_eq!(reused, 3, "{scenario} {mode}");
            }
        }
    }
}

/// A `cudaMallocAsync` block freed with `cudaFree`, and a `cudaMalloc` block freed with
/// `cudaFreeAsync`, under kernels on a non-blocking stream; the next owners on other streams.
/// `relaxed` trusts a plain free to one stream's order, so the first is not asked of it.
#[test]
fn either_free_of_either_allocation_waits_for_the_kernel_before_another_stream() {
    every_round_reuses("sync_free_of_async", &["strict", "barrier"], &[]);
    every_round_reuses("async_free_of_sync", &MODES, &[]);
    every_round_reuses("nonblocking_to_legacy", &MODES, &[]);
}

/// A blocking stream destroyed with a free pending: its block waits for the kernel all the
/// same, and a request on the destroyed stream gets CUDA's 400, also as the last error.
#[test]
fn a_destroyed_blocking_streams_pending_free_waits_and_the_stream_is_refused() {
    every_round_reuses("destroyed_blocking", &MODES, &[]);
}

/// A stream destroyed and another made at its handle: a block the old stream allocated and the
/// new one freed under a kernel waits for the kernel before a third stream gets it. A free
/// takes the id the thread's last allocation got for the same handle; the old stream's id
/// then names a stream no request names again. Through the runtime's calls and the driver's.
#[test]
fn a_free_on_a_stream_made_at_a_destroyed_ones_handle_waits_for_its_kernel() {
    reused_on_a_reborn_handle(&["reborn_handle", "cu_reborn_handle"], &[]);
}

/// A stream made at a destroyed one's handle, after the thread's frees named the destroyed
/// one there: its own request, on that thread or another, takes the block its free gave back
/// while its kernel still runs, as on any stream, rather than wait for a fence (the host
/// waiting for the kernel). Through the runtime's calls and the driver's.
#[test]
fn a_stream_made_at_a_destroyed_ones_handle_gets_its_own_freed_block_without_a_wait() {
    // The thread allocates there too; or only frees, while other threads allocate.
    reused_on_a_reborn_handle(
        &[
            "reborn_own_reuse",
            "reborn_free_only",
            "cu_reborn_own_reuse",
            "cu_reborn_free_only",
        ],
        &[],
    );
}

/// The driver's stream-ordered calls: `_ptsz` forms on two threads' per-thread streams, and a
/// non-blocking stream's free asked for on other streams and by `cuMemAlloc`; on one device
/// and on two.
#[test]
fn the_drivers_stream_ordered_calls_wait_for_the_kernel_before_another_stream() {
    for devices in ["1", "2"] {
        let env = [("CUDASIM_DEVICES", devices)];
        every_round_reuses("cu_ptsz", &MODES, &env);
        every_round_reuses("cu_other_stream", &MODES, &env);
    }
}

/// Two devices: a block of device 1 freed on its stream while device 0 is current, then asked
/// for on device 1; and threads that churn blocks on both devices and free them with either
/// current.
#[test]
fn two_devices_keep_every_tag_whichever_device_is_current_at_the_free() {
    let two = [("CUDASIM_DEVICES", "2")];
    every_round_reuses("two_devices", &MODES, &two);
    let churn = [("CUDASIM_DEVICES", "2"), ("CUDASIM_MEM", "700MiB")];
    run("churn_two_devices", &["strict", "barrier"], &churn);
    run("churn_two_devices_relaxed", &["relaxed"], &churn);
}

/// A stream of device 1 made at the handle of a destroyed stream of device 0, which this
/// thread's last allocation named: the free there, device 1 current, takes the destroyed
/// stream's id, and its block still waits for the kernel before device 1's next stream gets
/// it. Through the driver's calls, the runtime's, and each API's frees of the other's blocks.
#[test]
fn a_stale_id_of_another_devices_stream_still_waits_for_the_kernel() {
    reused_on_a_reborn_handle(
        &[
            "reborn_other_device",
            "cu_reborn_other_device",
            "mixed_reborn_other_device",
            "mixed_cu_reborn_other_device",
        ],
        &[("CUDASIM_DEVICES", "2")],
    );
}

/// `reborn_handle` and `reborn_own_reuse` with one API's allocations and the other's frees.
#[test]
fn either_apis_free_of_the_others_block_on_a_reborn_handle_waits_for_the_kernel() {
    for scenario in [
        "mixed_reborn_handle",
        "mixed_cu_reborn_handle",
        "mixed_reborn_own_reuse",
        "mixed_cu_reborn_own_reuse",
    ] {
        every_round_reuses(scenario, &MODES, &[]);
    }
}
