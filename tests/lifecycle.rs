//! Process lifecycle under the preloaded pool: `fork` while other threads allocate (the child
//! exits, `_exit`s, execs, or uses CUDA and gets the runtime's answers; neither process
//! deadlocks), `exit`/`_exit` while threads are inside the pool, CUDA from a static constructor
//! before `main`, `dlopen`/`dlclose` of a library that uses CUDA, and `fork` while another thread's
//! first CUDA call is still making the pool, `pthread_cancel` of threads that allocate, and
//! `dlopen` of a library whose constructor uses CUDA while new threads allocate. Every run has a
//! deadline.
//! (Signals during an allocation storm: `tests/report/live_dump.rs`, `sigusr1_during_an_allocation_storm_*`.)

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use support::{c_library, output_within, pooled, root, scratch, texts};

/// `tests/c/lifecycle.c`, linked with `-rdynamic`: its `getenv` must take the pool's own
/// calls.
fn lifecycle() -> PathBuf {
    sim::Sim::get().compile(&root().join("tests/c/lifecycle.c"), &["-rdynamic"])
}

fn run_ok(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let out = output_within(&mut pooled(&lifecycle(), args, env), 60);
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

#[test]
fn fork_while_the_first_cuda_call_is_making_the_pool() {
    // The pool reads its settings while it is being made; the program's `getenv` holds the
    // lookup of GPUPOOL_TRACE for a second, and the main thread forks meanwhile.
    let dir = scratch("fork-init");
    let trace = dir.join("lifecycle.trace");
    let trace = trace.to_str().expect("utf-8 path");
    for round in 0..3 {
        let (out, err) = run_ok(
            &["fork-init"],
            &[("GPUPOOL_TRACE", trace), ("GPUPOOL_SUMMARY", "stderr")],
        );
        assert!(out.contains("fork-init ok"), "round {round}: {out}");
        // The parent reports its one allocation; the child, whose calls went to the runtime,
        // reports nothing and warns of nothing.
        assert_eq!(err.matches("gpupool summary").count(), 1, "{err}");
        assert!(err.contains(" 1 mallocs, 1 frees"), "round {round}: {err}");
        assert!(
            err.lines()
                .all(|l| !l.starts_with("gpupool:") || l.contains("summary")),
            "round {round}: unexpected warnings:\n{err}"
        );
        let written = std::fs::metadata(trace).expect("the parent's trace").len();
        assert!(written > 0, "round {round}: empty trace");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn threads_cancelled_while_they_allocate_end_as_without_the_pool() {
    // Four threads allocate and free each other's blocks, cancelled after 2 ms, 400 times. A
    // thread must not act on its cancel inside the pool: waiting for another thread's cache
    // lock, making the pool or a device's pool on its first allocation, writing the trace.
    // An unwind through the pool aborts the process (and would leave its locks taken).
    let dir = scratch("cancel");
    let trace = dir.join("cancel.trace");
    let with_trace = [
        ("GPUPOOL_SUMMARY", "stderr"),
        ("GPUPOOL_TRACE", trace.to_str().expect("utf-8 path")),
    ];
    for env in [&with_trace[..1], &with_trace[..]] {
        let (out, err) = run_ok(&["cancel", "400"], env);
        assert!(out.contains("cancel ok: 400 rounds"), "{env:?}: {out}");
        assert_eq!(err.matches("gpupool summary").count(), 1, "{env:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dlopen_of_a_library_that_uses_cuda_while_new_threads_allocate() {
    // Each round, two new threads make their first CUDA calls, which grow the pool under its
    // device lock, while the main thread, inside `dlopen` and `dlclose`, holds the dynamic
    // linker's lock and allocates and frees from the library's constructor and destructor. A
    // thread's first call into the runtime may need the linker's lock (a thread-local's
    // destructor registered): under the device lock it would deadlock with the main thread.
    let program = sim::Sim::get().compile(&root().join("tests/c/loader_lock.c"), &["-ldl"]);
    let lib = c_library("cuda_ctor");
    let lib = lib.to_str().expect("utf-8 path");
    for reuse in ["strict", "relaxed"] {
        let env = [("GPUPOOL_REUSE", reuse), ("GPUPOOL_SUMMARY", "stderr")];
        let out = output_within(&mut pooled(&program, &[lib, "150"], &env), 10);
        let (stdout, stderr) = texts(&out);
        assert!(
            out.status.success() && stdout.contains("loader lock ok: 150 rounds"),
            "{reuse} ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            out.status
        );
        assert!(stderr.contains("gpupool summary"), "{reuse}: {stderr}");
    }
}

#[test]
fn the_first_cuda_call_while_another_thread_is_inside_dlopen_of_a_cuda_library() {
    // Each round is a fresh process whose first CUDA call, on a new thread, makes the pool and
    // looks for the runtime (`dlsym`, `dladdr`, `dlopen`: each takes the dynamic linker's lock)
    // while the main thread, inside `dlopen`, holds that lock and allocates from the library's
    // constructor: the constructor's call must not wait for a search that waits for the lock.
    let program =
        sim::Sim::get().compile(&root().join("tests/c/first_call_in_dlopen.c"), &["-ldl"]);
    let lib = c_library("cuda_ctor");
    let lib = lib.to_str().expect("utf-8 path");
    // 400 rounds: a thread that found the state published before the pool's own calls had
    // the runtime got cudaErrorUnknown in about 1 of 15 000 rounds on a loaded machine.
    let out = output_within(&mut pooled(&program, &[lib, "400"], &[]), 240);
    let (stdout, stderr) = texts(&out);
    assert!(
        out.status.success() && stdout.contains("400 rounds, 0 hung, 0 failed"),
        "({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
}

/// A program's `atexit` handler, registered after its first CUDA call, frees its blocks,
/// allocates once more and empties the cache, after glibc ran the thread-locals' destructors
/// (the pool's thread caches among them). Every call succeeds, the driver gets every byte back,
/// and the summary counts each allocation and free once.
#[test]
fn an_atexit_handler_frees_its_blocks_and_empties_the_cache() {
    let sim = sim::Sim::get();
    let include = format!("-I{}", root().join("include").display());
    let libs = support::gpupool_libs();
    let libs: Vec<&str> = libs.iter().map(String::as_str).collect();
    let program = sim.build(
        &root().join("tests/c/at_exit.c"),
        &sim::Build {
            compiler: "cc",
            flags: &["-std=c11", &include, "-pthread"],
            libs: &libs,
            cudart: true,
        },
    );
    for expandable in ["0", "1"] {
        let dir = scratch(&format!("at-exit-{expandable}"));
        let summary = dir.join("summary.json");
        let env = [
            ("GPUPOOL_EXPANDABLE", expandable),
            ("GPUPOOL_SUMMARY", summary.to_str().expect("utf-8 path")),
        ];
        let out = output_within(support::clean_command(&program).envs(env), 60);
        let (stdout, stderr) = texts(&out);
        assert!(
            out.status.success() && stdout.contains("driver keeps 0 live bytes, 0 VMM bytes"),
            "expandable {expandable} ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            out.status
        );
        let released: u64 = stdout
            .split("released ")
            .nth(1)
            .and_then(|r| r.split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no release figure in {stdout}"));
        let text = std::fs::read_to_string(&summary).expect("a summary");
        let v: serde_json::Value = serde_json::from_str(&text).expect("a JSON summary");
        let d = &v["devices"][0];
        // 8 on the other thread, 16 in main, 1 in the handler.
        assert_eq!(d["allocations"], 25, "{text}");
        assert_eq!(d["frees"], 25, "{text}");
        assert_eq!(d["still_allocated"]["blocks"], 0, "{text}");
        assert_eq!(d["reserved_bytes"]["current"], 0, "{text}");
        assert_eq!(d["released"]["empty_cache_bytes"], released, "{text}");
        assert!(released > 0, "{text}");
    }
}
