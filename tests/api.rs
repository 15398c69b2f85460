//! The `gpupool_*` C API: C and C++ programs built against `include/gpupool.h` with
//! `-Wall -Wextra -Werror`, linked with `-lgpupool` (ahead of the runtime, or without it), and
//! PyTorch's pluggable-allocator entry points called the way PyTorch calls them (ctypes).

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sim::{Build, Sim};
use support::{clean_command, gpupool_libs, library, number, ok, root, scratch, texts};

/// `tests/c/api.c`, linked with `-lgpupool` ahead of `-lcudart`.
fn api_program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| build_linked(&root().join("tests/c/api.c"), "cc", "-std=c11", true))
        .clone()
}

/// `tests/c/api_edges.c`, linked the same way.
fn edges_program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| build_linked(&root().join("tests/c/api_edges.c"), "cc", "-std=c11", true))
        .clone()
}

/// Builds `src` against the header and `-lgpupool` (and the simulator's runtime if `cudart`).
fn build_linked(src: &Path, compiler: &str, std: &str, cudart: bool) -> PathBuf {
    let include = format!("-I{}", root().join("include").display());
    let libs = gpupool_libs();
    let libs: Vec<&str> = libs.iter().map(String::as_str).collect();
    let mut flags = vec![std, include.as_str()];
    if std == "-std=c99" {
        flags.push("-pedantic");
    }
    Sim::get().build(
        src,
        &Build {
            compiler,
            flags: &flags,
            libs: &libs,
            cudart,
        },
    )
}

/// Classic segments, where a test counts the driver's allocations or times `cudaMalloc`.
const CLASSIC: (&str, &str) = ("GPUPOOL_EXPANDABLE", "0");

fn api(mode: &str, env: &[(&str, &str)]) -> (String, String) {
    run_mode(&api_program(), mode, env)
}

fn edges(mode: &str, env: &[(&str, &str)]) -> (String, String) {
    run_mode(&edges_program(), mode, env)
}

fn run_mode(exe: &Path, mode: &str, env: &[(&str, &str)]) -> (String, String) {
    ok(clean_command(exe).arg(mode).envs(env.iter().copied()))
}

#[test]
fn statistics_equal_what_the_program_did() {
    // Classic segments: each is one allocation the simulator counts.
    let (out, _) = api("stats", &[CLASSIC]);
    assert!(out.contains("stats ok"), "{out}");
    // The summary written through the API agrees with the struct.
    assert!(out.contains("gpupool summary"), "{out}");
}

#[test]
fn a_block_freed_on_a_stream_serves_that_stream_at_once_in_relaxed_mode_only() {
    let (out, _) = api("streams", &[("GPUPOOL_REUSE", "relaxed")]);
    assert!(out.contains("streams ok"), "{out}");
    for reuse in ["strict", "barrier"] {
        let (out, _) = api("streams", &[("GPUPOOL_REUSE", reuse)]);
        assert!(out.contains("streams ok"), "{reuse}: {out}");
    }
}

#[test]
fn a_failed_stream_query_of_the_pools_own_leaves_no_last_error() {
    let (out, _) = edges("lasterr", &[("GPUPOOL_REUSE", "relaxed")]);
    assert!(out.contains("lasterr ok"), "{out}");
    for devices in ["1", "2"] {
        let (out, _) = edges("devquery", &[("CUDASIM_DEVICES", devices)]);
        assert!(out.contains("devquery ok"), "{devices} devices: {out}");
    }
    for reuse in ["strict", "barrier", "relaxed"] {
        let (out, _) = api(
            "xdev",
            &[("GPUPOOL_REUSE", reuse), ("CUDASIM_DEVICES", "2")],
        );
        assert!(out.contains("xdev ok"), "{reuse}: {out}");
    }
}

#[test]
fn devices_beyond_the_pools_64_go_to_the_runtime_and_the_threshold_calls_refuse_them() {
    let (out, _) = edges("highdev", &[("CUDASIM_DEVICES", "66")]);
    assert!(out.contains("highdev ok"), "{out}");
}

#[test]
fn a_runtime_that_cannot_count_its_devices_gives_101_and_leaves_no_error() {
    let (out, _) = edges("countfail", &[]);
    assert!(out.contains("countfail ok"), "{out}");
}

#[test]
fn a_forked_childs_summary_says_the_pool_is_off_there() {
    let (out, _) = edges("forkline", &[]);
    assert!(out.contains("forkline ok"), "{out}");
}

