//! Fault injection through the simulator: the N-th call of each runtime function the pool uses
//! (`cudaMalloc` for segments, `cudaFree` to release them, `cudaDeviceSynchronize` as the fence,
//! `cudaEventCreateWithFlags`, `cudaEventRecord` and `cudaStreamWaitEvent` as the barrier, `cudaMemGetInfo` for
//! samples), and of those it only watches (`cudaStreamSynchronize`, `cudaEventSynchronize` as
//! release points, `cudaLaunchKernel` on the legacy stream as a barrier), fails with each error
//! the runtime can return. `tests/c/faults.c` checks, with and
//! without the pool, that a failing call the program makes gives exactly the runtime's answer
//! (return code and `cudaGetLastError`), that a failing call the pool makes on its own leaves no
//! error behind and hands out no block still used by a kernel, and that the pool's figures then
//! agree with the runtime's and later calls work.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;

use sim::Sim;
use support::{output_within, pooled, root, texts, unpooled};

const FUNCTIONS: &[&str] = &[
    "cudaMalloc",
    "cudaFree",
    "cudaDeviceSynchronize",
    "cudaEventCreateWithFlags",
    "cudaEventRecord",
    "cudaStreamWaitEvent",
    "cudaMemGetInfo",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaLaunchKernel",
];

/// Errors a runtime call can return: invalid value, out of memory, initialization error,
/// insufficient driver, no device, invalid device, illegal address (sticky on a GPU), unknown.
const ERRORS: &[i32] = &[1, 2, 3, 35, 100, 101, 700, 999];

fn program() -> PathBuf {
    let include = root().join("include");
    let flag = format!("-I{}", include.display());
    Sim::get().compile(&root().join("tests/c/faults.c"), &[&flag])
}

/// The settings under which the pool makes the call in question on its own. Classic segments
/// for `cudaMalloc` and `cudaFree`: the pool makes them for classic segments only (expandable
/// segments map through the driver, whose refusals `tests/expandable_segments.rs` injects).
/// The others run with the default, expandable segments.
fn env_for(function: &str) -> Vec<(&'static str, &'static str)> {
    let mut env = settings_for(function);
    if matches!(function, "cudaMalloc" | "cudaFree") {
        env.push(("GPUPOOL_EXPANDABLE", "0"));
    }
    env
}

fn settings_for(function: &str) -> Vec<(&'static str, &'static str)> {
    match function {
        "cudaFree" | "cudaStreamSynchronize" | "cudaEventSynchronize" => {
            vec![("GPUPOOL_RELEASE_THRESHOLD", "0")]
        }
        "cudaDeviceSynchronize" => {
            vec![("GPUPOOL_REUSE", "strict"), ("GPUPOOL_FENCE_BYTES", "8MiB")]
        }
        "cudaEventCreateWithFlags"
        | "cudaEventRecord"
        | "cudaStreamWaitEvent"
        | "cudaLaunchKernel" => {
            vec![("GPUPOOL_REUSE", "barrier")]
        }
        _ => vec![],
    }
}

#[test]
fn every_runtime_failure_gives_the_runtimes_answer_and_leaves_the_pool_consistent() {
    let exe = program();
    let cases: Vec<(&str, i32, bool)> = FUNCTIONS
        .iter()
        .flat_map(|&f| {
            ERRORS
                .iter()
                .flat_map(move |&e| [(f, e, true), (f, e, false)])
        })
        .collect();
    // Eight at a time: each run waits for a few simulated kernels.
    let failures: Vec<String> = std::thread::scope(|s| {
        cases
            .chunks(cases.len().div_ceil(8))
            .map(|chunk| {
                let exe = &exe;
                s.spawn(move || {
                    let mut bad = Vec::new();
                    for &(function, error, with_pool) in chunk {
                        let err = error.to_string();
                        let args = [function, err.as_str()];
                        let env = env_for(function);
                        let mut cmd = if with_pool {
                            pooled(exe, &args, &env)
                        } else {
                            unpooled(exe, &args, &env)
                        };
                        let out = output_within(&mut cmd, 60);
                        let (stdout, stderr) = texts(&out);
                        if !out.status.success() {
                            bad.push(format!(
                                "faults {function} {error} ({}): {}\n{stdout}{stderr}",
                                if with_pool { "pooled" } else { "runtime" },
                                out.status
                            ));
                        }
                    }
                    bad
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .flat_map(|h| h.join().expect("runner thread"))
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A segment request the pool makes on its own runs out of memory while the program has an
/// error it has not read (`cudaGetDevice(NULL)`, `cudaSetDevice(99)`). The pool gives its cache
/// back and serves the request through either API, or the driver refuses it: the program then
/// reads the error it left, as without the pool. So too with a context the program made
/// current, where the runtime's own answer is asked again once the cache went back.
#[test]
fn an_error_the_program_has_not_read_outlives_the_pools_recovery_from_out_of_memory() {
    let exe = support::c_program_with_driver("unread_error");
    let env = [("CUDASIM_MEM", "1GiB"), ("GPUPOOL_EXPANDABLE", "0")];
    let run = |cmd: &mut std::process::Command| {
        let out = output_within(cmd, 60);
        let (stdout, stderr) = texts(&out);
        assert!(out.status.success(), "{}\n{stdout}{stderr}", out.status);
        stdout
    };
    for args in [
        &["runtime", "1"][..],
        &["runtime", "101"],
        &["driver", "1"],
        &["driver", "101"],
        &["own-context", "1"],
        &["refused"],
    ] {
        let without = run(&mut unpooled(&exe, args, &env));
        let with = run(&mut pooled(&exe, args, &env));
        assert_eq!(with, without, "unread_error {args:?}");
        if args[0] != "refused" {
            assert!(without.contains("allocation=0"), "{without}");
            assert!(without.contains(&format!("last={}", args[1])), "{without}");
        }
    }
}

/// A call the pool makes on its own (a segment's release, a fence, a barrier, a memory sample)
/// fails while the program has an error it has not read (`cudaGetDevice(NULL)`): the program
/// then reads that error, as without the pool, where it would not have made the call.
#[test]
fn an_error_the_program_has_not_read_outlives_a_failed_call_of_the_pools_own() {
    let exe = program();
    // The calls the pool makes itself, but `cudaMalloc`, whose refusal is the program's answer;
    // the last three are only watched.
    let own: Vec<&str> = FUNCTIONS
        .iter()
        .copied()
        .filter(|&f| {
            !matches!(
                f,
                "cudaMalloc"
                    | "cudaStreamSynchronize"
                    | "cudaEventSynchronize"
                    | "cudaLaunchKernel"
            )
        })
        .collect();
    let failures: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = own
            .iter()
            .map(|&function| {
                let exe = &exe;
                s.spawn(move || {
                    let mut bad = Vec::new();
                    for error in ["3", "999"] {
                        let args = [function, error, "unread"];
                        let out = output_within(&mut pooled(exe, &args, &env_for(function)), 60);
                        let (stdout, stderr) = texts(&out);
                        if !out.status.success() {
                            bad.push(format!(
                                "faults {function} {error} unread: {}\n{stdout}{stderr}",
                                out.status
                            ));
                        }
                    }
                    bad
                })
            })
            .collect();
        runs.into_iter()
            .flat_map(|h| h.join().expect("runner thread"))
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
