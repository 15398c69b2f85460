//! The driver API under the pool (`tests/c/driver_pool.c`): a program linked with `-lcuda`, one
//! that reaches the driver as the static CUDA runtime does (`dlopen`, `cuGetProcAddress_v2`
//! with flags 0 and 2), and the `dlsym` fallback of versioned names. Each is pooled on segments
//! from the driver, with no runtime in the process; every other lookup reads as without the
//! pool.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use sim::{Build, Sim};
use support::{number, ok, pooled, scratch, summary_allocations, summary_passed_for, unpooled};

fn program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| Sim::get().compile_driver(&support::root().join("tests/c/driver_pool.c")))
        .clone()
}

/// `tests/c/driver_module.c`, a shared library with nothing of CUDA linked.
fn module() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let sim = Sim::get();
        // Its own run path finds libcuda.so.1 for its dlopen, as a wheel's module finds the
        // driver on the system's path.
        let rpath = format!("-Wl,-rpath,{}", sim.simlib.display());
        let build = Build {
            compiler: "cc",
            flags: &["-std=c11", "-shared", "-fPIC"],
            libs: &["-ldl", &rpath],
            cudart: false,
        };
        sim.build(&support::root().join("tests/c/driver_module.c"), &build)
    })
    .clone()
}

/// `tests/c/driver_mixed.c`, linked with the runtime and `-lcuda`.
fn mixed() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| support::c_program_with_driver("driver_mixed"))
        .clone()
}

const ENV: &[(&str, &str)] = &[("CUDASIM_MEM", "1GiB"), ("CUDASIM_CONTEXT_BYTES", "0")];

/// Runs `mode` pooled (with `env` added) and unpooled; returns both stdouts and the pooled stderr.
fn both(mode: &str, env: &[(&str, &str)]) -> (String, String, String) {
    both_with_args(&[mode], env)
}

/// `both`, with the program's arguments (the mode first).
fn both_with_args(args: &[&str], env: &[(&str, &str)]) -> (String, String, String) {
    let exe = program();
    let mode = args[0];
    let all: Vec<(&str, &str)> = ENV.iter().chain(env).copied().collect();
    let limit: Vec<(&str, &str)> = env
        .iter()
        .filter(|e| e.0 == "GPUPOOL_LIMIT")
        .copied()
        .collect();
    let unpooled_env: Vec<(&str, &str)> = ENV.iter().chain(&limit).copied().collect();
    let (with, stderr) = ok(&mut pooled(&exe, args, &all));
    let (without, _) = ok(&mut unpooled(&exe, args, &unpooled_env));
    let done = format!("driver_pool {mode}: all checks passed");
    assert!(with.contains(&done), "{with}\n{stderr}");
    assert!(without.contains(&done), "{without}");
    (with, without, stderr)
}

/// What a user of the driver notices: segments taken from the driver once, not per call; the
/// cache counted as free; a created context's allocations and out-of-memory left to the driver.
fn assert_pooled(mode: &str, with: &str, without: &str) {
    let churn: u64 = number(with, "churn_driver_mallocs=");
    let asynchronous: u64 = number(with, "async_driver_mallocs=");
    assert!(
        churn <= 1,
        "{mode}: 100 cuMemAlloc took {churn} driver allocations"
    );
    assert!(
        asynchronous <= 1,
        "{mode}: 100 cuMemAllocAsync took {asynchronous}"
    );
    assert_eq!(number::<u64>(without, "churn_driver_mallocs="), 100);
    // The free memory the program sees is what it could get: the cache counts as free.
    assert_eq!(
        number::<u64>(with, "info_free="),
        number::<u64>(without, "info_free="),
        "{mode}"
    );
    assert_eq!(number::<u64>(with, "info_total="), 1 << 30);
    assert_eq!(number::<u64>(with, "created_context_driver_mallocs="), 10);
    assert_eq!(
        number::<u64>(with, "created_info_free="),
        number::<u64>(without, "created_info_free="),
        "{mode}"
    );
    // CUDA_ERROR_INVALID_VALUE under the pool: a handle would name the segment, not the block.
    assert_eq!(number::<i32>(with, "ipc_second_block="), 1, "{mode}");
    assert_eq!(number::<i32>(without, "ipc_second_block="), 0, "{mode}");
    assert_eq!(
        number::<u64>(with, "oom_after="),
        number::<u64>(without, "oom_after=")
    );
    // The pool serves the driver with no runtime: gpupool_enabled() says so.
    assert_eq!(number::<i32>(with, "pool_enabled="), 1, "{mode}");
    assert_eq!(number::<i32>(without, "pool_enabled="), -1, "{mode}");
}

#[test]
fn linked_with_lcuda_is_pooled() {
    let path = scratch("driver-lcuda").join("summary.json");
    let (with, without, _) = both("lcuda", &[("GPUPOOL_SUMMARY", path.to_str().unwrap())]);
    assert_pooled("lcuda", &with, &without);
    // The created context's ten 1 MiB allocations went to the driver: the summary says so.
    assert_eq!(summary_passed_for(&path, "own_context"), (10, 10 << 20));
    assert_eq!(summary_passed_for(&path, "unplaced_stream"), (0, 0));
}

