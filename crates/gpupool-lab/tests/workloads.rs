//! Every generated workload replays correctly under every policy of the comparison: blocks
//! aligned, inside their policy's segments and never overlapping a live block; every free
//! matching an allocation; allocated + cached = reserved throughout; nothing left at the end —
//! uncapped and under a capacity that makes them fail some requests. And a generated trace reads
//! back as the same requests, and replays to the figures it recorded.

use gpupool::pool::replay::{replay, Overrides};
use gpupool::pool::trace::parse;
use gpupool::pool::ReuseWait;
use gpupool_lab::policies::{lineup, run, run_checked, RecordedOoms};
use gpupool_lab::workloads::{self, record, Kind, Op, Workload, MIB};

/// Small versions of every workload, so the checked replays stay fast in debug builds.
fn small() -> Vec<Workload> {
    [
        Kind::Training { steps: 2 },
        Kind::Inference { requests: 12 },
        Kind::Random {
            max_size: MIB,
            ops: 3000,
        },
        Kind::Random {
            max_size: 64 * MIB,
            ops: 3000,
        },
        Kind::Random {
            max_size: 1024 * MIB,
            ops: 1000,
        },
    ]
    .into_iter()
    .map(|k| k.generate(11))
    .collect()
}

#[test]
fn every_policy_replays_every_workload_consistently() {
    for w in small() {
        let peak = w.peak_requested();
        // Under the workload's own cap (RMM's 16 GiB) or a tight one: out-of-memory recovery
        // paths run too.
        let tight = w.capacity.unwrap_or(peak + peak / 20);
        for capacity in [None, Some(tight)] {
            for mut p in lineup(256 * MIB, capacity) {
                let o = run_checked(p.as_mut(), &w).unwrap_or_else(|e| panic!("{}: {e}", w.name));
                assert_eq!(o.requests, w.requests());
                if capacity.is_none() {
                    assert_eq!(o.ooms, 0, "{}: {}", w.name, o.policy);
                    assert!(
                        o.counters.peak_reserved >= peak,
                        "{}: {} reserved less than the program held",
                        w.name,
                        o.policy
                    );
                } else {
                    assert!(o.counters.peak_reserved <= tight, "{}", o.policy);
                }
                assert!(o.counters.mallocs >= 1);
            }
        }
    }
}

#[test]
fn timed_and_checked_replays_agree() {
    let w = Kind::Inference { requests: 6 }.generate(5);
    for (mut a, mut b) in lineup(64 * MIB, None)
        .into_iter()
        .zip(lineup(64 * MIB, None))
    {
        let x = run(a.as_mut(), &w);
        let y = run_checked(b.as_mut(), &w).unwrap();
        assert_eq!(x.counters, y.counters, "{}", x.policy);
    }
}

#[test]
fn no_cache_reserves_exactly_what_is_live_and_calls_the_driver_every_time() {
    let w = Kind::Training { steps: 1 }.generate(1);
    let mut p = lineup(u64::MAX, None).pop().unwrap();
    assert_eq!(p.name(), "no cache");
    let o = run(p.as_mut(), &w);
    assert_eq!(o.counters.mallocs, w.requests());
    assert_eq!(o.counters.frees, w.requests());
    // 512-byte rounding only.
    let rounded_peak = o.counters.peak_reserved;
    assert!(
        rounded_peak >= w.peak_requested()
            && rounded_peak < w.peak_requested() + 512 * w.slots as u64
    );
}

/// A request the recorded run failed replays, under every policy and checked, as an
/// allocation freed at once at its place: the same figures, uncapped and capped. It never
/// counts as held. Made at the program's peak, for a tenth of it, every policy serves it
/// uncapped and fails it under a cap 5% above the peak.
#[test]
fn a_recorded_failure_replays_as_a_request_freed_at_once() {
    let base = Kind::Training { steps: 1 }.generate(3);
    let peak = base.peak_requested();
    let (at, _) = base
        .requested_over_time()
        .find(|&(_, held)| held == peak)
        .unwrap();
    let (at, size, slot) = (at + 1, peak / 10, base.slots);
    let mut failed = base.clone();
    failed.ops.insert(at, Op::RecordedOom { size });
    let mut freed_at_once = base.clone();
    freed_at_once.slots += 1;
    let free = Op::Free {
        slot,
        need: ReuseWait::Nothing,
        how: Default::default(),
    };
    freed_at_once
        .ops
        .splice(at..at, [Op::Alloc { slot, size }, free]);
    assert_eq!(failed.peak_requested(), peak);
    assert_eq!(failed.requests(), base.requests() + 1);
    for capacity in [None, Some(peak + peak / 20)] {
        let pairs = lineup(256 * MIB, capacity)
            .into_iter()
            .zip(lineup(256 * MIB, capacity));
        for (mut p, mut q) in pairs {
            let o = run_checked(p.as_mut(), &failed).unwrap_or_else(|e| panic!("{e}"));
            let like = run_checked(q.as_mut(), &freed_at_once).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(o.counters, like.counters, "{} at {capacity:?}", o.policy);
            assert_eq!(o.ooms + o.recorded_ooms.failed, like.ooms, "{}", o.policy);
            let expected = match capacity {
                None => RecordedOoms {
                    served: 1,
                    failed: 0,
                },
                Some(_) => RecordedOoms {
                    served: 0,
                    failed: 1,
                },
            };
            assert_eq!(o.recorded_ooms, expected, "{}", o.policy);
        }
    }
}

