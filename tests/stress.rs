//! Stress with content checks on the simulator: many threads on two devices, random sizes, every
//! block tagged and verified before it is freed, new blocks checked for overlap with every live
//! one, and a share of the frees made by another thread than the allocating one (through a
//! queue the threads share), with the other device current. Each reuse mode, a few seconds
//! each; `scripts/stress.sh DURATION` runs the same for longer with fresh seeds.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use support::{c_program, number, output_within, pooled, texts};

#[test]
fn threads_on_two_devices_with_cross_thread_frees_keep_every_block_intact() {
    let seed: u64 = std::env::var("GPUPOOL_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_240_601);
    for (i, mode) in ["strict", "barrier", "relaxed"].into_iter().enumerate() {
        let seed = (seed + i as u64).to_string();
        let args = ["8", "700", "2", seed.as_str(), "35"];
        let env = [
            ("CUDASIM_DEVICES", "2"),
            ("CUDASIM_MEM", "4GiB"),
            ("GPUPOOL_REUSE", mode),
            ("GPUPOOL_RELEASE_THRESHOLD", "64MiB"),
        ];
        let out = output_within(&mut pooled(&c_program("churn"), &args, &env), 120);
        let (stdout, stderr) = texts(&out);
        assert!(
            out.status.success(),
            "churn {} with {env:?} failed (reproduce: LD_PRELOAD=target/debug/libgpupool.so \
             CUDASIM_DEVICES=2 CUDASIM_MEM=4GiB GPUPOOL_REUSE={mode} \
             GPUPOOL_RELEASE_THRESHOLD=64MiB churn {}):\n{stdout}\n{stderr}",
            args.join(" "),
            args.join(" ")
        );
        let crossed: u64 = number(&stdout, "freed by another thread");
        assert!(crossed > 300, "only {crossed} cross-thread frees");
    }
}

#[test]
fn thread_caches_under_churn_keep_every_block_intact() {
    // Relaxed mode without a release threshold: threads allocating on one device get their own
    // caches, and blocks cross between them through the shared queue.
    let summary = support::scratch("stress-thread-caches").join("summary.json");
    let summary_s = summary.to_str().expect("utf-8 path");
    let env = [
        ("CUDASIM_DEVICES", "2"),
        ("CUDASIM_MEM", "4GiB"),
        ("GPUPOOL_REUSE", "relaxed"),
        ("GPUPOOL_SUMMARY", summary_s),
    ];
    let args = ["8", "700", "2", "20240611", "35", "few"];
    let out = output_within(&mut pooled(&c_program("churn"), &args, &env), 120);
    let (stdout, stderr) = texts(&out);
    assert!(
        out.status.success(),
        "churn {} with {env:?} failed:\n{stdout}\n{stderr}",
        args.join(" ")
    );
    let crossed: u64 = number(&stdout, "freed by another thread");
    assert!(crossed > 300, "only {crossed} cross-thread frees");
    let json = std::fs::read_to_string(&summary).expect("summary written");
    let hits: u64 = json
        .split("\"thread_cache_hits\":")
        .skip(1)
        .map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .expect("a number")
        })
        .sum();
    assert!(hits > 100, "thread caches served only {hits}: {json}");
}

/// Waves of threads on two devices, each block under a kernel on the legacy, a blocking or a
/// non-blocking stream and freed while it runs, by its thread or another one (the exiting
/// threads leave theirs), with device switches, synchronizations, empty-cache and thread caches
/// started by a warm-up in turns (`tests/c/race.c`): no block handed out under a kernel or over
/// a live one, no granule unmapped under a kernel, and the pool reserves what the driver holds
/// once all is freed and the caches emptied.
#[test]
fn waves_of_threads_freeing_under_kernels_never_reuse_a_block_early() {
    for mode in ["strict", "barrier"] {
        let args = ["4", "2", "500", "2", "7", "edsmwf"];
        let env = [("CUDASIM_DEVICES", "2"), ("GPUPOOL_REUSE", mode)];
        let out = output_within(&mut pooled(&c_program("race"), &args, &env), 120);
        let (stdout, stderr) = texts(&out);
        assert!(
            out.status.success(),
            "race {} with {env:?} failed:\n{stdout}\n{stderr}",
            args.join(" ")
        );
        assert!(stdout.contains("race ok"), "{stdout}");
    }
}

/// A control thread calls what a program's monitoring and a framework's memory management call
/// (thresholds, empty-cache, peak resets, stats and summaries, the default pool's trim and
/// attributes, device syncs, SIGUSR1, `cudaMemGetInfo`, and `fork` with a child that allocates)
/// while threads allocate with `cudaMalloc` and `cudaMallocAsync` on four kinds of stream,
/// destroy streams with frees pending and exit with full caches. No block is handed out twice
/// or under a kernel, every tag holds, the figures add up while read, and at the end the pool
/// reserves what the driver holds. The forks check that a child's simulator leaves its
/// parent's expandable segments alone (`sim_vmm`'s fork section).
#[test]
fn controls_and_forks_during_stream_churn_keep_every_block_intact() {
    for (mode, expandable, opts) in [
        ("strict", "1", "tepgSTADmuf"),
        ("barrier", "1", "tepgSTADmuf"),
        ("relaxed", "1", "tepgSTADmuR"),
        ("barrier", "1", "f"),
        ("strict", "0", "tepgSTADmuf"),
    ] {
        let args = ["3", "2", "500", "7", opts];
        let env = [
            ("CUDASIM_MEM", "2GiB"),
            ("CUDASIM_CONTEXT_BYTES", "0"),
            ("GPUPOOL_REUSE", mode),
            ("GPUPOOL_EXPANDABLE", expandable),
            ("GPUPOOL_SUMMARY", "/dev/null"),
        ];
        let out = output_within(&mut pooled(&c_program("control_race"), &args, &env), 150);
        let (stdout, stderr) = texts(&out);
        assert!(
            out.status.success() && stdout.contains("control_race ok"),
            "control_race {} with {env:?} failed:\n{stdout}\n{stderr}",
            args.join(" ")
        );
        let checked: u64 = number(&stdout, "checked=");
        assert!(checked > 300, "{mode}: only {checked} tags checked");
    }
}