#[test]
fn the_static_runtimes_way_is_pooled_with_both_flag_values() {
    for mode in ["static", "static-ptsz"] {
        let (with, without, _) = both(mode, &[]);
        assert_pooled(mode, &with, &without);
    }
}

#[test]
fn versioned_names_taken_with_dlsym_are_pooled() {
    let (with, without, _) = both("fallback", &[]);
    assert_pooled("fallback", &with, &without);
}

/// Every hooked name looked up with `dlsym` in the driver answers the pool's own function of
/// that name: the hooks' tables agree on their order (`driver_identity.c`). The simulator's
/// driver has every hooked name.
#[test]
fn each_hooked_driver_name_is_swapped_for_its_own_hook() {
    let sim = Sim::get();
    let rpath = format!("-Wl,-rpath,{}", sim.simlib.display());
    let build = Build {
        compiler: "cc",
        flags: &["-std=c11"],
        libs: &["-ldl", &rpath],
        cudart: false,
    };
    let exe = sim.build(&support::root().join("tests/c/driver_identity.c"), &build);
    let names: Vec<&str> = gpupool::cuda::hooked::NAMES
        .iter()
        .map(|n| n.to_str().expect("an ASCII name"))
        .collect();
    let (out, err) = ok(&mut pooled(&exe, &names, ENV));
    assert!(out.contains("driver_identity ok"), "{out}\n{err}");
    let checked: usize = number(&out, "checked=");
    let skipped: usize = number(&out, "skipped=");
    assert_eq!(checked + skipped, names.len(), "{out}");
    assert_eq!(
        skipped, 0,
        "the simulator's driver has every hooked name: {out}"
    );
}

#[test]
fn driver_hooks_off_leaves_the_driver_alone() {
    // A program linked with -lcuda reaches the exported hooks by symbol, with or without the
    // setting: off, they pass its calls to the driver.
    for mode in ["static", "lcuda"] {
        for env in [("GPUPOOL_DRIVER_HOOKS", "0"), ("GPUPOOL_DISABLE", "1")] {
            let (with, _, _) = both(mode, &[env]);
            assert_eq!(
                number::<u64>(&with, "churn_driver_mallocs="),
                100,
                "{mode} {env:?}"
            );
        }
    }
}

#[test]
fn other_lookups_read_as_without_the_pool() {
    let (with, without, stderr) = both("lookups", &[]);
    assert_eq!(with, without);
    assert!(stderr.is_empty(), "{stderr}");
    assert!(with.contains("rtld_next_is_default=1"), "{with}");
}

#[test]
fn the_summary_counts_a_driver_only_program() {
    let (with, _, stderr) = both("lcuda", &[("GPUPOOL_SUMMARY", "stderr")]);
    assert!(with.contains("driver_pool lcuda"));
    assert!(stderr.contains("gpupool summary"), "{stderr}");
    assert!(stderr.contains("runtime libcuda.so.1"), "{stderr}");
    // The pool's own calls, and the out-of-memory report, named as the driver's.
    assert!(stderr.contains(" driver     cuMemAlloc "), "{stderr}");
    assert!(
        stderr.contains("out of memory on device 0: cuMemAlloc of 300 MiB"),
        "{stderr}"
    );
    assert!(stderr.contains("the driver's own cuMemAlloc"), "{stderr}");
    // Who held the memory when it ran out: the program's three 300 MiB blocks.
    assert!(
        stderr.contains("  held by    the program (driver_pool")
            && stderr.contains("900 MiB in 3 blocks"),
        "{stderr}"
    );
}

#[test]
fn a_module_loaded_rtld_local_that_finds_the_driver_itself_is_pooled() {
    let lib = module();
    let lib = lib.to_str().expect("a UTF-8 path");
    let (with, without, _) = both_with_args(&["module", lib], &[]);
    assert!(
        number::<u64>(&with, "module_driver_mallocs=") <= 1,
        "{with}"
    );
    assert_eq!(number::<u64>(&without, "module_driver_mallocs="), 100);
}

#[test]
fn a_python_extension_loaded_rtld_local_that_finds_the_driver_itself_is_pooled() {
    // As XLA: Python loads the module RTLD_LOCAL, the module opens the driver and takes its
    // versioned functions with dlsym.
    let lib = module();
    let script = support::root().join("tests/xla_like.py");
    let py = std::path::PathBuf::from(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()));
    let args = [script.to_str().unwrap(), lib.to_str().unwrap()];
    let (with, stderr) = ok(&mut pooled(&py, &args, ENV));
    let (without, _) = ok(&mut unpooled(&py, &args, ENV));
    assert!(with.contains("xla_like ok"), "{with}\n{stderr}");
    assert!(
        number::<u64>(&with, "module_driver_mallocs=") <= 1,
        "{with}"
    );
    assert_eq!(number::<u64>(&without, "module_driver_mallocs="), 100);
}

