//! A program's unread `dlerror()` survives its calls to the driver under the pool
//! (`tests/c/driver_dlerror.c`): a failed `dlsym`, then the first call of a hooked entry point
//! (or the process's first pooled `cuMemAlloc_v2`), then `dlerror()` reads the same message as
//! without the pool, whichever way the program found the driver's functions.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use sim::Sim;
use support::{ok, pooled, unpooled};

fn program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| Sim::get().compile_driver(&support::root().join("tests/c/driver_dlerror.c")))
        .clone()
}

const ENV: &[(&str, &str)] = &[("CUDASIM_MEM", "1GiB"), ("CUDASIM_CONTEXT_BYTES", "0")];

const ENTRIES: &[&str] = &[
    "pop",
    "push",
    "set",
    "set-null",
    "alloc",
    "get-info",
    "sync",
    "stream-create",
];

/// The program's output for `route` and `entry`, with and without the pool.
fn both(route: &str, entry: &str) -> (String, String) {
    let exe = program();
    let args = [route, entry];
    let (with, stderr) = ok(&mut pooled(&exe, &args, ENV));
    let (without, _) = ok(&mut unpooled(&exe, &args, ENV));
    let done = format!("driver_dlerror {route} {entry}: done");
    assert!(with.contains(&done), "{with}\n{stderr}");
    assert!(without.contains(&done), "{without}");
    (with, without)
}

/// Every entry by `route`: the message is still there, word for word as without the pool, and
/// the call answered the same.
fn unread_error_survives(route: &str) {
    let mut lost = Vec::new();
    for entry in ENTRIES {
        let (with, without) = both(route, entry);
        assert!(without.contains("dlerror_kept=1"), "{entry}: {without}");
        if with != without {
            lost.push(format!(
                "{entry}:\n  with the pool:\n{with}  without:\n{without}"
            ));
        }
    }
    assert!(lost.is_empty(), "{route}: {}", lost.join("\n"));
}

#[test]
fn an_unread_dlerror_survives_the_first_calls_linked_with_lcuda() {
    unread_error_survives("lcuda");
}

#[test]
fn an_unread_dlerror_survives_the_first_calls_through_cu_get_proc_address() {
    unread_error_survives("proc");
}

#[test]
fn an_unread_dlerror_survives_the_first_calls_through_dlsym() {
    unread_error_survives("dlsym");
}

/// `tests/c/driver_lookup_thread.c`, linked with `-lcuda`.
fn lookup_program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        Sim::get().compile_driver(&support::root().join("tests/c/driver_lookup_thread.c"))
    })
    .clone()
}

/// `tests/c/driver_lookup_ctor.c` as a shared library, with no runtime: its constructor's
/// driver calls bind to the program's `-lcuda` (and the pool's hooks ahead of it).
fn ctor_library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        Sim::get().build(
            &support::root().join("tests/c/driver_lookup_ctor.c"),
            &sim::Build {
                compiler: "cc",
                flags: &["-std=c11", "-shared", "-fPIC"],
                libs: &[],
                cudart: false,
            },
        )
    })
    .clone()
}

/// A number the program printed as `key=N`.
fn printed(out: &str, key: &str) -> f64 {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
}

/// The program's output under the pool with `env` added.
fn lookup_run(args: &[&str], env: &[(&str, &str)]) -> String {
    let env: Vec<_> = ENV.iter().chain(env).copied().collect();
    let (out, stderr) = ok(&mut pooled(&lookup_program(), args, &env));
    assert!(out.contains(": done"), "{out}\n{stderr}");
    out
}

#[test]
fn first_driver_calls_in_a_constructor_in_dlopen_wait_for_the_lookup_thread_once() {
    let lib = ctor_library();
    let out = lookup_run(&["ctor", lib.to_str().unwrap()], &[]);
    // One lookup thread, which needs the linker's lock the constructor holds, so its caller
    // waits for it once (200 ms); not one per lookup (the driver, then the functions behind
    // the hooks), each waited for in turn. Threads are counted, not milliseconds: the wait's
    // length is the machine's.
    let threads = printed(&out, "threads_created");
    assert_eq!(
        threads, 1.0,
        "lookup threads started in the constructor:\n{out}"
    );
}

#[test]
fn with_the_driver_hooks_off_the_first_driver_calls_start_no_thread_and_do_not_wait() {
    let lib = ctor_library();
    let mut wrong = Vec::new();
    for off in [("GPUPOOL_DISABLE", "1"), ("GPUPOOL_DRIVER_HOOKS", "0")] {
        let calls = lookup_run(&["calls"], &[off]);
        if printed(&calls, "threads_created") != 0.0 {
            wrong.push(format!("{off:?}, calls:\n{calls}"));
        }
        let ctor = lookup_run(&["ctor", lib.to_str().unwrap()], &[off]);
        // No thread, so nothing to wait for.
        if printed(&ctor, "threads_created") != 0.0 {
            wrong.push(format!("{off:?}, in a constructor:\n{ctor}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