/// A signal handler that interrupts the pool's own thread and calls the API: every call is
/// refused with 999 (the second as the first: a first refusal that marked the thread outside
/// the pool would let the second deadlock), and no free reaches the runtime.
#[test]
fn calls_from_a_signal_handler_inside_the_pool_are_refused_and_free_nothing() {
    let (out, err) = edges("reentry", &[("CUDASIM_MALLOC_US", "400000"), CLASSIC]);
    assert!(out.contains("reentry ok"), "{out}");
    assert!(
        err.contains("cudaFree(")
            && err.contains("inside the pool")
            && err.contains("nothing freed"),
        "{err}"
    );
    assert!(
        err.contains("gpupool_torch_free(") && err.contains("failed with CUDA error 999"),
        "{err}"
    );
}

#[test]
fn empty_cache_gives_memory_back_to_the_driver() {
    let (out, _) = api("empty", &[("CUDASIM_DEVICES", "2")]);
    assert!(out.contains("empty ok"), "{out}");
    assert!(number::<u64>(&out, "released") > 0);
}

#[test]
fn idle_segments_a_larger_request_outgrew_go_back_to_the_driver() {
    let (out, _) = edges("outgrown", &[CLASSIC]);
    assert!(out.contains("outgrown ok"), "{out}");
    // The summary says why the memory went back.
    let line = out
        .lines()
        .find(|l| l.contains(" released "))
        .unwrap_or_else(|| panic!("no released line: {out}"));
    assert!(line.contains("outgrown 1 segment (768 MiB)"), "{line}");
}

#[test]
fn the_stats_struct_says_where_the_memory_lies() {
    // Mapped bytes and address space of expandable segments, releasable and stranded bytes,
    // from C, against the simulator and the JSON; none mapped with classic segments.
    for env in [[("GPUPOOL_EXPANDABLE", "1")], [CLASSIC]] {
        let (out, err) = edges("mapped", &env);
        assert!(out.contains("mapped ok"), "{env:?}: {out}\n{err}");
    }
}

#[test]
fn a_percentage_threshold_is_read_for_the_device_asked_about() {
    // Devices of different sizes, the one asked about not current: its own size counts.
    let env = [
        ("CUDASIM_DEVICES", "2"),
        ("CUDASIM_MEM", "16GiB,4GiB"),
        ("GPUPOOL_RELEASE_THRESHOLD", "25%"),
    ];
    let (out, _) = api("percent", &env);
    assert!(out.contains("percent ok"), "{out}");
}

#[test]
fn a_percentage_limit_is_read_for_the_device_whose_pool_it_bounds() {
    // Device 1 holds 4 GiB, so its limit is 2 GiB; device 0, current when device 1's pool is
    // made, holds 16 GiB.
    let env = [
        ("CUDASIM_DEVICES", "2"),
        ("CUDASIM_MEM", "16GiB,4GiB"),
        ("GPUPOOL_LIMIT", "50%"),
    ];
    let (out, _) = api("limitxdev", &env);
    assert!(out.contains("limitxdev ok"), "{out}");
}

#[test]
fn null_and_bad_arguments_are_refused() {
    for mode in ["strict", "barrier", "relaxed"] {
        let (out, err) = api("args", &[("GPUPOOL_REUSE", mode)]);
        assert!(out.contains("args ok"), "{out}");
        // The invalid frees are reported once, on one line.
        assert_eq!(
            err.matches("not the start of a live allocation").count(),
            1,
            "{err}"
        );
    }
}

#[test]
fn disabled_pool_passes_api_calls_through_to_the_runtime() {
    let (out, _) = api("disabled", &[("GPUPOOL_DISABLE", "1")]);
    assert!(out.contains("disabled ok"), "{out}");
    assert!(out.contains("gpupool: disabled"), "{out}");
}

#[test]
fn a_preloaded_library_and_a_linked_one_are_the_same_copy() {
    // The preloaded file has the soname the program needs (libgpupool.so.0), so the dynamic
    // linker loads one copy: the program's cudaMalloc and its gpupool_* calls share one pool
    // (the stats mode checks that cudaMalloc allocations show in gpupool_get_stats).
    let (out, _) = ok(clean_command(&api_program())
        .arg("stats")
        .env(CLASSIC.0, CLASSIC.1)
        .env("LD_PRELOAD", library()));
    assert!(out.contains("stats ok"), "{out}");
}

#[test]
fn linking_gpupool_ahead_of_cudart_pools_without_preload() {
    let exe = build_linked(&root().join("tests/c/churn.c"), "cc", "-std=c11", true);
    let (out, _) = ok(clean_command(&exe).args(["1", "3000", "1"]));
    let program: u64 = number(&out, "program mallocs");
    let real: u64 = number(&out, "real mallocs");
    assert!(
        real * 10 < program,
        "{real} real cudaMalloc calls for {program}: the pool was not used"
    );
}