#[test]
fn the_limit_applies_to_the_driver_path() {
    let (with, without, stderr) = both("lcuda", &[("GPUPOOL_LIMIT", "512MiB")]);
    // 300 MiB blocks: one fits under the limit, three on the device.
    assert_eq!(number::<u64>(&with, "oom_after="), 1, "{stderr}");
    assert_eq!(number::<u64>(&without, "oom_after="), 3);
}

#[test]
fn one_pool_serves_both_apis_and_frees_cross() {
    let exe = mixed();
    let (with, stderr) = ok(&mut pooled(&exe, &[], ENV));
    let (without, _) = ok(&mut unpooled(&exe, &[], ENV));
    assert!(
        with.contains("driver_mixed: all checks passed"),
        "{with}\n{stderr}"
    );
    assert!(
        without.contains("driver_mixed: all checks passed"),
        "{without}"
    );
    assert!(number::<u64>(&with, "mixed_mallocs=") <= 2, "{with}");
    assert_eq!(number::<u64>(&without, "mixed_mallocs="), 100);
    // cuMemFree taken through cudaGetDriverEntryPoint(ByVersion) is the pool's hook: the block
    // goes back to the pool, no segment to the driver.
    for key in ["entry_point_frees=", "entry_point_by_version_frees="] {
        assert_eq!(number::<u64>(&with, key), 0, "{key} {with}");
        assert_eq!(number::<u64>(&without, key), 1, "{key} {without}");
    }
}

/// `tests/c/driver_mixed.c` linked with the runtime first (`-lcudart -lcuda`): the simulator's
/// one library is then loaded as `libcudart.so.12`, the runtime the pool names, as a real
/// runtime apart from the driver would be.
fn mixed_runtime_first() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let sim = Sim::get();
        let simlib = sim.simlib.display().to_string();
        let rpath = format!("-Wl,-rpath,{simlib}");
        let build = Build {
            compiler: "cc",
            flags: &["-std=c11"],
            libs: &["-L", &simlib, "-lcudart", "-lcuda", &rpath],
            cudart: false,
        };
        sim.build(&support::root().join("tests/c/driver_mixed.c"), &build)
    })
    .clone()
}

#[test]
fn a_driver_allocations_out_of_memory_is_reported_as_the_drivers_where_the_runtime_is_loaded() {
    // The report names the runtime's calls in this process; the program's call was
    // cuMemAlloc, and CUDA's own try of it the driver's.
    let (out, stderr) = ok(&mut pooled(&mixed_runtime_first(), &[], ENV));
    assert!(
        out.contains("driver_mixed: all checks passed"),
        "{out}\n{stderr}"
    );
    assert!(
        stderr.contains("cuMemAlloc of 2.00 GiB (2147483648 bytes) failed"),
        "{stderr}"
    );
    assert!(
        stderr.contains("and with the driver's own cuMemAlloc"),
        "{stderr}"
    );
    assert!(!stderr.contains("cudaMalloc of 2.00 GiB"), "{stderr}");
}

/// `tests/c/driver_hostile.c`, linked with `-lcuda` alone.
fn hostile() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| Sim::get().compile_driver(&support::root().join("tests/c/driver_hostile.c")))
        .clone()
}

/// Runs `driver_hostile MODE` pooled and unpooled; returns both stdouts.
fn hostile_both(mode: &str) -> (String, String) {
    let exe = hostile();
    let done = format!("driver_hostile {mode}: all checks passed");
    let (with, stderr) = ok(&mut pooled(&exe, &[mode], ENV));
    let (without, _) = ok(&mut unpooled(&exe, &[mode], ENV));
    assert!(with.contains(&done), "{with}\n{stderr}");
    assert!(without.contains(&done), "{without}");
    (with, without)
}

#[test]
fn a_context_the_program_made_gets_the_cached_memory_back_at_out_of_memory() {
    // 700 MiB cached for the primary context, then 700 MiB asked in a created one on a 1 GiB
    // device: without the pool it fits, so it must with it.
    hostile_both("created-oom");
}

#[test]
fn a_forked_child_reaches_the_driver_while_the_parent_allocates() {
    // 20 children forked while another thread of the parent allocates and frees through the
    // pool: each child's calls reach the driver, and none hangs.
    hostile_both("fork");
}

#[test]
fn a_primary_context_reset_makes_the_pool_forget_the_device() {
    let (with, without) = hostile_both("reset");
    assert_eq!(
        number::<u64>(&with, "reset_new_driver_mallocs="),
        1,
        "{with}"
    );
    assert_eq!(
        number::<u64>(&with, "reset_info_free="),
        number::<u64>(&without, "reset_info_free="),
    );
}

