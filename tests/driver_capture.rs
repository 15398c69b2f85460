//! Graph captures begun through the driver API, as XLA (JAX), TensorFlow and the static runtime
//! begin them (`tests/c/driver_capture_fence.c`), and captures that the driver begins and the
//! runtime ends, or the reverse (`tests/c/capture_both_layers.c`). CUDA refuses a device
//! synchronization during a capture, and a use of the legacy stream while a blocking stream is
//! captured, and invalidates the capture: the pool must take neither while one is underway, and
//! take them again once it ended.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use sim::Sim;
use support::{number, ok, pooled, unpooled};

fn driver_only() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        Sim::get().compile_driver(&support::root().join("tests/c/driver_capture_fence.c"))
    })
    .clone()
}

/// The program's request in MiB, whether its stream is blocking and whether it captures into its
/// own graph, with the simulator's settings.
type Case = ([&'static str; 3], &'static [(&'static str, &'static str)]);

/// 100 MiB on a 128 MiB device, non-blocking stream: the 64 MiB of waiting blocks would serve
/// it after a fence. 1 MiB on a blocking stream: a barrier would. Each also into the program's
/// own graph (`cuStreamBeginCaptureToGraph`, CUDA 12.3).
const CASES: [Case; 4] = [
    (["100", "0", "0"], SMALL),
    (["1", "1", "0"], ZERO_CONTEXT),
    (["100", "0", "1"], SMALL),
    (["1", "1", "1"], ZERO_CONTEXT),
];
const SMALL: &[(&str, &str)] = &[("CUDASIM_MEM", "128MiB"), ("CUDASIM_CONTEXT_BYTES", "0")];

/// Each reuse mode, with classic and with expandable segments.
fn settings() -> impl Iterator<Item = (&'static str, &'static str)> {
    ["strict", "barrier", "relaxed"]
        .into_iter()
        .flat_map(|reuse| [(reuse, "0"), (reuse, "1")])
}

/// What the request of `mib` MiB during the capture gets. The 100 MiB one fits only once the
/// 64 MiB of waiting blocks go back. A classic segment's `cudaFree` waits for their work, so it
/// may run during a capture; an unmap waits for nothing and needs the fence the capture
/// refuses, so with expandable segments their granules stay mapped until the capture ends, and
/// the request is out of memory (docs/guarantees.md, "Stream capture").
fn malloc_during_capture(mib: &str, expandable: &str) -> &'static str {
    if mib == "100" && expandable == "1" {
        "malloc=2\n"
    } else {
        "malloc=0\n"
    }
}
const ZERO_CONTEXT: &[(&str, &str)] = &[("CUDASIM_CONTEXT_BYTES", "0")];

#[test]
fn a_driver_capture_cuda_lets_run_survives_the_pools_fences_and_barriers() {
    for mode in ["lcuda", "static", "static-ptsz"] {
        for (case, env) in CASES {
            let args = [mode, case[0], case[1], case[2]];
            let (without, _) = ok(&mut unpooled(&driver_only(), &args, env));
            for expected in ["malloc=0\n", "status=1\n", "end=0\n", "graph=1\n"] {
                assert!(without.contains(expected), "{args:?}: {without}");
            }
            for (reuse, expandable) in settings() {
                let mut all = env.to_vec();
                all.extend([("GPUPOOL_REUSE", reuse), ("GPUPOOL_EXPANDABLE", expandable)]);
                let (with, stderr) = ok(&mut pooled(&driver_only(), &args, &all));
                let malloc = malloc_during_capture(case[0], expandable);
                for expected in [malloc, "status=1\n", "end=0\n", "graph=1\n"] {
                    assert!(
                        with.contains(expected),
                        "{reuse} {expandable} {args:?}: {with}\n{stderr}"
                    );
                }
                // After the end the pool fences again: the whole cache goes back to the driver.
                assert!(
                    number::<u64>(&with, "released=") > 0,
                    "{reuse} {expandable} {args:?}: {with}"
                );
                assert_eq!(
                    number::<u64>(&with, "live_after="),
                    0,
                    "{reuse} {expandable} {args:?}: {with}"
                );
            }
        }
    }
}

