//! What a program sees of device memory under the pool: `cudaMemGetInfo` as without it, how
//! much fits when the pool's packing strands memory (and what the out-of-memory report says
//! then), and the per-process limit `GPUPOOL_LIMIT` on one and two devices, with thread caches.
//! The program is `tests/c/memory_view.c`, on the simulator.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use support::{number, ok, pooled, unpooled};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| support::c_program("memory_view"))
        .clone()
}

/// A 16 GiB device with a 512 MiB context, as in the report of the defect.
const DEVICE: [(&str, &str); 2] = [
    ("CUDASIM_MEM", "16GiB"),
    ("CUDASIM_CONTEXT_BYTES", "512MiB"),
];

fn with<'a>(env: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut all = DEVICE.to_vec();
    all.extend_from_slice(env);
    all
}

fn run(pool: bool, args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let env = with(env);
    let exe = program();
    let (out, err) = if pool {
        ok(&mut pooled(&exe, args, &env))
    } else {
        ok(&mut unpooled(&exe, args, &env))
    };
    assert!(out.ends_with("memory view ok\n"), "{out}\n{err}");
    (out, err)
}

/// Classic segments: what strands memory, and what the tests of it rely on.
const CLASSIC: (&str, &str) = ("GPUPOOL_EXPANDABLE", "0");
const EXPANDABLE: (&str, &str) = ("GPUPOOL_EXPANDABLE", "1");

#[test]
fn mem_get_info_counts_the_cache_the_pool_can_give_back_as_free() {
    let (without, _) = run(false, &["info"], &[]);
    for mode in ["strict", "barrier", "relaxed"] {
        let (with_pool, err) = run(true, &["info"], &[("GPUPOOL_REUSE", mode), CLASSIC]);
        let n = |text: &str, key: &str| number::<u64>(text, key);
        // Everything allocated and freed, synchronized: what the program would see without
        // the pool (it was 7.5 GiB of 15.5 before, the 8 GiB cached counted as used).
        for key in ["start_free", "all_freed_free", "all_freed_total"] {
            assert_eq!(n(&with_pool, key), n(&without, key), "{mode} {key}\n{err}");
        }
        assert_eq!(
            n(&with_pool, "all_freed_free"),
            15 * GIB + 512 * MIB,
            "{mode}"
        );
        // Live memory is used, with the pool as without it (1 GiB blocks: whole segments).
        for key in ["one_gib_live_free", "eight_gib_live_free"] {
            assert_eq!(n(&with_pool, key), n(&without, key), "{mode} {key}");
        }
        // A 7 MiB block holds its 20 MiB segment: the 13 MiB free beside it do not count, as
        // the driver cannot have them back.
        assert_eq!(
            n(&with_pool, "seven_mib_live_free"),
            n(&without, "seven_mib_live_free") - 13 * MIB,
            "{mode}"
        );
    }
}

#[test]
fn with_expandable_segments_mem_get_info_counts_free_granules_as_free() {
    let n = |text: &str, key: &str| number::<u64>(text, key);
    let (without, _) = run(false, &["cached"], &[]);
    for mode in ["strict", "barrier", "relaxed"] {
        let (with_pool, err) = run(
            true,
            &["cached"],
            &[
                ("GPUPOOL_REUSE", mode),
                EXPANDABLE,
                ("GPUPOOL_SUMMARY", "stderr"),
            ],
        );
        // 3.4 GiB of 7 MiB blocks freed, their granules still mapped: free, as without the
        // pool, before the synchronization too (out of memory would fence and unmap them).
        for key in [
            "start_free",
            "freed_free",
            "synced_free",
            "all_freed_free",
            "all_freed_total",
        ] {
            assert_eq!(
                n(&with_pool, key),
                n(&without, key),
                "{mode} {key}\n{with_pool}\n{err}"
            );
        }
        // A live 7 MiB block beside that cache keeps at most one granule more than without the
        // pool (classic segments: its whole 20 MiB segment, 13 MiB more).
        for key in ["seven_mib_live_free", "churned_free"] {
            let (pooled, alone) = (n(&with_pool, key), n(&without, key));
            assert!(
                pooled <= alone && alone - pooled <= 2 * MIB,
                "{mode} {key}: {pooled} with the pool, {alone} without"
            );
        }
        // What it was told is free, it gets.
        assert_eq!(
            n(&with_pool, "gib_blocks"),
            n(&without, "gib_blocks"),
            "{mode}"
        );
        // The summary's line: what is mapped, in how much address space, and nothing stranded
        // at exit.
        let line = err
            .lines()
            .find(|l| l.starts_with(" expandable "))
            .unwrap_or_else(|| panic!("{err}"));
        assert!(
            line.contains(" mapped in ")
                && line.contains(" GiB of reserved address space (1 range); ")
                && line.contains(" granules of 2.00 MiB mapped over the run, ")
                && line.contains("; stranded 0 B beside live blocks, "),
            "{line}"
        );
    }
    // Classic segments, for contrast: the 7 MiB block holds its 20 MiB segment.
    let (classic, err) = run(true, &["cached"], &[CLASSIC, ("GPUPOOL_SUMMARY", "stderr")]);
    assert_eq!(
        n(&classic, "seven_mib_live_free"),
        n(&without, "seven_mib_live_free") - 13 * MIB
    );
    assert!(
        err.contains(" expandable off (GPUPOOL_EXPANDABLE=0); stranded "),
        "{err}"
    );
}