#[test]
fn a_release_after_a_reset_is_not_counted_as_a_second_reset() {
    // The reset destroyed the primary context; the release of the program's retain after it
    // destroys nothing, and the summary counts the one reset the program made.
    let exe = hostile();
    let env: Vec<(&str, &str)> = ENV
        .iter()
        .copied()
        .chain([("GPUPOOL_SUMMARY", "stderr")])
        .collect();
    let (out, stderr) = ok(&mut pooled(&exe, &["reset-release"], &env));
    assert!(
        out.contains("driver_hostile reset-release: all checks passed"),
        "{out}\n{stderr}"
    );
    assert!(stderr.contains("; resets 1\n"), "{stderr}");
    // The program called the driver's reset: the summary names no runtime call.
    assert!(
        stderr.contains(" total freed includes what 1 device reset dropped"),
        "{stderr}"
    );
}

#[test]
fn driver_names_looked_up_on_many_threads_while_others_allocate() {
    hostile_both("threads");
}

#[test]
fn a_driver_loaded_by_a_full_path_is_found_and_pooled() {
    // cudasim's runtime opens its driver by a full path (libcuda.so.1 is not on the library
    // search path here): the pool finds it by what it defines, not by its name.
    let exe = support::c_program("driver_by_path");
    let (with, stderr) = ok(&mut pooled(&exe, &[], ENV));
    let (without, _) = ok(&mut unpooled(&exe, &[], ENV));
    assert!(with.contains("driver_by_path ok"), "{with}\n{stderr}");
    assert!(number::<u64>(&with, "driver_path_mallocs=") <= 1, "{with}");
    assert_eq!(number::<u64>(&without, "driver_path_mallocs="), 100);
}

#[test]
fn cu_mem_alloc_async_from_the_programs_own_memory_pool_goes_to_the_driver() {
    // The program made its own pool current (cuDeviceSetMemPool), by symbol or through
    // cuGetProcAddress: the driver serves those requests from it, and only the default pool's
    // requests are the pool's.
    let exe = program();
    for mode in ["lcuda", "static"] {
        let args = [mode, "custom-pool"];
        let done = format!("driver_pool {mode} custom-pool: all checks passed");
        let (without, _) = ok(&mut unpooled(&exe, &args, ENV));
        assert!(without.contains(&done), "{without}");
        let program: u64 = number(&without, "program_async=");
        assert_eq!(number::<u64>(&without, "default_pool_served="), program);
        let path = scratch(&format!("driver-custom-pool-{mode}")).join("summary.json");
        let mut env = ENV.to_vec();
        env.push(("GPUPOOL_SUMMARY", path.to_str().unwrap()));
        let (with, err) = ok(&mut pooled(&exe, &args, &env));
        assert!(with.contains(&done), "{with}\n{err}");
        assert_eq!(number::<u64>(&with, "default_pool_served="), 0, "{mode}");
        assert_eq!(summary_allocations(&path), program, "{mode}");
        // What the program's own pool served, counted apart.
        let own: (u64, u64) = (
            number(&without, "own_pool_async="),
            number(&without, "own_pool_bytes="),
        );
        assert_eq!(
            support::summary_passed_through(&path),
            [own, (0, 0)],
            "{mode}"
        );
    }
}

/// `cuMemAllocManaged` and `cuMemAllocFromPoolAsync` (a static runtime's `cudaMallocManaged`
/// and `cudaMallocFromPoolAsync`), which the pool does not serve, on a device whose memory the
/// pool's cache holds: they fit, as without the pool, also from another device's pool than the
/// current context's. By symbol and through `cuGetProcAddress`.
#[test]
fn allocators_the_pool_does_not_serve_get_its_cache_back_through_the_driver() {
    let exe = program();
    let env = [
        ("CUDASIM_DEVICES", "2"),
        ("CUDASIM_MEM", "1GiB"),
        ("CUDASIM_CONTEXT_BYTES", "0"),
    ];
    for mode in ["lcuda", "static", "static-ptsz"] {
        for kind in ["managed", "pool", "other-device"] {
            let args = [mode, "cache-back", kind];
            let done = format!("driver_pool {mode} cache-back {kind}: all checks passed");
            let (without, _) = ok(&mut unpooled(&exe, &args, &env));
            assert!(without.contains(&done), "{without}");
            for expandable in ["0", "1"] {
                let mut env = env.to_vec();
                env.push(("GPUPOOL_EXPANDABLE", expandable));
                let (with, err) = ok(&mut pooled(&exe, &args, &env));
                assert!(with.contains(&done), "{mode} {kind}: {with}\n{err}");
            }
        }
    }
}