#[test]
fn generated_traces_read_back_as_the_same_requests_and_replay_exactly() {
    for w in small().into_iter().take(3) {
        let bytes = record::to_trace(&w);
        assert_eq!(bytes, record::to_trace(&w), "deterministic bytes");
        let records = parse(&bytes).unwrap();
        let back = workloads::from_records(&records, "t");
        assert_eq!(back.len(), 1);
        let (device, got) = &back[0];
        assert_eq!(*device, 0);
        let shape = |w: &Workload| -> Vec<(bool, u64)> {
            w.ops
                .iter()
                .map(|o| match *o {
                    Op::Alloc { size, .. } => (true, size),
                    _ => (false, 0),
                })
                .collect()
        };
        assert_eq!(shape(got), shape(&w), "{}", w.name);
        // The replay with the recorded settings takes the recorded decisions.
        let r = replay(&records, &Overrides::default());
        assert_eq!(r.len(), 1);
        assert!(!r[0].diverged, "{}", w.name);
        let mut ours = lineup(u64::MAX, None).swap_remove(0);
        let o = run(ours.as_mut(), &w);
        assert_eq!(
            r[0].stats.reserved.peak_ever(),
            o.counters.peak_reserved,
            "{}",
            w.name
        );
        assert_eq!(r[0].stats.real_mallocs, o.counters.mallocs, "{}", w.name);
    }
}

fn tool(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gpupool-trace"))
        .args(args)
        .output()
        .expect("gpupool-trace runs")
}

#[test]
fn the_tool_generates_and_compares() {
    let dir = std::env::temp_dir().join(format!("gpupool-workloads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("inference.trace");
    let t = trace.to_str().unwrap();
    let out = tool(&["generate", "inference:3", "--seed", "2", "--out", t]);
    assert!(out.status.success(), "{out:?}");
    let stats = tool(&["stats", t]);
    assert!(String::from_utf8_lossy(&stats.stdout).contains("0 failed"));
    let out = tool(&[
        "compare",
        "training:1",
        t,
        "--min-time",
        "0",
        "--svg-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for policy in [
        "| gpupool |",
        "| gpupool, expandable |",
        "| PyTorch rules |",
        "| PyTorch expandable |",
        "| exact-size cache |",
        "| no cache |",
    ] {
        assert_eq!(text.matches(policy).count(), 2, "{policy}\n{text}");
    }
    assert!(
        text.contains("gpupool peak reserved vs PyTorch rules"),
        "{text}"
    );
    // No request failed in a generated workload: no word of recorded failures.
    assert!(!text.contains("recorded OOMs"), "{text}");
    assert!(
        text.contains("| training:1 | ") && text.contains("expandable ÷ peak requested"),
        "{text}"
    );
    for svg in ["training-1.svg", "inference-trace--device-0.svg"] {
        let s = std::fs::read_to_string(dir.join(svg)).unwrap_or_else(|e| panic!("{svg}: {e}"));
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
    }
    for bad in [
        &["generate", "training:0"][..],
        &["generate", "nonsense"],
        &["compare", "random:1MiB:5:6"],
        &["compare", "/nonexistent/trace"],
        &["compare", "training", "--seed", "x"],
    ] {
        let out = tool(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
        assert!(!out.stderr.is_empty());
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The trace recorded on an H200 (`bench/traces/`): read back as the program's requests and
/// replayed correctly under every policy, uncapped and under a cap that makes them fail.
#[test]
fn the_trace_recorded_on_a_gpu_replays_correctly_under_every_policy() {
    // The repository's bench/, two folders above this crate.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../bench/traces/h200-torch-train.trace.gz");
    let out = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(&path)
        .output()
        .expect("gzip runs");
    assert!(out.status.success(), "gzip -dc {}", path.display());
    let records = parse(&out.stdout).unwrap();
    let mut back = workloads::from_records(&records, "h200");
    assert_eq!(back.len(), 1, "one device");
    let w = &mut back[0].1;
    assert_eq!(w.requests(), 25_530);
    // The program exited with three tensors alive; free them, as its exit did.
    let mut live = std::collections::BTreeSet::new();
    for op in &w.ops {
        match *op {
            Op::Alloc { slot, .. } => {
                live.insert(slot);
            }
            Op::Free { slot, .. } => {
                live.remove(&slot);
            }
            _ => {}
        }
    }
    assert_eq!(live.len(), 3);
    w.ops.extend(live.into_iter().map(|slot| Op::Free {
        slot,
        need: gpupool::pool::ReuseWait::Fence,
        how: Default::default(),
    }));
    let w = &*w;
    let peak = w.peak_requested();
    for capacity in [None, Some(peak + peak / 20)] {
        for mut p in lineup(1 << 30, capacity) {
            let name = p.name().to_string();
            let o = run_checked(p.as_mut(), w).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(o.requests, w.requests());
            if capacity.is_none() {
                assert_eq!(o.ooms, 0, "{}", o.policy);
                assert!(o.counters.peak_reserved >= peak, "{}", o.policy);
            }
        }
    }
}
