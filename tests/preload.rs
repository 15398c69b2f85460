//! Programs run under `LD_PRELOAD=libgpupool.so` against the CUDA runtime simulator: C programs
//! linked against it, and a Python program that loads a CUDA-using module `RTLD_LOCAL`.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

use sim::{Build, Sim};
use support::{library, number};

fn c_program(name: &str) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<std::collections::HashMap<String, PathBuf>>> =
        OnceLock::new();
    let map = BUILT.get_or_init(Default::default);
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    map.entry(name.to_string())
        .or_insert_with(|| {
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
            Sim::get().compile(&src, &[])
        })
        .clone()
}

/// Runs `exe` under the preloaded pool with a clean `GPUPOOL_*`/`CUDASIM_*` environment plus
/// `env`.
fn run_pooled(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = support::clean_command(exe);
    cmd.args(args).env("LD_PRELOAD", library());
    cmd.envs(env.iter().copied());
    cmd.output().expect("run program")
}

fn ok(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let out = run_pooled(exe, args, env);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{} {args:?} with {env:?} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        exe.display(),
        out.status
    );
    (stdout, stderr)
}

/// The count after `key` on its own line of `text`.
fn figure(text: &str, key: &str) -> u64 {
    number(text, key)
}

#[test]
fn churn_single_thread_is_served_from_cache() {
    let (out, err) = ok(&c_program("churn"), &["1", "3000", "1"], &[]);
    let program = figure(&out, "program mallocs");
    let real = figure(&out, "real mallocs");
    assert!(program > 1000);
    assert!(
        real * 10 < program,
        "{real} real cudaMalloc for {program} requests"
    );
    assert!(err.is_empty(), "unexpected stderr: {err}");
}

#[test]
fn churn_eight_threads_never_hands_out_a_block_twice() {
    for mode in ["strict", "barrier", "relaxed"] {
        ok(
            &c_program("churn"),
            &["8", "800", "1", "7"],
            &[("GPUPOOL_REUSE", mode)],
        );
    }
}

#[test]
fn churn_two_devices_frees_with_the_other_device_current() {
    let (out, _) = ok(
        &c_program("churn"),
        &["4", "800", "2", "11"],
        &[("CUDASIM_DEVICES", "2")],
    );
    assert!(figure(&out, "real mallocs") * 5 < figure(&out, "program mallocs"));
}

#[test]
fn churn_with_a_release_threshold_keeps_content_intact() {
    ok(
        &c_program("churn"),
        &["4", "800", "1", "3"],
        &[("GPUPOOL_RELEASE_THRESHOLD", "8MiB")],
    );
}

#[test]
fn hostile_arguments_get_the_runtimes_answers() {
    for mode in ["strict", "barrier", "relaxed"] {
        ok(&c_program("hostile"), &[], &[("GPUPOOL_REUSE", mode)]);
    }
}

#[test]
fn device_reset_makes_the_pool_forget() {
    // With two devices the pool asks which one is current (reset.c arms that query to fail).
    for devices in ["1", "2"] {
        for mode in ["strict", "barrier", "relaxed"] {
            ok(
                &c_program("reset"),
                &[],
                &[("GPUPOOL_REUSE", mode), ("CUDASIM_DEVICES", devices)],
            );
        }
    }
}

#[test]
fn a_reset_while_other_threads_allocate_loses_no_segment_of_the_new_context() {
    // A request between CUDA's reset and the pool's forgetting took a segment of the new
    // context that the pool then forgot (the driver kept it), or put a new segment beside the
    // old context's dead ones in the pool's index.
    let exe = c_program("reset_race");
    for (expandable, cache, devices, how) in [
        ("0", "64MiB", "1", ""),
        ("0", "0", "2", ""),
        ("1", "64MiB", "2", ""),
        ("0", "64MiB", "1", "p"),
        ("1", "0", "1", "p"),
    ] {
        let env = [
            ("GPUPOOL_EXPANDABLE", expandable),
            ("GPUPOOL_THREAD_CACHE", cache),
            ("CUDASIM_DEVICES", devices),
        ];
        let (out, err) = ok(&exe, &["4", "40", devices, how], &env);
        assert!(out.contains("reset_race ok"), "{out}");
        assert!(!err.contains("internal error"), "with {env:?}: {err}");
    }
}