#[test]
fn the_default_memory_pools_figures_trim_and_threshold_include_the_pools_part() {
    // The static runtime's cudaMemPoolGetAttribute, cudaMemPoolTrimTo and
    // cudaMemPoolSetAttribute are these driver calls: by symbol, and through cuGetProcAddress.
    let exe = program();
    for mode in ["lcuda", "static"] {
        let args = [mode, "default-pool"];
        let done = format!("driver_pool {mode} default-pool: all checks passed");
        let (without, _) = ok(&mut unpooled(&exe, &args, ENV));
        assert!(without.contains(&done), "{without}");
        let (with, err) = ok(&mut pooled(&exe, &args, ENV));
        assert!(with.contains(&done), "{with}\n{err}");
        // What the pool caches reads as reserved; what the program holds as used.
        assert_eq!(number::<u64>(&without, "reserved_cached="), 0, "{mode}");
        assert!(
            number::<u64>(&with, "reserved_cached=") >= 120 << 20,
            "{mode}: {with}"
        );
        for key in ["used_live=", "held_after_trim=", "reserved_after_trim="] {
            assert_eq!(
                number::<u64>(&with, key),
                number::<u64>(&without, key),
                "{mode} {key}\n{with}"
            );
        }
        // The program's threshold of 0 is the pool's: nothing is kept past a synchronization.
        assert_eq!(
            number::<u64>(&with, "held_under_zero_threshold="),
            0,
            "{mode}"
        );
        // Before it, the pool keeps everything and the read says so (CUDA's own pool: 0).
        assert_eq!(number::<u64>(&without, "threshold_initial="), 0, "{mode}");
        assert_eq!(
            number::<u64>(&with, "threshold_initial="),
            u64::MAX,
            "{mode}"
        );
        for out in [&without, &with] {
            assert_eq!(number::<u64>(out, "threshold_read_back="), 0, "{mode}");
        }
        // Unless GPUPOOL_RELEASE_THRESHOLD chose the pool's threshold, which a read then gives.
        let mut chosen = ENV.to_vec();
        chosen.push(("GPUPOOL_RELEASE_THRESHOLD", "none"));
        let (kept, _) = ok(&mut pooled(&exe, &args, &chosen));
        assert!(
            number::<u64>(&kept, "held_under_zero_threshold=") >= 120 << 20,
            "{mode}: {kept}"
        );
        assert_eq!(
            number::<u64>(&kept, "threshold_read_back="),
            u64::MAX,
            "{mode}"
        );
    }
}

#[test]
fn created_streams_are_placed_where_the_driver_sees_two_devices() {
    // The current context's own stream is the pool's; another device's goes to the driver,
    // and the summary counts it.
    let exe = program();
    for mode in ["lcuda", "static"] {
        let args = [mode, "streams"];
        let done = format!("driver_pool {mode} streams: all checks passed");
        let mut env = ENV.to_vec();
        env.push(("CUDASIM_DEVICES", "2"));
        let (without, _) = ok(&mut unpooled(&exe, &args, &env));
        assert!(without.contains(&done), "{without}");
        assert_eq!(number::<u64>(&without, "placed_driver_mallocs="), 10);
        let path = scratch(&format!("driver-streams-{mode}")).join("summary.json");
        env.push(("GPUPOOL_SUMMARY", path.to_str().unwrap()));
        let (with, err) = ok(&mut pooled(&exe, &args, &env));
        assert!(with.contains(&done), "{with}\n{err}");
        assert!(
            number::<u64>(&with, "placed_driver_mallocs=") <= 1,
            "{mode}: {with}"
        );
        let unplaced = (
            number::<u64>(&with, "unplaced="),
            number::<u64>(&with, "unplaced_bytes="),
        );
        assert_eq!(
            summary_passed_for(&path, "unplaced_stream"),
            unplaced,
            "{mode}"
        );
        assert_eq!(summary_allocations(&path), 10, "{mode}");
    }
}

#[test]
fn a_program_whose_library_links_gpupool_starts_and_looks_up_as_always() {
    // The program's own libraries (libc among them) load before its library's libgpupool, so
    // nothing after libgpupool defines `dlsym`: its own `dlsym` must still reach glibc's.
    let sim = Sim::get();
    let libs = support::gpupool_libs();
    let user = sim.build(
        &support::root().join("tests/c/gpupool_user.c"),
        &Build {
            compiler: "cc",
            flags: &["-std=c11", "-shared", "-fPIC"],
            libs: &libs.iter().map(String::as_str).collect::<Vec<_>>(),
            cudart: false,
        },
    );
    let simlib = sim.simlib.display().to_string();
    let rpath = format!("-Wl,-rpath,{simlib}");
    let exe = sim.build(
        &support::root().join("tests/c/driver_late.c"),
        &Build {
            compiler: "cc",
            flags: &["-std=c11"],
            libs: &[
                user.to_str().unwrap(),
                "-L",
                &simlib,
                "-lcuda",
                &rpath,
                "-ldl",
            ],
            cudart: false,
        },
    );
    let (out, stderr) = ok(support::clean_command(&exe).envs(ENV.iter().copied()));
    assert!(
        out.contains("driver_late: all checks passed"),
        "{out}\n{stderr}"
    );
    assert!(out.contains("pool_enabled=1"), "{out}");
}

#[test]
fn a_library_that_exports_driver_names_keeps_its_own_functions() {
    // Opened RTLD_GLOBAL while no driver is loaded, the stand-in is the next definition of
    // `cuMemAlloc_v2` after the pool: still, only the driver's functions are swapped.
    let sim = Sim::get();
    let standin = support::c_library("standin_driver");
    let rpath = format!("-Wl,-rpath,{}", sim.simlib.display());
    let exe = sim.build(
        &support::root().join("tests/c/driver_standin.c"),
        &Build {
            compiler: "cc",
            flags: &["-std=c11"],
            libs: &["-ldl", &rpath],
            cudart: false,
        },
    );
    let args = [standin.to_str().unwrap()];
    let done = "driver_standin: all checks passed";
    let (with, stderr) = ok(&mut pooled(&exe, &args, ENV));
    let (without, _) = ok(&mut unpooled(&exe, &args, ENV));
    assert!(with.contains(done), "{with}\n{stderr}");
    assert!(without.contains(done), "{without}");
}