#[test]
fn the_out_of_memory_report_names_the_pools_packing() {
    // 7 MiB blocks take two to a 20 MiB segment: 6 MiB of each stranded.
    let fill = |pool: bool| -> u64 { number(&run(pool, &["fill", "7"], &[CLASSIC]).0, "blocks") };
    let (alone, pooled_fill) = (fill(false), fill(true));
    assert!(pooled_fill * 10 < alone * 8, "{pooled_fill} of {alone}");
    // Every other block freed: 14 MiB blocks fit without the pool, not with it.
    let (out, _) = run(false, &["half", "7"], &[]);
    assert!(number::<u64>(&out, "double_blocks") > 500, "{out}");
    let (out, err) = run(true, &["half", "7"], &[CLASSIC]);
    assert!(number::<u64>(&out, "double_blocks") < 50, "{out}");
    // The report says why, and what helps now, instead of blaming the program's tensors.
    let line = |key: &str| {
        err.lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no {key:?} in:\n{err}"))
            .to_string()
    };
    assert!(
        line("  stranded   ").contains(" segments holding "),
        "{err}"
    );
    let advice = &err[err.find("  you can    ").expect("advice")..];
    assert!(
        advice.starts_with(
            "  you can    the pool's own packing is the cause, not the program's tensors"
        ),
        "{advice}"
    );
    assert!(advice.contains("GPUPOOL_DISABLE=1"), "{advice}");
    // Expandable segments pack without stranding: the advice says so.
    assert!(
        advice.contains("GPUPOOL_EXPANDABLE=1 (the default"),
        "{advice}"
    );
    assert!(
        !advice.contains("free tensors the program no longer needs"),
        "{advice}"
    );
}

/// The out-of-memory report of the request named `what` (`cudaMalloc of 14.0 MiB`) in `err`.
fn oom_report<'a>(err: &'a str, what: &str) -> &'a str {
    let head = format!("gpupool: out of memory on device 0: {what} (");
    let at = err
        .find(&head)
        .unwrap_or_else(|| panic!("no {head:?} in:\n{err}"));
    let rest = &err[at..];
    let end = rest[1..].find("gpupool: ").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

#[test]
fn with_expandable_segments_the_out_of_memory_report_tells_mapped_from_stranded() {
    // Every other 7 MiB block freed: the holes' whole granules went back, the granules they
    // share with the live blocks beside them stay mapped. 14 MiB blocks then fill the device
    // but for those shared granules.
    let (out, err) = run(true, &["half", "7"], &[EXPANDABLE]);
    assert!(number::<u64>(&out, "double_blocks") > 400, "{out}");
    let report = oom_report(&err, "cudaMalloc of 14.0 MiB");
    let line = |key: &str| {
        report
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no {key:?} in:\n{report}"))
    };
    assert!(
        line("  expandable ").contains(" GiB of reserved address space (2.00 MiB granules"),
        "{report}"
    );
    assert!(
        line("  stranded   ").contains(" in granules they share, "),
        "{report}"
    );
    assert!(
        line("  it tried   ").contains("then tried again to map the granules the request lacks"),
        "{report}"
    );
    let advice = &report[report.find("  you can    ").expect("advice")..];
    assert!(
        advice.starts_with(
            "  you can    the pool's own packing is the cause, not the program's tensors"
        ),
        "{advice}"
    );
    // Nothing of 20 MiB segments, nor of the setting in force already.
    assert!(!advice.contains("20 MiB"), "{advice}");
    assert!(!advice.contains("GPUPOOL_EXPANDABLE"), "{advice}");
    assert!(advice.contains("in whole 2.00 MiB granules"), "{advice}");
}

#[test]
fn expandable_segments_fill_the_device_as_without_the_pool() {
    // GPUPOOL_EXPANDABLE=1 through the CUDA backend: the driver's virtual memory calls map 2 MiB
    // granules into one reserved range, so 7 MiB blocks fit the 0.85 of what fits
    // without the pool (classic segments fit 0.70 of them; a long run of one size starts its
    // blocks on granules, 8 MiB each), and after every other block is freed its granules serve
    // blocks twice the size.
    let on = [("GPUPOOL_EXPANDABLE", "1")];
    let blocks = |pool: bool, args: &[&str], key: &str| -> u64 {
        number(&run(pool, args, if pool { &on } else { &[] }).0, key)
    };
    let alone = blocks(false, &["fill", "7"], "blocks");
    let packed = blocks(true, &["fill", "7"], "blocks");
    assert!(packed * 100 >= alone * 85, "{packed} of {alone}");
    let alone = blocks(false, &["half", "7"], "double_blocks");
    let packed = blocks(true, &["half", "7"], "double_blocks");
    assert!(packed * 10 >= alone * 8, "{packed} of {alone}");
}

