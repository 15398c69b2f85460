//! Another preloaded library that interposes `dlsym` and `dlclose` (a tracer, a profiler) keeps
//! its place in front of glibc's, in either order with the pool: a program that uses no CUDA
//! sees its lookups, `dlerror()` and `dlclose` exactly as with that library alone
//! (`tests/c/other_preload.c`, `tests/c/other_preload_shim.c`).

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;

use sim::{Build, Sim};
use support::{ok, unpooled};

fn shim() -> PathBuf {
    Sim::get().build(
        &support::root().join("tests/c/other_preload_shim.c"),
        &Build {
            compiler: "cc",
            flags: &["-std=c11", "-shared", "-fPIC"],
            libs: &["-ldl"],
            cudart: false,
        },
    )
}

fn program() -> PathBuf {
    Sim::get().build(
        &support::root().join("tests/c/other_preload.c"),
        &Build {
            compiler: "cc",
            flags: &["-std=c11"],
            libs: &["-ldl"],
            cudart: false,
        },
    )
}

/// The program's output with `LD_PRELOAD=preload`.
fn run_with(preload: &str) -> String {
    let mut cmd = unpooled(&program(), &[], &[]);
    cmd.env("LD_PRELOAD", preload);
    let (out, err) = ok(&mut cmd);
    assert!(err.is_empty(), "LD_PRELOAD={preload} printed: {err}");
    out
}

#[test]
fn another_preloaded_dlsym_and_dlclose_see_the_programs_calls_in_either_order() {
    let shim = shim().display().to_string();
    let pool = support::library().display().to_string();
    let alone = run_with(&shim);
    assert!(
        alone.contains("the other library saw: 7 dlsym, the dlclose"),
        "{alone}"
    );
    for preload in [format!("{pool}:{shim}"), format!("{shim}:{pool}")] {
        assert_eq!(run_with(&preload), alone, "LD_PRELOAD={preload}");
    }
}