#[test]
fn a_program_whose_argv0_names_a_fifo_looks_up_driver_names() {
    // `dladdr` names the main program by its argv[0], which names anything the program's
    // parent chose: here a FIFO, which opening would block on until a writer comes.
    use std::os::unix::process::CommandExt;
    let fifo = scratch("argv0-fifo").join("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.expect("mkfifo").success());
    let mut cmd = pooled(&program(), &["lookups"], ENV);
    cmd.arg0(&fifo);
    let out = support::output_within(&mut cmd, 30);
    let (stdout, stderr) = support::texts(&out);
    assert!(
        out.status.success() && stdout.contains("driver_pool lookups: all checks passed"),
        "{}\n{stdout}\n{stderr}",
        out.status
    );
}

#[test]
fn a_double_free_in_stream_order_under_capture_leaves_the_segment_alone() {
    // The block starts a pool segment: passed on, the driver's free would take the whole
    // segment, the other block in it too.
    // Classic segments: a block in a range never starts the allocation the driver reports.
    let exe = support::c_program_with_driver("driver_capture");
    let done = "driver_capture: all checks passed";
    let mut classic = ENV.to_vec();
    classic.push(("GPUPOOL_EXPANDABLE", "0"));
    let (with, stderr) = ok(&mut pooled(&exe, &[], &classic));
    let (without, _) = ok(&mut unpooled(&exe, &[], ENV));
    assert!(with.contains(done), "{with}\n{stderr}");
    assert!(without.contains(done), "{without}");
}

#[test]
fn cu_mem_free_async_whose_capture_query_fails_otherwise_frees_as_the_driver_does() {
    // Only an unknown stream is the driver's refusal; another failed query cannot say.
    let (with, without) = hostile_both("query-fails");
    for key in ["query_fails_free=", "then_free="] {
        assert_eq!(
            number::<i32>(&with, key),
            number::<i32>(&without, key),
            "{with}"
        );
    }
    assert_eq!(number::<i32>(&with, "query_fails_free="), 0, "{with}");
}

#[test]
fn cu_mem_free_async_on_a_destroyed_stream_answers_as_the_driver() {
    // The driver refuses the stream and frees nothing; the program's block stays its own.
    let (with, without) = hostile_both("destroyed-stream");
    assert_eq!(
        number::<i32>(&with, "destroyed_stream_free="),
        number::<i32>(&without, "destroyed_stream_free="),
    );
}

/// `cuMemPoolTrimTo` needs no current context, and the pool's part of the trim is made in the
/// device's primary context: a trim to 0 from a thread with none gives the cache back, as with
/// the primary context current.
#[test]
fn a_trim_from_a_thread_without_a_context_gives_the_pools_cache_back() {
    let exe = support::c_program_with_driver("driver_trim_no_context");
    let (without, _) = ok(&mut unpooled(&exe, &[], &[]));
    assert_eq!(number::<u64>(&without, "live="), 0, "{without}");
    for env in [[("GPUPOOL_EXPANDABLE", "0")], [("GPUPOOL_EXPANDABLE", "1")]] {
        for mode in ["current", "none"] {
            let (with, err) = ok(&mut pooled(&exe, &[mode], &env));
            assert!(with.contains("driver_trim_no_context ok"), "{with}\n{err}");
            assert_eq!(number::<i32>(&with, "trim="), 0, "{mode} {env:?}: {with}");
            assert_eq!(
                number::<u64>(&with, "live="),
                0,
                "{mode} {env:?}: {with}\n{err}"
            );
        }
    }
}

/// The pool's fence for its own release is made in the device's primary context, where its
/// blocks' work runs: a context the program made, current at `gpupool_empty_cache`, has its own
/// `cuCtxSynchronize`, which waits for none of that work. The freed block's granules are unmapped
/// only after its kernel ends, and the program's context is current again after: with the
/// driver alone (the pool's own calls through it), and with the runtime loaded (through it).
#[test]
fn the_pools_fence_waits_for_the_primary_context_while_the_programs_own_is_current() {
    let src = support::root().join("tests/c/driver_own_context.c");
    let driver_only = Sim::get().compile_driver(&src);
    let with_runtime = support::c_program_with_driver("driver_own_context");
    for exe in [driver_only, with_runtime] {
        let (with, err) = ok(&mut pooled(&exe, &[], &[]));
        let what = format!("{}: {with}\n{err}", exe.display());
        assert!(with.contains("driver_own_context ok"), "{what}");
        assert_eq!(number::<u64>(&with, "released="), 64 << 20, "{what}");
        assert_eq!(number::<u64>(&with, "unmapped_while_busy="), 0, "{what}");
        assert_eq!(number::<u64>(&with, "own_current="), 1, "{what}");
    }
}

/// A device beyond the 64 the pool serves goes to the driver, as on the runtime path: its
/// primary context is not "a context the program created" in the summary.
#[test]
fn a_primary_context_beyond_the_pools_devices_is_not_counted_as_the_programs_own() {
    let exe = support::c_program_with_driver("driver_high_device");
    let path = scratch("driver-high-device").join("summary.json");
    let env = [
        ("CUDASIM_DEVICES", "66"),
        ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
    ];
    let (with, err) = ok(&mut pooled(&exe, &[], &env));
    assert!(with.contains("driver_high_device ok"), "{with}\n{err}");
    assert_eq!(summary_passed_for(&path, "own_context"), (0, 0), "{err}");
    assert_eq!(
        summary_allocations(&path),
        1,
        "device 0's block is pooled\n{err}"
    );
}

/// `cuMemAllocPitch_v2`, by symbol and through `cuGetProcAddress`: the pool serves it with the
/// driver's pitch for each element size, rows that keep their bytes, and the driver's answers
/// to hostile arguments.
#[test]
fn pitched_driver_allocations_are_pooled_with_the_drivers_pitch() {
    let exe = support::c_program_with_driver("driver_pitched");
    let pitches = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with("pitch "))
            .map(str::to_string)
            .collect()
    };
    let (alone, _) = ok(&mut unpooled(&exe, &["pitches"], &[]));
    for env in [[("GPUPOOL_EXPANDABLE", "0")], [("GPUPOOL_EXPANDABLE", "1")]] {
        let (with, err) = ok(&mut pooled(&exe, &["pitches"], &env));
        assert_eq!(pitches(&with), pitches(&alone), "{env:?}: {with}\n{err}");
        assert_eq!(pitches(&with).len(), 15, "{with}");
    }

    let (alone, _) = ok(&mut unpooled(&exe, &["churn"], &[]));
    assert_eq!(number::<u64>(&alone, "driver_mallocs "), 200, "{alone}");
    let (with, err) = ok(&mut pooled(
        &exe,
        &["churn"],
        &[("GPUPOOL_SUMMARY", "stderr")],
    ));
    // One for the driver's row alignment, one for the images' segment.
    assert!(number::<u64>(&with, "driver_mallocs ") <= 2, "{with}");
    assert!(err.contains(" 200 mallocs, 200 frees"), "{err}");

    let (alone, _) = ok(&mut unpooled(&exe, &["hostile"], &[]));
    let (with, err) = ok(&mut pooled(&exe, &["hostile"], &[]));
    assert_eq!(with, alone);
    // The out-of-memory report names the program's call, and CUDA's own try of it.
    assert!(with.contains("code larger_than_the_device 2"), "{with}");
    assert!(
        err.contains("cuMemAllocPitch of 1.00 TiB (1099511627776 bytes) failed"),
        "{err}"
    );
    assert!(
        err.contains("and with the driver's own cuMemAllocPitch"),
        "{err}"
    );
}

