//! Process lifecycle under the preloaded pool: `fork` while other threads allocate (the child
//! exits, `_exit`s, execs, or uses CUDA and gets the runtime's answers; neither process
//! deadlocks), `exit`/`_exit` while threads are inside the pool, CUDA from a static constructor
//! before `main`, and `dlopen`/`dlclose` of a library that uses CUDA. Every run has a deadline.
//! (Signals during an allocation storm: `tests/report.rs`, `sigusr1_during_an_allocation_storm_*`.)

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use support::{c_library, c_program, output_within, pooled, texts};

fn run_ok(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let out = output_within(&mut pooled(&c_program("lifecycle"), args, env), 60);
    let (stdout, stderr) = texts(&out);
    assert!(
        out.status.success(),
        "lifecycle {args:?} {env:?} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

#[test]
fn fork_while_threads_allocate_never_deadlocks_either_process() {
    let env = [
        ("CUDASIM_DEVICES", "2"),
        ("GPUPOOL_SUMMARY", "stderr"),
        ("GPUPOOL_REUSE", "barrier"),
    ];
    for (how, rounds) in [
        ("cuda", "60"),
        ("exit", "40"),
        ("_exit", "40"),
        ("exec", "20"),
    ] {
        let (out, err) = run_ok(&["fork", how, rounds], &env);
        assert!(out.contains(&format!("fork {how} ok")), "{out}");
        // Only the parent reports; children (exec'd ones included: they never use CUDA) print
        // nothing.
        assert_eq!(
            err.matches("gpupool summary").count(),
            1,
            "{how}: expected one summary:\n{err}"
        );
        assert!(
            err.lines()
                .all(|l| !l.starts_with("gpupool:") || l.contains("summary")),
            "{how}: unexpected warnings:\n{err}"
        );
    }
}

#[test]
fn exit_and_underscore_exit_while_threads_are_inside_the_pool() {
    for mode in ["exit-storm", "_exit-storm"] {
        for i in 0..5 {
            let (out, err) = run_ok(
                &[mode],
                &[("CUDASIM_DEVICES", "2"), ("GPUPOOL_SUMMARY", "stderr")],
            );
            assert!(
                out.contains("exiting with threads inside the pool"),
                "{out}"
            );
            let summaries = err.matches("gpupool summary").count();
            let want = usize::from(mode == "exit-storm");
            assert_eq!(summaries, want, "{mode} run {i}: summaries\n{err}");
        }
    }
}

#[test]
fn cuda_from_a_static_constructor_before_main() {
    let (out, err) = run_ok(
        &["ctor"],
        &[("LIFECYCLE_CTOR", "1"), ("GPUPOOL_SUMMARY", "stderr")],
    );
    assert!(out.contains("ctor ok"), "{out}");
    assert!(err.contains(" 1 mallocs, 1 frees"), "{err}");
}

#[test]
fn dlopen_and_dlclose_of_a_library_that_uses_cuda() {
    let lib = c_library("framework");
    let (out, err) = run_ok(
        &["dlopen", lib.to_str().expect("utf-8 path"), "8"],
        &[("GPUPOOL_SUMMARY", "stderr")],
    );
    assert!(out.contains("dlopen ok"), "{out}");
    assert!(err.contains("gpupool summary"), "{err}");
}