#[test]
fn out_of_memory_releases_the_cache_and_retries() {
    for mode in ["strict", "barrier", "relaxed"] {
        ok(
            &c_program("oom"),
            &[],
            &[
                ("CUDASIM_MEM", "1GiB"),
                ("CUDASIM_CONTEXT_BYTES", "0"),
                ("GPUPOOL_REUSE", mode),
            ],
        );
    }
}

#[test]
fn release_threshold_is_honoured_at_synchronization() {
    let exe = c_program("threshold");
    let mib = 1u64 << 20;
    let (out, _) = ok(&exe, &[], &[("GPUPOOL_RELEASE_THRESHOLD", "256MiB")]);
    // Nothing is released inside cudaFree itself...
    assert_eq!(figure(&out, "held after free"), 1024 * mib);
    // ...and at the synchronization the cache is down to the threshold plus one segment.
    assert!(
        figure(&out, "held after sync") <= 256 * mib + 64 * mib,
        "{out}"
    );
    let (out, _) = ok(&exe, &[], &[]);
    assert_eq!(figure(&out, "held after sync"), 1024 * mib);
    let (out, _) = ok(&exe, &[], &[("GPUPOOL_RELEASE_THRESHOLD", "0")]);
    assert_eq!(figure(&out, "held after sync"), 0);
}

#[test]
fn no_reuse_while_a_kernel_on_a_nonblocking_stream_uses_the_block() {
    let exe = c_program("hazard");
    for mode in ["strict", "barrier"] {
        ok(&exe, &[], &[("GPUPOOL_REUSE", mode)]);
        ok(
            &exe,
            &["tight"],
            &[
                ("GPUPOOL_REUSE", mode),
                ("CUDASIM_MEM", "64MiB"),
                ("CUDASIM_CONTEXT_BYTES", "0"),
            ],
        );
    }
}

/// A block freed under a kernel on a blocking stream and handed to a kernel on another blocking
/// stream: in `barrier` mode the pool's barrier must order the second after the first, also when
/// the runtime takes a wait on an event never recorded to order nothing (the simulator does; a
/// barrier that is only such a wait would let the block be clobbered).
#[test]
fn a_block_reused_across_blocking_streams_waits_for_the_first_kernel() {
    let exe = c_program("hazard");
    // Not `relaxed`: there a plain cudaFree trusts the program to order its streams itself.
    for mode in ["strict", "barrier"] {
        ok(&exe, &["blocking"], &[("GPUPOOL_REUSE", mode)]);
        ok(
            &exe,
            &["tight", "blocking"],
            &[
                ("GPUPOOL_REUSE", mode),
                ("CUDASIM_MEM", "64MiB"),
                ("CUDASIM_CONTEXT_BYTES", "0"),
            ],
        );
    }
}

/// `stream_reuse SCENARIO` in each of `modes` on a device with room for one of its blocks, in
/// classic and expandable segments: every round's request can only be served by the block a
/// kernel still uses, so each round reuses it, and the old kernel's late write must not land on
/// the new owner's data.
fn stream_reuse_in(scenario: &str, modes: &[&str]) {
    let exe = c_program("stream_reuse");
    for &mode in modes {
        for expandable in ["1", "0"] {
            let (out, _) = ok(
                &exe,
                &[scenario],
                &[
                    ("GPUPOOL_REUSE", mode),
                    ("GPUPOOL_EXPANDABLE", expandable),
                    ("CUDASIM_MEM", "20MiB"),
                    ("CUDASIM_CONTEXT_BYTES", "0"),
                ],
            );
            assert_eq!(
                figure(&out, "reused="),
                3,
                "{scenario} {mode} expandable={expandable}: {out}"
            );
        }
    }
}

/// A block freed under a kernel on a blocking stream before the program's first non-blocking
/// stream: what it waited for (a barrier) orders nothing of that stream's work.
#[test]
fn a_block_freed_before_the_first_non_blocking_stream_is_not_reused_under_its_kernel() {
    // Not `relaxed`: there a plain cudaFree trusts the program to order its streams itself.
    stream_reuse_in("nb_after_free", &["strict", "barrier"]);
}