/// A block of device 0 freed in stream order on device 1's legacy stream, behind a kernel there
/// that still uses it, by a thread that last allocated on device 0: device 0's legacy stream
/// is another stream, which gets the block only once that kernel is done. The runtime's path
/// and the driver's; on a device with room for one block (each round reuses it) and on a
/// large one.
#[test]
fn a_free_in_stream_order_on_another_devices_legacy_stream_is_not_that_of_the_blocks_device() {
    let exe = support::c_program_with_driver("free_async_other_device");
    for how in ["runtime", "driver"] {
        for mode in ["strict", "barrier", "relaxed"] {
            for (mem, reused) in [("20MiB", 3), ("1GiB", 0)] {
                let env = [
                    ("CUDASIM_DEVICES", "2"),
                    ("CUDASIM_MEM", mem),
                    ("CUDASIM_CONTEXT_BYTES", "0"),
                    ("GPUPOOL_REUSE", mode),
                ];
                let (out, _) = ok(&mut pooled(&exe, &[how], &env));
                assert_eq!(
                    number::<u64>(&out, "reused="),
                    reused,
                    "{how} {mode} {mem}: {out}"
                );
            }
        }
    }
}

/// A program's first `cuMemAllocPitch_v2` after it filled the device and freed it all: the
/// memory sits in the pool's cache, where the pool must find room for the image (never worse on
/// memory), even though asking the driver for its row alignment fails then.
#[test]
fn a_first_pitched_driver_allocation_on_a_device_full_of_cache_fits() {
    let exe = support::c_program_with_driver("driver_pitched");
    let device = [("CUDASIM_MEM", "64MiB"), ("CUDASIM_CONTEXT_BYTES", "0")];
    let (alone, _) = ok(&mut unpooled(&exe, &["full"], &device));
    assert!(alone.contains("full blocks 64 pitch 2560"), "{alone}");
    for expandable in ["0", "1"] {
        let env = [device[0], device[1], ("GPUPOOL_EXPANDABLE", expandable)];
        let (with, err) = ok(&mut pooled(&exe, &["full"], &env));
        assert!(with.contains(" pitch 2560"), "{env:?}: {with}\n{err}");
    }
}

