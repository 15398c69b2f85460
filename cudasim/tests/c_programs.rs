//! Builds the C test programs of `cudasim/tests/` against the simulator and runs them.

mod common;

use common::{Build, Sim};
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

/// A program linked with `-lcuda` alone: it records `libcuda.so.1`, not the runtime.
#[test]
fn driver_linked_alone() {
    let sim = Sim::get();
    let exe = sim.compile_driver(&source("sim_driver.c"));
    let env = [
        ("CUDASIM_MEM", "1GiB"),
        ("CUDASIM_CONTEXT_BYTES", "0"),
        ("CUDASIM_FAIL", "cuMemAlloc_v2@10=CUDA_ERROR_OUT_OF_MEMORY"),
    ];
    let out = sim.run_ok(&exe, &[], &env);
    print!("{out}");
    assert!(out.contains("sim_driver: all checks passed"));
    if let Ok(out) = Command::new("readelf").arg("-d").arg(&exe).output() {
        let dynamic = String::from_utf8_lossy(&out.stdout);
        assert!(dynamic.contains("[libcuda.so.1]"), "{dynamic}");
        assert!(!dynamic.contains("libcudart"), "{dynamic}");
    }
}

/// As the static runtime reaches a driver: `dlopen`, `cuGetProcAddress_v2`, the `dlsym` fallback.
#[test]
fn driver_through_get_proc_address() {
    let sim = Sim::get();
    let simlib = sim.simlib.display().to_string();
    let rpath = format!("-Wl,-rpath,{simlib}");
    let build = Build {
        compiler: "cc",
        flags: &["-std=c11"],
        libs: &[&rpath, "-ldl"],
        cudart: false,
    };
    let exe = sim.build(&source("sim_driver_dlopen.c"), &build);
    let out = sim.run_ok(&exe, &[], &[("CUDASIM_CONTEXT_BYTES", "0")]);
    print!("{out}");
    assert!(out.contains("sim_driver_dlopen: all checks passed"));
}

/// A runtime program's calls reach the driver, and without it (`CUDASIM_NO_DRIVER=1`) still
/// work; runtime and driver calls mix on one state.
#[test]
fn runtime_on_the_driver() {
    let sim = Sim::get();
    let simlib = sim.simlib.display().to_string();
    let build = Build {
        compiler: "cc",
        flags: &["-std=c11"],
        libs: &["-L", &simlib, "-lcuda"],
        cudart: true,
    };
    let exe = sim.build(&source("sim_driver_runtime.c"), &build);
    let out = sim.run_ok(&exe, &["driver"], &[]);
    print!("{out}");
    assert!(out.contains("sim_driver_runtime driver: all checks passed"));
    let out = sim.run_ok(&exe, &["nodriver"], &[("CUDASIM_NO_DRIVER", "1")]);
    print!("{out}");
    assert!(out.contains("sim_driver_runtime nodriver: all checks passed"));
}

/// Virtual memory management on the driver face: reserve, create, map, access, unmap, release,
/// with the runtime's copies, sets and kernels on the mapped memory.
#[test]
fn virtual_memory() {
    let sim = Sim::get();
    let simlib = sim.simlib.display().to_string();
    let build = Build {
        compiler: "cc",
        flags: &["-std=c11"],
        libs: &["-L", &simlib, "-lcuda"],
        cudart: true,
    };
    let exe = sim.build(&source("sim_vmm.c"), &build);
    let env = [("CUDASIM_MEM", "1GiB"), ("CUDASIM_CONTEXT_BYTES", "0")];
    let out = sim.run_ok(&exe, &[], &env);
    print!("{out}");
    assert!(out.contains("check: unmap under a running kernel proceeds and is counted"));
    assert!(out.contains("check: GPUDirect RDMA with VMM is supported and counted"));
    assert!(out.contains("sim_vmm: all checks passed"));
    let without: Vec<_> = env.into_iter().chain([("CUDASIM_VMM_RDMA", "0")]).collect();
    let out = sim.run_ok(&exe, &["rdma-off"], &without);
    print!("{out}");
    assert!(out.contains("check: GPUDirect RDMA with VMM is refused where unsupported"));
    assert!(out.contains("sim_vmm: all checks passed"));
}

/// Peer access between two devices, through the runtime and the driver, and mapped memory
/// reachable from a peer only where `cuMemSetAccess` gave it access.
#[test]
fn peer_access() {
    let sim = Sim::get();
    let simlib = sim.simlib.display().to_string();
    let build = Build {
        compiler: "cc",
        flags: &["-std=c11"],
        libs: &["-L", &simlib, "-lcuda"],
        cudart: true,
    };
    let exe = sim.build(&source("sim_peer.c"), &build);
    let env = [
        ("CUDASIM_DEVICES", "2"),
        ("CUDASIM_MEM", "1GiB"),
        ("CUDASIM_CONTEXT_BYTES", "0"),
    ];
    for no_driver in ["0", "1"] {
        let mut env = env.to_vec();
        env.push(("CUDASIM_NO_DRIVER", no_driver));
        let out = sim.run_ok(&exe, &[], &env);
        print!("{out}");
        assert!(out.contains("sim_peer: all checks passed"), "{no_driver}");
    }
}

#[test]
fn fork_while_the_driver_is_being_linked() {
    let out = run_c("sim_fork.c", &[], &[("CUDASIM_LINK_DELAY_MS", "500")]);
    assert!(out.contains("sim_fork: all checks passed"));
}

#[test]
fn calls_at_exit_follow_the_runtimes_teardown_order() {
    let out = run_c("sim_exit.c", &[], &[("CUDASIM_MEM", "1GiB")]);
    assert!(out.contains("sim_exit: main done"), "{out}");
    // Registered after the first call: served (main's block freed, the new one left live).
    // Registered before: refused, and nothing changes.
    assert!(
        out.contains("after: cudaMalloc 0, cudaFree 0, live 1048576"),
        "{out}"
    );
    assert!(
        out.contains("before: cudaMalloc 4, cudaFree 4, live 1048576"),
        "{out}"
    );
    let after = out.find("after:").expect("after ran");
    assert!(after < out.find("before:").expect("before ran"), "{out}");
}