/// A cudaFree under a kernel that waits for the device's lock (another thread gets a segment
/// from a slow driver) while the program creates its first non-blocking stream: the free read
/// `barrier` mode's rule before the stream was seen and was stamped after it was checked for,
/// so a barrier alone made the block reusable, for work on that stream.
#[test]
fn a_free_racing_the_first_non_blocking_stream_is_not_reused_under_its_kernel() {
    let (out, _) = ok(
        &c_program("nonblocking_race"),
        &[],
        &[
            ("GPUPOOL_REUSE", "barrier"),
            ("GPUPOOL_EXPANDABLE", "0"),
            ("CUDASIM_MALLOC_US", "300000"),
        ],
    );
    assert_eq!(figure(&out, "reused="), 1, "{out}");
}

/// The program's own cudaFreeAsync on a blocking stream, and cudaMallocAsync on a non-blocking
/// one: CUDA orders the reuse in every mode, so must the pool.
#[test]
fn cuda_free_async_on_a_blocking_stream_is_not_reused_under_its_kernel_by_a_non_blocking_one() {
    stream_reuse_in("nb_requester", &["strict", "barrier", "relaxed"]);
}

/// Two threads' per-thread default streams (`_ptsz`) are two streams: a block freed on one is
/// not the other's to reuse at once.
#[test]
fn per_thread_default_streams_of_two_threads_do_not_share_their_frees() {
    stream_reuse_in("ptsz", &["strict", "barrier", "relaxed"]);
}

/// A stream destroyed with a free pending on it, and one created next (perhaps at the same
/// handle): the new stream is another, whose work does not wait for the destroyed one's.
#[test]
fn a_stream_created_after_one_destroyed_with_a_pending_free_is_another_stream() {
    stream_reuse_in("destroyed", &["strict", "barrier", "relaxed"]);
}

/// Three threads, each block used on one of four streams (legacy, per-thread, blocking,
/// non-blocking) and freed in stream order there or with cudaFree (not in `relaxed` mode), on a
/// device where the pool must reuse: no tag clobbered, no block handed out over a live one, no
/// granule unmapped under a kernel.
#[test]
fn stream_ordered_churn_on_four_kinds_of_stream_keeps_every_tag() {
    let exe = c_program("stream_churn");
    for mode in ["strict", "barrier", "relaxed"] {
        let args: &[&str] = if mode == "relaxed" {
            &["3", "1200", "3", "async-only"]
        } else {
            &["3", "1200", "3"]
        };
        // Classic segments strand memory (design-notes.md, "Note: expandable segments"). The
        // program's live blocks peak at 144–168 MiB (`peak_live_mib`, 8 runs without the
        // pool): 220 MiB leaves classic segments too thin a margin, so their runs get room;
        // expandable ones keep the pressure.
        for (expandable, mem) in [("1", "220MiB"), ("0", "300MiB")] {
            let (out, _) = ok(
                &exe,
                args,
                &[
                    ("GPUPOOL_REUSE", mode),
                    ("GPUPOOL_EXPANDABLE", expandable),
                    ("CUDASIM_MEM", mem),
                    ("CUDASIM_CONTEXT_BYTES", "0"),
                ],
            );
            assert!(figure(&out, "checked=") > 1500, "{mode}: {out}");
        }
    }
}

#[test]
fn thread_caches_never_hand_out_a_block_a_kernel_still_uses() {
    // Two threads in turns on one device start thread caches in `strict` and `barrier` mode
    // too; blocks freed under running kernels then wait in the caches for a fence.
    let exe = c_program("thread_hazard");
    for (mode, seed) in [("strict", "1"), ("barrier", "2")] {
        let (out, err) = ok(
            &exe,
            &["2", "4000", seed],
            &[("GPUPOOL_REUSE", mode), ("GPUPOOL_SUMMARY", "stderr")],
        );
        assert!(out.contains("thread hazard ok"), "{out}");
        assert!(figure(&out, "allocations checked") > 3000, "{out}");
        let by_caches: u64 = err
            .lines()
            .flat_map(|l| l.split("; "))
            .find_map(|part| part.strip_suffix(" by thread caches")?.trim().parse().ok())
            .unwrap_or(0);
        assert!(by_caches > 500, "{mode}: thread caches unused:\n{err}");
    }
}

#[test]
fn legacy_stream_launches_are_barriers_through_either_launch_entry_point() {
    for how in ["api", "internal"] {
        ok(
            &c_program("launch_barrier"),
            &[how],
            &[("GPUPOOL_REUSE", "barrier")],
        );
    }
}

#[test]
fn overlap_loop_runs_and_waits_for_its_kernels() {
    let (out, _) = ok(
        &c_program("overlap"),
        &["50", "2000", "1000", "1048576"],
        &[],
    );
    // Whatever the pool does, the final synchronization waits for every kernel.
    assert!(number::<f64>(&out, "wall_ms") >= 100.0, "{out}");
}