fn example(name: &str, compiler: &str, std: &str) -> PathBuf {
    // Linked with libgpupool alone: the library finds (loads) the runtime itself.
    build_linked(&root().join("examples").join(name), compiler, std, false)
}

fn simulator_runtime() -> String {
    Sim::get()
        .simlib
        .join("libcudart.so.12")
        .display()
        .to_string()
}

#[test]
fn c_and_cxx_examples_build_with_werror_and_run_on_the_simulator() {
    for (exe, name) in [
        (example("api_demo.c", "cc", "-std=c99"), "C"),
        (example("api_demo.cpp", "c++", "-std=c++17"), "C++"),
    ] {
        let (out, err) = ok(clean_command(&exe).env("GPUPOOL_CUDART", simulator_runtime()));
        let released = out
            .lines()
            .find_map(|l| l.strip_prefix("empty_cache released ")?.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok());
        assert!(released.is_some_and(|n| n > 0), "{name}: {out}");
        assert!(
            out.contains("gpupool summary"),
            "{name}: no summary in\n{out}"
        );
        assert!(err.is_empty(), "{name}: stderr: {err}");
    }
}

#[test]
fn a_program_that_calls_only_gpupool_finds_the_runtime_by_name() {
    let exe = example("api_demo.c", "cc", "-std=c99");
    let needed = Command::new("readelf").arg("-d").arg(&exe).output();
    if let Ok(needed) = needed {
        let text = String::from_utf8_lossy(&needed.stdout);
        assert!(
            text.contains("libgpupool.so.0") && !text.contains("libcudart"),
            "{text}"
        );
    }
    // Found through the library search path, as libcudart.so.12.
    let (out, _) = ok(clean_command(&exe).env("LD_LIBRARY_PATH", &Sim::get().simlib));
    assert!(out.contains("pool on"), "{out}");
    // No runtime anywhere: error 35 and one line that says why.
    let out = clean_command(&exe)
        .env("LD_LIBRARY_PATH", "/nonexistent")
        .env("GPUPOOL_CUDART", "/nonexistent/libcudart.so")
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&out);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains("pool off"), "{stdout}");
    assert!(stderr.contains("failed with error 35"), "{stderr}");
    assert_eq!(
        stderr.matches("cannot find the CUDA runtime").count(),
        1,
        "{stderr}"
    );
    // A GPUPOOL_CUDART that names a FIFO: never opened (the open would wait for a writer),
    // the same answer, at once.
    let fifo = scratch("cudart-fifo").join("libcudart.so");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let out = support::output_within(
        clean_command(&exe)
            .env("LD_LIBRARY_PATH", "/nonexistent")
            .env("GPUPOOL_CUDART", &fifo),
        60,
    );
    let (stdout, stderr) = texts(&out);
    assert!(stdout.contains("pool off"), "{stdout}\n{stderr}");
    assert!(stderr.contains("failed with error 35"), "{stderr}");
}

#[test]
fn a_runtime_that_calls_cuda_while_it_is_opened_is_served_not_deadlocked() {
    // The runtime's constructor calls cudaMemGetInfo by name while the pool opens it: the call
    // reaches the pool's hook on the thread that is finding the runtime. It is served (the
    // pool finds the runtime that is being opened, already loaded), and the program goes on.
    let exe = example("api_demo.c", "cc", "-std=c99");
    let runtime = support::c_library("reentrant_runtime");
    let out = support::output_within(
        clean_command(&exe)
            .env("LD_LIBRARY_PATH", "/nonexistent")
            .env("GPUPOOL_CUDART", &runtime),
        60,
    );
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        number::<i32>(&stdout, "constructor_mem_get_info="),
        0,
        "{stdout}\n{stderr}"
    );
    assert!(number::<u64>(&stdout, "constructor_free=") > 0, "{stdout}");
    assert!(stdout.contains("pool on"), "{stdout}\n{stderr}");
}

/// The ctypes script that calls the PyTorch entry points as `CUDAPluggableAllocator` does.
fn torch_script(preload: bool, runtime_global: bool) -> (String, String) {
    torch_script_with(preload, runtime_global, &[])
}

fn torch_script_with(
    preload: bool,
    runtime_global: bool,
    env: &[(&str, &str)],
) -> (String, String) {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut cmd = clean_command(Path::new(&python));
    cmd.arg(root().join("tests/torch_allocator.py"))
        .arg(library())
        .arg(simulator_runtime())
        .env("CUDASIM_DEVICES", "2")
        .envs(env.iter().copied());
    if preload {
        cmd.env("LD_PRELOAD", library());
    }
    if runtime_global {
        cmd.env("CUDART_GLOBAL", "1");
    }
    ok(&mut cmd)
}