#[test]
fn the_limit_caps_what_the_pool_reserves_and_what_the_program_is_told() {
    for limit in ["1GiB", "6.25%"] {
        let (out, err) = run(
            true,
            &["limit", "256"],
            &[("GPUPOOL_LIMIT", limit), ("GPUPOOL_SUMMARY", "stderr")],
        );
        let n = |key: &str| number::<u64>(&out, key);
        // Four 256 MiB segments fit in 1 GiB (6.25% of 16 GiB), and again after a release.
        assert_eq!(n("dev0_blocks"), 4, "{limit}\n{out}\n{err}");
        // The device looks the limit's size: full, then with one block's room.
        assert_eq!(n("dev0_full_total"), GIB, "{limit}");
        assert_eq!(n("dev0_full_free"), 0, "{limit}");
        assert_eq!(n("dev0_one_freed_free"), 256 * MIB, "{limit}");
        // The out-of-memory report names the limit; the summary shows it and the peak.
        assert!(
            err.contains("  limit      GPUPOOL_LIMIT lets the pool reserve 1.00 GiB"),
            "{err}"
        );
        assert!(
            err.contains("the pool's limit refused it (GPUPOOL_LIMIT"),
            "{err}"
        );
        assert!(
            err.contains("   limit 1.00 GiB (peak reserved 100.0%, refused "),
            "{err}"
        );
    }
    // Without the limit the same device holds far more.
    let (out, _) = run(true, &["limit", "256"], &[]);
    assert!(number::<u64>(&out, "dev0_blocks") > 50, "{out}");
}

#[test]
fn the_limit_holds_on_each_device() {
    let (out, err) = run(
        true,
        &["devices", "100"],
        &[
            ("CUDASIM_DEVICES", "2"),
            ("GPUPOOL_LIMIT", "1000MiB"),
            ("GPUPOOL_SUMMARY", "stderr"),
        ],
    );
    for d in ["dev0", "dev1"] {
        // 100 MiB requests get 100 MiB segments: ten of them in 1000 MiB.
        assert_eq!(number::<u64>(&out, &format!("{d}_blocks")), 10, "{out}");
        assert_eq!(number::<u64>(&out, &format!("{d}_full_total")), 1000 * MIB);
    }
    assert_eq!(
        err.matches("   limit 1000 MiB (peak reserved 100.0%")
            .count(),
        2,
        "{err}"
    );
}

#[test]
fn the_limit_holds_with_thread_caches() {
    // Relaxed mode gives each thread a cache once two allocate; the limit is on segments.
    let (out, err) = run(
        true,
        &["threads"],
        &[
            ("GPUPOOL_REUSE", "relaxed"),
            ("GPUPOOL_LIMIT", "64MiB"),
            ("GPUPOOL_SUMMARY", "stderr"),
        ],
    );
    // One thread alone filled the limit at some point (the other had freed its blocks).
    assert!(number::<u64>(&out, "held_max") <= 64 * MIB, "{out}");
    assert!(number::<u64>(&out, "held_max") >= 32 * MIB, "{out}");
    assert!(err.contains("   limit 64.0 MiB (peak reserved "), "{err}");
    let peak = err
        .lines()
        .find(|l| l.contains("reserved (from driver)"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(peak.contains("64.0 MiB"), "{peak}");
    assert!(
        err.contains("thread cache"),
        "thread caches did not serve:\n{err}"
    );
}

#[test]
fn a_replay_answers_whether_a_job_fits_under_a_limit() {
    let dir = support::scratch("limit-replay");
    let tool = support::trace_tool();
    let replay = |args: &[&str]| -> String {
        let (out, _) = ok(std::process::Command::new(&tool).arg("replay").args(args));
        out
    };
    // Recorded under a limit: the replay takes the limit from the trace and the same decisions.
    let limited = dir.join("limited.trace");
    let t = limited.to_str().unwrap();
    run(
        true,
        &["limit", "256"],
        &[("GPUPOOL_LIMIT", "1GiB"), ("GPUPOOL_TRACE", t)],
    );
    let out = replay(&[t]);
    assert!(
        out.contains(&format!("peak reserved 1.00 GiB ({GIB} bytes)")),
        "{out}"
    );
    assert!(out.contains("\n  limit 1.00 GiB: "), "{out}");
    assert!(!out.contains("diverged"), "{out}");
    // Recorded without one (8 GiB at the peak): would it fit in 4 GiB, in 9 GiB?
    let free = dir.join("free.trace");
    let t = free.to_str().unwrap();
    run(true, &["info"], &[("GPUPOOL_TRACE", t)]);
    let failed = |text: &str| -> u64 {
        let at = text.find("requests that failed ").expect("failed count") + 21;
        text[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let small = replay(&[t, "--limit", "4GiB"]);
    assert!(failed(&small) > 0, "{small}");
    assert!(small.contains("peak reserved 4.00 GiB"), "{small}");
    let enough = replay(&[t, "--limit", "9GiB"]);
    assert_eq!(failed(&enough), 0, "{enough}");
    let _ = std::fs::remove_dir_all(&dir);
}