#[test]
fn disabled_pool_passes_every_call_through() {
    let (out, _) = ok(
        &c_program("churn"),
        &["1", "500", "1"],
        &[("GPUPOOL_DISABLE", "1")],
    );
    assert_eq!(
        figure(&out, "real mallocs"),
        figure(&out, "program mallocs")
    );
}

#[test]
fn python_module_loaded_rtld_local_is_intercepted() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/framework.c");
    let module = Sim::get().compile(&src, &["-shared", "-fPIC"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/framework_test.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = run_pooled(
        Path::new(&python),
        &[script.to_str().unwrap(), module.to_str().unwrap(), "2000"],
        &[],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Strict mode grows until GPUPOOL_FENCE_BYTES (256 MiB) of frees await a fence, then reuses:
    // about 13 segments of 20 MiB for 3 MiB blocks, whatever the number of requests.
    let real = figure(&stdout, "real mallocs");
    assert!(
        real * 100 < 2000,
        "{real} real cudaMalloc calls for 2000 requests"
    );
}

#[test]
fn processes_that_never_use_cuda_print_and_write_nothing() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("quiet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let summary = dir.join("summary-%p.txt");
    let env = [
        ("GPUPOOL_SUMMARY", summary.to_str().unwrap()),
        ("GPUPOOL_RELEASE_THRESHOLD", "garbage"),
    ];
    for (prog, args) in [("/bin/true", vec![]), ("python3", vec!["-c", "pass"])] {
        let out = run_pooled(Path::new(prog), &args, &env);
        assert!(out.status.success());
        assert!(
            out.stdout.is_empty() && out.stderr.is_empty(),
            "{prog} printed"
        );
    }
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "a file was written"
    );
}

#[test]
fn exit_summary_counts_what_the_program_did() {
    let (out, err) = ok(
        &c_program("churn"),
        &["1", "2000", "1"],
        &[("GPUPOOL_SUMMARY", "stderr")],
    );
    let program = figure(&out, "program mallocs");
    let line = err
        .lines()
        .find(|l| l.trim_start().starts_with("calls"))
        .unwrap_or_else(|| panic!("no calls line in:\n{err}"));
    assert!(
        line.contains(&format!(" {program} mallocs, {program} frees")),
        "{line}"
    );
    let real = figure(&out, "real mallocs");
    assert!(
        err.contains(&format!("cudaMalloc {real} (")),
        "summary disagrees with the runtime's {real} calls:\n{err}"
    );
}

#[test]
fn trace_replay_reproduces_the_live_runs_peak_reserved_bytes() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tool = support::trace_tool();
    for (mode, threshold) in [
        ("strict", "none"),
        ("barrier", "64MiB"),
        ("relaxed", "none"),
    ] {
        let trace = dir.join(format!("{mode}.trace"));
        let (out, _) = ok(
            &c_program("churn"),
            &["1", "3000", "1", "5"],
            &[
                ("GPUPOOL_TRACE", trace.to_str().unwrap()),
                ("GPUPOOL_REUSE", mode),
                ("GPUPOOL_RELEASE_THRESHOLD", threshold),
            ],
        );
        let live_peak = figure(&out, "peak real bytes");
        let run = |args: &[&str]| {
            let o = std::process::Command::new(&tool)
                .args(args)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            String::from_utf8(o.stdout).unwrap()
        };
        let t = trace.to_str().unwrap();
        // What the trace says happened: the runtime's own peak.
        let stats = run(&["stats", t]);
        assert!(stats.contains("peak reserved"), "{stats}");
        assert!(
            stats.contains(&format!("({live_peak} bytes)")),
            "{mode}: {stats}"
        );
        assert!(stats.contains(&format!("{} allocations", figure(&out, "program mallocs"))));
        // The algorithm run again offline: the same peak, the same decisions.
        let replay = run(&["replay", t]);
        assert!(
            replay.contains("peak reserved") && replay.contains(&format!("({live_peak} bytes)")),
            "{mode}: replay disagrees with the live peak {live_peak}:\n{replay}"
        );
        assert!(!replay.contains("diverged"), "{replay}");
        // And other settings give other answers, without a GPU.
        let relaxed = run(&["replay", t, "--reuse", "relaxed", "--threshold", "0"]);
        assert!(relaxed.contains("cudaFree"), "{relaxed}");
    }
}