#[test]
fn torch_pluggable_allocator_entry_points_through_ctypes() {
    let (out, err) = torch_script(false, false);
    assert!(out.contains("torch allocator ok"), "{out}");
    // PyTorch does not check for NULL: each refused allocation is explained on stderr.
    assert!(
        err.contains("gpupool_torch_malloc(-1 bytes, device 0) failed"),
        "{err}"
    );
    assert!(
        err.contains("gpupool_torch_malloc(1048576 bytes, device 7) failed with CUDA error 101"),
        "{err}"
    );
    // A free naming another device than the block's is not refused.
    assert!(!err.contains("not the start of a live allocation"), "{err}");
    let (out, _) = torch_script(true, false);
    assert!(out.contains("torch allocator ok"), "preloaded: {out}");
    // In relaxed mode, PyTorch's own rule: reuse on the stream that freed the block.
    let (out, _) = torch_script_with(false, false, &[("GPUPOOL_REUSE", "relaxed")]);
    assert!(out.contains("torch allocator ok"), "relaxed: {out}");
}

/// PyTorch's wheels load the runtime into the global scope before the allocator library: the
/// library must still find the runtime (not take its own hooks for it) and its entry points
/// must still reach the pool, not the runtime's `cudaMalloc` (found on the H200).
#[test]
fn torch_entry_points_work_when_the_runtime_was_loaded_globally_first() {
    let (out, err) = torch_script(false, true);
    assert!(out.contains("torch allocator ok"), "{out}\n{err}");
    assert!(!err.contains("cannot find the CUDA runtime"), "{err}");
}

/// A plugin linked with `-lgpupool`, loaded and unloaded three times by a program that handles
/// SIGUSR1 itself: the library stays loaded (`-z nodelete`), so the same pool serves every
/// load, nothing it cached leaks, and one summary is written, at exit (not one per unload,
/// with the pool and its segments dropped each time).
#[test]
fn a_plugin_unloaded_and_loaded_again_keeps_one_pool() {
    let include = format!("-I{}", root().join("include").display());
    let libs = gpupool_libs();
    let libs: Vec<&str> = libs.iter().map(String::as_str).collect();
    let plugin = Sim::get().build(
        &root().join("tests/c/plugin.c"),
        &Build {
            compiler: "cc",
            flags: &["-std=c11", "-shared", "-fPIC", include.as_str()],
            libs: &libs,
            cudart: true,
        },
    );
    let host = Sim::get().build(
        &root().join("tests/c/plugin_host.c"),
        &Build {
            compiler: "cc",
            flags: &["-std=c11"],
            libs: &["-ldl"],
            cudart: true,
        },
    );
    let (out, err) = ok(clean_command(&host)
        .arg(&plugin)
        .env("GPUPOOL_SUMMARY", "stderr"));
    assert_eq!(
        out, "cycle 1 live_mib 256\ncycle 2 live_mib 256\ncycle 3 live_mib 256\n",
        "{err}"
    );
    assert_eq!(err.matches("gpupool summary").count(), 1, "{err}");
    assert!(err.contains("3 mallocs, 3 frees"), "{err}");
}

/// Reports while another thread waits for the GPU inside the pool (a fence): the program's own
/// `gpupool_get_stats` waits and gives the real figures (it gave success with zeros), and the
/// exit summary names the device it could not read rather than leave it out (or say that
/// nothing was intercepted).
#[test]
fn reports_while_another_thread_fences_in_the_pool() {
    let exe = build_linked(&root().join("tests/c/busy.c"), "cc", "-std=c11", true);
    let (out, _) = ok(clean_command(&exe)
        .arg("stats")
        .env("GPUPOOL_FENCE_BYTES", "1"));
    assert!(out.contains("busy stats ok"), "{out}");
    // From a signal handler on the thread that holds the lock: a failure, not a deadlock.
    let out = support::output_within(
        clean_command(&exe)
            .arg("signal")
            .env("GPUPOOL_FENCE_BYTES", "1"),
        30,
    );
    assert!(
        out.status.success() && texts(&out).0.contains("busy signal ok"),
        "{:?}",
        texts(&out)
    );
    for dest in ["stderr", "always:stderr"] {
        let (_, err) = ok(clean_command(&exe)
            .arg("exit")
            .env("GPUPOOL_FENCE_BYTES", "1")
            .env("GPUPOOL_SUMMARY", dest));
        assert!(err.contains("gpupool summary"), "{dest}: {err}");
        assert!(err.contains(" device 0   not read"), "{dest}: {err}");
        assert!(!err.contains("no CUDA allocations"), "{dest}: {err}");
    }
}
