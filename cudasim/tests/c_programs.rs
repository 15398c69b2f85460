//! Builds the C test programs of `cudasim/tests/` against the simulator and runs them.

mod common;

use common::Sim;
use std::path::{Path, PathBuf};
use std::process::Command;

fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name)
}

/// Compiles `name` and runs it with `args` and `env`; returns its stdout.
fn run_c(name: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let sim = Sim::get();
    let exe = sim.compile(&source(name), &[]);
    let out = sim.run_ok(&exe, args, env);
    print!("{out}");
    out
}

#[test]
fn basic() {
    let out = run_c(
        "sim_basic.c",
        &[],
        &[("CUDASIM_MEM", "1GiB"), ("CUDASIM_CONTEXT_BYTES", "100MiB")],
    );
    assert!(out.contains("sim_basic: all checks passed"));
}

#[test]
fn inflight() {
    let out = run_c("sim_inflight.c", &[], &[("CUDASIM_MEM", "1GiB")]);
    assert!(out.contains("check: cudaFree waits for in-flight kernels"));
    assert!(out.contains("sim_inflight: all checks passed"));
}

#[test]
fn multidev() {
    let out = run_c(
        "sim_multidev.c",
        &[],
        &[
            ("CUDASIM_DEVICES", "2"),
            ("CUDASIM_MEM", "1G"),
            ("CUDASIM_CONTEXT_BYTES", "0"),
        ],
    );
    assert!(out.contains("sim_multidev: all checks passed"));
}

#[test]
fn mempool_and_capture() {
    let out = run_c(
        "sim_mempool.c",
        &[],
        &[
            ("CUDASIM_DEVICES", "2"),
            ("CUDASIM_MEM", "1GiB"),
            ("CUDASIM_CONTEXT_BYTES", "0"),
        ],
    );
    assert!(out.contains("sim_mempool: all checks passed"));
}

#[test]
fn faults_by_env() {
    let spec = "cudaMalloc@2=2,cudaStreamCreate@1=999,cudaSetDevice@1=cudaErrorInvalidDevice";
    let out = run_c("sim_faults.c", &["env"], &[("CUDASIM_FAIL", spec)]);
    assert!(out.contains("sim_faults env: all checks passed"));
}

#[test]
fn faults_by_api() {
    let out = run_c("sim_faults.c", &["api"], &[]);
    assert!(out.contains("sim_faults api: all checks passed"));
}

#[test]
fn bad_configuration() {
    for (key, value) in [
        ("CUDASIM_MEM", "lots"),
        ("CUDASIM_DEVICES", "73"),
        ("CUDASIM_FAIL", "cudaMaloc@1=2"),
    ] {
        let sim = Sim::get();
        let exe = sim.compile(&source("sim_faults.c"), &[]);
        let out = sim.run(&exe, &["badconfig"], &[(key, value)]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{key}={value}:\n{stdout}\n{stderr}");
        assert!(stderr.contains(key), "{key}={value}: stderr {stderr:?}");
    }
}

/// The headers compile as strict C99 and as C++; programs link to `libcudart.so.12`.
#[test]
fn headers_and_soname() {
    let sim = Sim::get();
    let dir = sim.scratch();
    let src = dir.join("headers.c");
    std::fs::write(
        &src,
        "#include \"cudasim.h\"\nint main(void) { return cudaGetLastError(); }\n",
    )
    .unwrap();
    let c99 = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-c"])
        .arg("-I")
        .arg(&sim.include)
        .arg(&src)
        .arg("-o")
        .arg(dir.join("headers.o"))
        .output()
        .unwrap();
    assert!(
        c99.status.success(),
        "{}",
        String::from_utf8_lossy(&c99.stderr)
    );
    let cxx_src = dir.join("headers.cpp");
    std::fs::copy(&src, &cxx_src).unwrap();
    match Command::new("c++")
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-c"])
        .arg("-I")
        .arg(&sim.include)
        .arg(&cxx_src)
        .arg("-o")
        .arg(dir.join("headers_cxx.o"))
        .output()
    {
        Ok(cxx) => assert!(
            cxx.status.success(),
            "{}",
            String::from_utf8_lossy(&cxx.stderr)
        ),
        Err(e) => eprintln!("no C++ compiler ({e}); skipped"),
    }
    let exe = sim.compile(&src, &[]);
    sim.run_ok(&exe, &[], &[]);
    if let Ok(out) = Command::new("readelf").arg("-d").arg(&exe).output() {
        let dynamic = String::from_utf8_lossy(&out.stdout);
        assert!(dynamic.contains("[libcudart.so.12]"), "{dynamic}");
    }
}