#[test]
fn a_forked_child_does_not_repeat_its_parents_summary() {
    for how in ["exit", "_exit"] {
        let (_, err) = ok(
            &c_program("fork_summary"),
            &[how],
            &[("GPUPOOL_SUMMARY", "stderr")],
        );
        assert_eq!(
            err.matches("gpupool summary").count(),
            1,
            "{how}: expected the parent's summary only:\n{err}"
        );
        assert!(err.contains(" 1 mallocs, 1 frees"), "{err}");
    }
}

/// `cudaMallocPitch`, as OpenCV and NPP allocate images: the pool serves it, with the pitch the
/// runtime gives, rows that keep their bytes, the runtime's answers to hostile arguments, and a
/// summary that counts it.
#[test]
fn pitched_allocations_are_pooled_with_the_runtimes_pitch() {
    let exe = c_program("pitched");
    let runtime_alone = [("GPUPOOL_DISABLE", "1")];
    let pitches = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with("pitch "))
            .map(str::to_string)
            .collect()
    };
    let (pooled, err) = ok(&exe, &["pitches"], &[("GPUPOOL_SUMMARY", "stderr")]);
    let (alone, _) = ok(&exe, &["pitches"], &runtime_alone);
    assert_eq!(pitches(&pooled), pitches(&alone), "{pooled}");
    assert_eq!(pitches(&pooled).len(), 9, "{pooled}");
    assert!(err.contains(" 9 mallocs, 9 frees"), "{err}");

    let (pooled, _) = ok(&exe, &["churn"], &[]);
    let (alone, _) = ok(&exe, &["churn"], &runtime_alone);
    assert_eq!(figure(&alone, "driver_mallocs"), 200, "{alone}");
    // One for the runtime's row alignment, one for the image's segment.
    assert!(figure(&pooled, "driver_mallocs") <= 2, "{pooled}");

    let (pooled, err) = ok(&exe, &["hostile"], &[]);
    let (alone, _) = ok(&exe, &["hostile"], &runtime_alone);
    assert_eq!(pooled, alone);
    // The out-of-memory report names the program's call, and CUDA's own try of it.
    assert!(pooled.contains("code larger_than_the_device 2"), "{pooled}");
    assert!(
        err.contains("cudaMallocPitch of 1.00 TiB (1099511627776 bytes) failed"),
        "{err}"
    );
    assert!(
        err.contains("and with the runtime's own cudaMallocPitch"),
        "{err}"
    );
}

/// A program's first `cudaMallocPitch` after it filled the device and freed it all: the memory
/// sits in the pool's cache, where the pool must find room for the image (never worse on
/// memory), even though asking the runtime for its row alignment fails then.
#[test]
fn a_first_pitched_allocation_on_a_device_full_of_cache_fits() {
    let exe = c_program("pitched");
    for expandable in ["0", "1"] {
        let env = [
            ("CUDASIM_MEM", "64MiB"),
            ("CUDASIM_CONTEXT_BYTES", "0"),
            ("GPUPOOL_EXPANDABLE", expandable),
        ];
        let (alone, _) = ok(&exe, &["full"], &[env[0], env[1], ("GPUPOOL_DISABLE", "1")]);
        assert!(alone.contains("full blocks 64 pitch 2560"), "{alone}");
        let (pooled, _) = ok(&exe, &["full"], &env);
        assert!(pooled.contains(" pitch 2560"), "{env:?}: {pooled}");
    }
}

/// Allocators the pool does not serve (`cudaMallocManaged`, `cudaMallocFromPoolAsync` from the
/// default or the program's own memory pool) on a device whose memory the pool's cache holds:
/// the request fits, as without the pool (never worse on memory), and leaves no error behind.
/// Also from another device's memory pool than the current device's (`other-device`); and
/// the program's own current pool, which only its device's cache can serve, leaves the other
/// devices' caches alone (`own-current`).
#[test]
fn allocators_the_pool_does_not_serve_get_its_cache_back_at_out_of_memory() {
    let exe = c_program("cache_in_the_way");
    for mode in [
        "managed",
        "default-pool",
        "own-pool",
        "other-device",
        "own-current",
    ] {
        for expandable in ["0", "1"] {
            let env = [
                ("CUDASIM_DEVICES", "2"),
                ("CUDASIM_MEM", "1GiB"),
                ("CUDASIM_CONTEXT_BYTES", "0"),
                ("GPUPOOL_EXPANDABLE", expandable),
            ];
            let (out, _) = ok(&exe, &[mode], &env);
            assert!(
                out.contains("all checks passed"),
                "{mode} {expandable}: {out}"
            );
        }
    }
}