#[test]
fn a_capture_seen_by_both_layers_is_noted_once_and_forgotten_at_its_end() {
    let exe = support::c_program_with_driver("capture_both_layers");
    let env = [("CUDASIM_MEM", "128MiB"), ("CUDASIM_CONTEXT_BYTES", "0")];
    let (without, _) = ok(&mut unpooled(&exe, &[], &env));
    assert!(without.contains("malloc=0\n"), "{without}");
    for expandable in ["0", "1"] {
        let mut strict = env.to_vec();
        strict.extend([
            ("GPUPOOL_REUSE", "strict"),
            ("GPUPOOL_EXPANDABLE", expandable),
        ]);
        let (with, stderr) = ok(&mut pooled(&exe, &[], &strict));
        // The first capture's request is of 100 MiB.
        assert!(
            with.contains(malloc_during_capture("100", expandable)),
            "{with}\n{stderr}"
        );
        // Its out-of-memory report says why and what helps; a reuse mode would not.
        if expandable == "1" {
            for part in [
                "could not wait for the device's in-flight work (a graph capture was underway)",
                "64.0 MiB of freed blocks await in-flight work, which the pool cannot wait for \
                 during a graph capture: allocate before the capture begins, or run with \
                 GPUPOOL_EXPANDABLE=0",
            ] {
                assert!(stderr.contains(part), "{part}\n{stderr}");
            }
            assert!(!stderr.contains("GPUPOOL_REUSE=barrier"), "{stderr}");
        }
        for out in [&with, &without] {
            for expected in ["first_end=0\n", "second_end=0\n", "graphs=2\n"] {
                assert!(out.contains(expected), "{out}\n{stderr}");
            }
        }
        // Both captures ended, each through the other layer: the pool's fence runs again, and
        // the whole cache goes back to the driver.
        assert!(number::<u64>(&with, "released=") > 0, "{with}");
        assert_eq!(number::<u64>(&with, "live_after="), 0, "{with}");
    }
}

#[test]
fn captures_of_every_form_on_many_threads_survive_the_pools_fences_and_barriers() {
    // Twelve threads begin and end captures (the runtime's and the driver's forms, `_ptsz`, each
    // mode, into new graphs and the program's own) on two devices, while four threads allocate
    // and free in relaxed mode on small devices, so the pool fences and issues barriers between
    // the captures: no begin or end fails, as none does without the pool, and nothing hangs
    // (the capture gate). The simulator's held synchronization widens the pool's window from
    // its look at the captures to its synchronization.
    let exe = support::c_program_with_driver("capture_storm");
    let args = ["12", "4", "300", "200"];
    let env = [
        ("CUDASIM_DEVICES", "2"),
        ("CUDASIM_MEM", "64MiB"),
        ("CUDASIM_CONTEXT_BYTES", "0"),
    ];
    let (without, _) = ok(&mut unpooled(&exe, &args, &env));
    for expected in ["begin_fail=0\n", "end_fail=0\n", "malloc_fail=0\n"] {
        assert!(without.contains(expected), "{without}");
    }
    for mode in ["strict", "barrier"] {
        for delay in ["0", "2"] {
            let mut all = env.to_vec();
            all.extend([("GPUPOOL_REUSE", mode), ("CUDASIM_SYNC_DELAY_MS", delay)]);
            let out = support::output_within(&mut pooled(&exe, &args, &all), 20);
            let (with, stderr) = support::texts(&out);
            assert!(
                out.status.success()
                    && with.contains("begin_fail=0\n")
                    && with.contains("end_fail=0\n"),
                "{mode}, {delay} ms ({}):\n--- stdout\n{with}\n--- stderr\n{stderr}",
                out.status
            );
        }
    }
}
