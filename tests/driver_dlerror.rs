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