/// C++ static objects that free their device memory in their destructors, at exit: one in the
/// program, one in a library it loads with `dlopen`, both made before the first allocation. The
/// summary comes after both destructors, counts their frees and lists nothing as allocated.
#[test]
fn frees_static_objects_make_in_their_destructors_come_before_the_summary() {
    let s = Sim::get();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/exit_order.cpp");
    let build = |flags: &[&str]| {
        let flags: Vec<&str> = ["-std=c++17"].iter().chain(flags).copied().collect();
        s.build(
            &src,
            &Build {
                compiler: "c++",
                flags: &flags,
                libs: &[],
                cudart: true,
            },
        )
    };
    let library = build(&["-DEXIT_ORDER_LIBRARY", "-shared", "-fPIC"]);
    let exe = build(&[]);
    let library = library.display().to_string();
    let (out, _) = ok(&exe, &[&library], &[("GPUPOOL_SUMMARY", "stdout")]);
    let summary = out.find("gpupool summary").expect("a summary");
    for owner in ["program", "library"] {
        let freed = out
            .find(&format!("the {owner}'s buffers freed at exit"))
            .unwrap_or_else(|| panic!("the {owner}'s destructor did not run:\n{out}"));
        assert!(
            freed < summary,
            "the summary came before the {owner}'s destructor:\n{out}"
        );
    }
    assert!(out.contains(" 6 mallocs, 6 frees"), "{out}");
    assert!(!out.contains("still allocated"), "{out}");
}

/// Two CUDA runtimes in one process (frameworks built for different CUDA versions, each loading
/// its own libcudart RTLD_LOCAL): the hooks catch both runtimes' calls and forward them to the
/// one the pool uses, where the other's kernels are unknown. Their launches, through
/// `cudaLaunchKernel` and `__cudaLaunchKernel`, must still run, in the runtime that registered
/// them, not fail with cudaErrorInvalidDeviceFunction.
#[test]
fn kernels_of_a_second_runtime_run_in_that_runtime() {
    let s = Sim::get();
    // A copy of the simulator with another soname: another runtime, with its own kernels.
    let dir = s.scratch().join("second-runtime");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = std::fs::read(s.profile_dir.join("libcudasim.so")).unwrap();
    let (from, to) = (b"libcudart.so.12\0", b"libcudart.so.13\0");
    let at = lib
        .windows(from.len())
        .position(|w| w == from)
        .expect("the simulator's soname");
    let mut copy = lib.clone();
    copy[at..at + to.len()].copy_from_slice(to);
    let second = dir.join("libcudart.so.13");
    std::fs::write(&second, &copy).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/runtime_module.c");
    let first_module = s.build(
        &src,
        &Build {
            compiler: "cc",
            flags: &["-std=c11", "-shared", "-fPIC"],
            libs: &[],
            cudart: true,
        },
    );
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let second_lib = second.display().to_string();
    let second_module = s.build(
        &src,
        &Build {
            compiler: "cc",
            flags: &["-std=c11", "-shared", "-fPIC", "-DSECOND_RUNTIME"],
            libs: &[second_lib.as_str(), rpath.as_str()],
            cudart: false,
        },
    );
    let host = s.build(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/runtimes_host.c"),
        &Build {
            compiler: "cc",
            flags: &["-std=c11"],
            libs: &["-ldl"],
            cudart: false,
        },
    );
    let modules = [
        first_module.to_str().unwrap(),
        second_module.to_str().unwrap(),
    ];
    for mode in ["strict", "relaxed"] {
        let (out, err) = ok(&host, &modules, &[("GPUPOOL_REUSE", mode)]);
        assert_eq!(out.matches("module_run -> 0").count(), 2, "{mode}: {out}");
        // A launch the module's runtime refuses: its code and last error (1, invalid value),
        // as without the pool (not 98, nor a missing last error).
        assert_eq!(
            out.matches("module_refused -> 1001").count(),
            2,
            "{mode}: {out}"
        );
        assert_eq!(
            err.matches("more than one CUDA runtime").count(),
            1,
            "{mode}: {err}"
        );
    }
}