/// A pitched image in a context the program made is the driver's, and the summary counts what
/// the driver took for it: its pitch times its height, as the runtime's path counts it.
#[test]
fn a_pitched_image_in_a_context_the_program_made_counts_its_pitch() {
    let exe = support::c_program_with_driver("driver_pitched");
    let path = scratch("driver-pitched-own").join("summary.json");
    let (out, err) = ok(&mut pooled(
        &exe,
        &["own"],
        &[("GPUPOOL_SUMMARY", path.to_str().unwrap())],
    ));
    let pitch: u64 = number(&out, "own pitch ");
    assert!(pitch > 100, "{out}");
    assert_eq!(
        support::summary_passed_for(&path, "own_context"),
        (1, 3 * pitch),
        "{out}\n{err}"
    );
}

/// In a context the program made the pool serves nothing, so its limit is not that context's:
/// `cudaMemGetInfo` there tells what `cuMemGetInfo` tells, the driver's memory, and the program
/// gets more than the limit.
#[test]
fn in_a_context_the_program_made_mem_get_info_is_not_bounded_by_the_limit() {
    let exe = support::c_program_with_driver("own_context_mem_info");
    let (with, err) = ok(&mut pooled(&exe, &[], &[("GPUPOOL_LIMIT", "64MiB")]));
    assert!(with.contains("own_context_mem_info ok"), "{with}\n{err}");
    let n = |key: &str| number::<u64>(&with, key);
    assert_eq!(n("malloc_rc="), 0, "{with}");
    assert_eq!(n("rt_total="), n("drv_total="), "{with}");
    assert_eq!(n("rt_free="), n("drv_free="), "{with}");
    assert!(n("rt_free=") > 128 << 20, "{with}");
}

/// `tests/c/driver_sync_v2.c` under the pool in `strict` mode, where a request fences at once
/// to reuse a block (`GPUPOOL_FENCE_BYTES=0`): its stdout, and the JSON summary's fences the
/// pool took and program synchronizations it used.
fn sync_v2_run(what: &str, how: &str) -> (String, u64, u64) {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    let exe = EXE.get_or_init(|| {
        Sim::get().compile_driver(&support::root().join("tests/c/driver_sync_v2.c"))
    });
    let path = scratch(&format!("driver-sync-v2-{what}-{how}")).join("summary.json");
    let env: Vec<(&str, &str)> = ENV
        .iter()
        .copied()
        .chain([
            ("GPUPOOL_REUSE", "strict"),
            ("GPUPOOL_FENCE_BYTES", "0"),
            ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
        ])
        .collect();
    let (out, err) = ok(&mut pooled(exe, &[what, how], &env));
    assert!(
        out.contains("driver_sync_v2 ok"),
        "{what} {how}: {out}\n{err}"
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}\n{err}"));
    let v: serde_json::Value = serde_json::from_str(&text).expect("a JSON summary");
    let figure = |name: &str| {
        v["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .map(|d| d["in_flight"][name].as_u64().expect(name))
            .sum::<u64>()
    };
    (out, figure("fences"), figure("program_syncs_used"))
}

/// CUDA 13's `cuCtxSynchronize_v2` of the primary context (NULL with it current, or its handle
/// from any context), reached by symbol, `cuGetProcAddress_v2` or `dlsym`, is the program's
/// synchronization: the block freed under a kernel before it is reused with no fence of the
/// pool's own, and the new owner's bytes survive the kernel.
#[test]
fn cu_ctx_synchronize_v2_of_the_primary_context_spares_the_pools_fence() {
    for how in ["symbol", "proc", "dlsym"] {
        for what in ["null", "primary", "primary-from-green"] {
            let (out, fences, used) = sync_v2_run(what, how);
            let case = format!("{what} by {how}: {out}");
            assert_eq!(number::<u64>(&out, "reused_same="), 1, "{case}");
            assert_eq!(
                fences, 0,
                "the pool fenced after the program's sync: {case}"
            );
            assert_eq!(used, 1, "{case}");
            assert_eq!(number::<u64>(&out, "first_byte="), 0x55, "{case}");
        }
    }
}

/// `cuCtxSynchronize_v2` of a context the program made (its handle, or NULL with it current),
/// or of a green context's handle, waits for that context's work alone: the pool does not count
/// it and fences before it hands the block out again.
#[test]
fn cu_ctx_synchronize_v2_of_another_context_leaves_the_pools_fence() {
    for what in ["own", "own-null", "green"] {
        let (out, fences, used) = sync_v2_run(what, "symbol");
        assert_eq!(used, 0, "{what}: {out}");
        assert!(fences >= 1, "{what}: reused with no fence: {out}");
        assert_eq!(number::<u64>(&out, "first_byte="), 0x55, "{what}: {out}");
    }
}
