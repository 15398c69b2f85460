//! `gpupool-trace` on hand-made traces: odd ones still give valid JSON and SVG, corrupt ones
//! exit 2 with a message, odd requests are refused or explained.

use super::*;

/// Encodes one record as the library writes it.
#[allow(clippy::too_many_arguments)]
fn record(out: &mut Vec<u8>, t: u64, kind: u8, device: u8, a: u64, b: u64, c: u64, aux: u16) {
    for v in [t, a, b, c] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&7u32.to_le_bytes());
    out.push(kind);
    out.push(device);
    out.extend_from_slice(&aux.to_le_bytes());
}

#[test]
fn odd_traces_still_give_valid_json_and_svg() {
    let dir = scratch("trace-tool-odd");
    // Every kind, extreme values, unknown reason codes, records at the same time, the last
    // device number, a cut-off last record, and a file name that needs escaping everywhere.
    let mut t = b"GPTRACE1".to_vec();
    for kind in 0..=14u8 {
        record(
            &mut t,
            1000 * u64::from(kind),
            kind,
            255,
            u64::MAX,
            u64::MAX,
            u64::MAX,
            999,
        );
    }
    record(&mut t, 14_000, 1, 255, 1, 2, 3, 0);
    record(&mut t, 0, 0, 0, u64::MAX, 0, u64::MAX, 0);
    record(&mut t, u64::MAX, 4, 0, 0, 1 << 20, 0, 0);
    t.extend_from_slice(&[1, 2, 3]);
    let name = "we\"ird <&> \\ 'name'\t\u{1}é.trace";
    let path = dir.join(name);
    std::fs::write(&path, &t).unwrap();
    let p = path.to_str().unwrap();

    let o = tool(&["perfetto", p]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cut-off record"));
    let events = parse_perfetto(&o.stdout);
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["otherData"]["source"], name);
    assert!(events.iter().any(|e| e["name"] == "device 255 reserved"));
    assert!(events
        .iter()
        .any(|e| e["name"] == "segment released" && e["args"]["reason"] == "unknown (999)"));

    let svg = dir.join("odd.svg");
    assert!(tool_ok(&["plot", p, svg.to_str().unwrap()]).is_empty());
    let doc = parse_svg(&svg);
    assert_eq!(doc["panels"], serde_json::json!(["device-0", "device-255"]));
    assert!(doc["title"]
        .as_str()
        .unwrap()
        .contains("we\"ird <&> \\ 'name'"));

    // A trace with no records at all.
    let empty = dir.join("empty.trace");
    std::fs::write(&empty, b"GPTRACE1").unwrap();
    let e = empty.to_str().unwrap();
    parse_perfetto(&tool_ok(&["perfetto", e]));
    let svg = dir.join("empty.svg");
    tool_ok(&["plot", e, svg.to_str().unwrap()]);
    let doc = parse_svg(&svg);
    assert_eq!(doc["panels"], serde_json::json!([]));
}

#[test]
fn corrupt_traces_exit_2_with_a_message() {
    let dir = scratch("trace-tool-corrupt");
    let good = std::fs::read(churn_trace()).unwrap();
    let mut unknown_kind = good.clone();
    unknown_kind[8 + 40 * 3 + 36] = 200;
    // 32 bytes of a chunk lost midway (a write that failed in part): what follows is shifted.
    let mut shifted = good[..8 + 40 * 100].to_vec();
    shifted.extend_from_slice(&good[8 + 40 * 100 + 32..]);
    // Two records of a device swapped: time goes back.
    let at = |i: usize| u64::from_le_bytes(good[8 + 40 * i..][..8].try_into().unwrap());
    let device = |i: usize| good[8 + 40 * i + 37];
    let i = (10..)
        .find(|&i| at(i) < at(i + 1) && device(i) == device(i + 1))
        .unwrap();
    let mut swapped = good.clone();
    let (a, b) = (8 + 40 * i, 8 + 40 * (i + 1));
    let first = swapped[a..b].to_vec();
    swapped.copy_within(b..b + 40, a);
    swapped[b..b + 40].copy_from_slice(&first);
    let gzipped = std::process::Command::new("gzip")
        .arg("-c")
        .arg(churn_trace())
        .output()
        .unwrap()
        .stdout;
    let cases: [(&str, Vec<u8>, &str); 8] = [
        ("empty", Vec::new(), "bad magic"),
        ("cut-header", b"GPTR".to_vec(), "cut short"),
        (
            "not-a-trace",
            b"PK\x03\x04 some zip file".to_vec(),
            "bad magic",
        ),
        ("unknown-kind", unknown_kind, "record 3: unknown kind 200"),
        ("shifted", shifted, "the trace is corrupt"),
        ("swapped", swapped, "time goes back"),
        ("gzipped", gzipped, "decompress it first"),
        ("missing", Vec::new(), "No such file"),
    ];
    for (name, bytes, why) in &cases {
        let path = dir.join(format!("{name}.trace"));
        if *name != "missing" {
            std::fs::write(&path, bytes).unwrap();
        }
        for cmd in ["stats", "replay", "perfetto", "plot"] {
            let out = dir.join(format!("{name}.{cmd}.out"));
            let o = tool(&[cmd, path.to_str().unwrap(), out.to_str().unwrap()]);
            let stderr = String::from_utf8_lossy(&o.stderr);
            if cmd == "stats" || cmd == "replay" {
                // These take no output file: the extra argument is the error.
                assert_eq!(o.status.code(), Some(2), "{cmd} {name}: {stderr}");
                continue;
            }
            assert_eq!(o.status.code(), Some(2), "{cmd} {name}: {stderr}");
            assert!(
                stderr.starts_with("gpupool-trace: ") && stderr.contains(why),
                "{cmd} {name}: {stderr}"
            );
            assert!(!stderr.contains("panicked"), "{stderr}");
            assert!(o.stdout.is_empty());
            assert!(!out.exists(), "{cmd} {name}: wrote {}", out.display());
        }
        for cmd in ["stats", "replay"] {
            let o = tool(&[cmd, path.to_str().unwrap()]);
            let stderr = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{cmd} {name}: {stderr}");
            assert!(
                stderr.contains(why) && !stderr.contains("panicked"),
                "{stderr}"
            );
        }
    }
    // A record cut off at the end (a process killed while writing) is left out, with a warning.
    let cut = dir.join("cut.trace");
    std::fs::write(&cut, &good[..good.len() - 17]).unwrap();
    let o = tool(&["plot", cut.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("warning"));
    // Usage errors.
    for args in [
        &[][..],
        &["plot"],
        &["draw", "x.trace"],
        &["plot", "x", "y", "z"],
    ] {
        let o = tool(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("usage:"));
    }
}

/// What the review of the trace tool found besides corrupt files: an output naming the trace
/// itself, an empty trace, a `--max-split` the library would refuse, workloads too large to
/// build in memory, sizes whose sums overflow, and a comparison with nothing to compare.
#[test]
fn odd_requests_are_refused_or_explained() {
    let dir = scratch("trace-tool-requests");
    let trace = dir.join("t.trace");
    std::fs::copy(churn_trace(), &trace).unwrap();
    let t = trace.to_str().unwrap();
    let before = std::fs::read(&trace).unwrap();
    // The same file by its path, and through a hard link (whose name alone would pass the
    // check, and the plot would replace the trace).
    let hard = dir.join("hard.trace");
    std::fs::hard_link(&trace, &hard).unwrap();
    for cmd in ["plot", "perfetto"] {
        for out in [t, hard.to_str().unwrap()] {
            let o = tool(&[cmd, t, out]);
            assert_eq!(o.status.code(), Some(2), "{cmd} {out}");
            assert!(String::from_utf8_lossy(&o.stderr).contains("is the trace itself"));
        }
    }
    assert_eq!(
        std::fs::read(&trace).unwrap(),
        before,
        "the trace was overwritten"
    );

    let empty = dir.join("empty.trace");
    std::fs::write(&empty, b"GPTRACE1").unwrap();
    let e = empty.to_str().unwrap();
    assert!(String::from_utf8_lossy(&tool_ok(&["stats", e])).starts_with("no records"));
    assert!(String::from_utf8_lossy(&tool_ok(&["replay", e])).starts_with("no records"));

    let o = tool(&["replay", t, "--max-split", "1KiB"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("above 20MiB"));

    for spec in ["inference:10001", "training:10001", "random:1MiB:10000001"] {
        let o = tool(&["generate", spec]);
        assert_eq!(o.status.code(), Some(2), "{spec}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("bad count"),
            "{spec}"
        );
    }

    // `compare` on a hand-made trace of allocations of `sizes` bytes (its output).
    let compare_allocations = |name: &str, sizes: &[u64]| {
        let mut t = b"GPTRACE1".to_vec();
        record(&mut t, 0, 0, 0, u64::MAX, 256 << 20, u64::MAX, 2);
        for (i, &size) in sizes.iter().enumerate() {
            let i = i as u64 + 1;
            record(&mut t, i, 1, 0, size, i << 28, size, 0);
        }
        let path = dir.join(name);
        std::fs::write(&path, &t).unwrap();
        String::from_utf8_lossy(&tool_ok(&[
            "compare",
            path.to_str().unwrap(),
            "--min-time",
            "0",
        ]))
        .into_owned()
    };
    // Two allocations of 2^63 bytes: sums saturate instead of wrapping, and one of an
    // impossible size fails everywhere, so no percentage can be given.
    let out = compare_allocations("huge.trace", &[1 << 63, 1 << 63]);
    assert!(out.contains("peak requested 16384 PiB"), "{out}");
    for line in out.lines().filter(|l| l.starts_with("| gpupool |")) {
        // One served (8 EiB), one refused: never a wrapped sum.
        assert!(
            line.contains("| 8192 PiB |") && line.ends_with("|"),
            "{line}"
        );
    }
    let out = compare_allocations("max.trace", &[u64::MAX]);
    assert!(out.contains("| n/a | n/a (0 vs 0) |"), "{out}");
}

/// `--help` after any subcommand, a reader of stdout that stops early (`| head`), and
/// `--svg-dir` naming a directory still to be made.
#[test]
fn help_early_readers_and_new_plot_directories() {
    for args in [
        &["stats", "--help"][..],
        &["replay", "t.trace", "-h"],
        &["perfetto", "--help"],
        &["generate", "--help"],
        &["compare", "--help"],
    ] {
        let out = String::from_utf8_lossy(&tool_ok(args)).into_owned();
        assert!(out.starts_with("usage: gpupool-trace"), "{args:?}: {out}");
    }

    // perfetto's JSON of the churn trace is far larger than a pipe holds: the reader takes a
    // few bytes and goes away.
    let mut child = Command::new(support::trace_tool())
        .args(["perfetto", churn_trace().to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(first.starts_with(b"{"), "{first:?}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = scratch("trace-tool-svg-dir");
    let plots = dir.join("plots/new");
    tool_ok(&[
        "compare",
        "training:1",
        "--seed",
        "1",
        "--svg-dir",
        plots.to_str().unwrap(),
    ]);
    assert!(plots.join("training-1.svg").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A ratio over nothing is not given: a device that was asked for nothing is left out of
/// `compare`, and a trace of only such devices is refused as one without allocations; a
/// request of 0 bytes (peak requested 0) gives no "÷ peak requested"; a replay that allocated
/// nothing gives no "reserved/allocated". A device whose one request failed out of memory is
/// compared all the same: it held nothing, and that request is what its user asks about.
#[test]
fn ratios_over_nothing_are_not_given() {
    let dir = scratch("trace-tool-nothing");
    let settings = |t: &mut Vec<u8>, device: u8| {
        record(t, 0, 0, device, u64::MAX, 256 << 20, u64::MAX, 2);
    };
    let write = |name: &str, t: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, t).unwrap();
        path.to_str().unwrap().to_string()
    };
    let compare = |path: &str| tool(&["compare", path, "--min-time", "0"]);

    let mut t = b"GPTRACE1".to_vec();
    settings(&mut t, 0);
    settings(&mut t, 1);
    let none = write("none.trace", &t);
    let o = compare(&none);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("holds no allocations"));

    // Device 1 allocates and frees 1 MiB; device 0 nothing.
    record(&mut t, 1, 1, 1, 1 << 20, 1 << 28, 1 << 20, 0);
    record(&mut t, 2, 3, 1, 1 << 28, 0, 1 << 20, 0);
    let one = write("one.trace", &t);
    let o = compare(&one);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("one.trace, device 1"), "{out}");
    assert!(!out.contains("one.trace, device 0"), "{out}");

    let mut t = b"GPTRACE1".to_vec();
    settings(&mut t, 0);
    record(&mut t, 1, 1, 0, 0, 1 << 28, 512, 0);
    record(&mut t, 2, 3, 0, 1 << 28, 0, 512, 0);
    let zero = write("zero-bytes.trace", &t);
    let o = compare(&zero);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("peak requested 0 B"), "{out}");
    for line in out.lines().filter(|l| l.starts_with("| gpupool |")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        assert_eq!(cells[2], "n/a", "{line}");
    }
    let summary = out
        .lines()
        .find(|l| l.starts_with("| zero-bytes.trace, device 0 | +"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(summary.contains(" | n/a | "), "{summary}");
    let expandable = out
        .lines()
        .rfind(|l| l.starts_with("| zero-bytes.trace, device 0 |"))
        .unwrap();
    assert!(
        expandable.starts_with("| zero-bytes.trace, device 0 | n/a | n/a | n/a | n/a |"),
        "{expandable}"
    );

    // The one request, 1 TiB, failed live and fails again on a 1 GiB device.
    let mut t = b"GPTRACE1".to_vec();
    settings(&mut t, 0);
    record(&mut t, 1, 2, 0, 1 << 40, 2, 0, 0);
    let failed = write("failed.trace", &t);
    let out =
        String::from_utf8_lossy(&tool_ok(&["replay", &failed, "--capacity", "1GiB"])).into_owned();
    assert!(out.contains("reserved/allocated n/a"), "{out}");
    assert!(!out.contains("reserved/allocated 0.000"), "{out}");
    // `compare` keeps such a request, though the program held nothing: one of 2 GiB is served
    // uncapped and fails at 1 GiB.
    let mut t = b"GPTRACE1".to_vec();
    settings(&mut t, 0);
    record(&mut t, 1, 2, 0, 2 << 30, 2, 0, 0);
    let failed = write("failed-2GiB.trace", &t);
    let out = String::from_utf8_lossy(&tool_ok(&[
        "compare",
        &failed,
        "--capacity",
        "1GiB",
        "--min-time",
        "0",
    ]))
    .into_owned();
    assert!(
        out.contains("1 request, 1 operation; peak requested 0 B."),
        "{out}"
    );
    let row = out.lines().find(|l| l.starts_with("| gpupool |")).unwrap();
    assert!(row.ends_with(" | 1 / 0 | 0 / 1 |"), "{row}");
}

/// The usage asked for with `--help` or `help`, to a full disk or a reader already gone: one
/// line and exit 2 for the first, a quiet exit 0 for the second, never a panic.
#[test]
fn usage_to_a_full_disk_or_a_closed_pipe() {
    for args in [&["--help"][..], &["help"], &["plot", "-h"]] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = Command::new(support::trace_tool())
            .args(args)
            .stdout(full)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end(),
            "gpupool-trace: writing stdout: No space left on device (os error 28)",
            "{args:?}"
        );

        // A reader that has gone before the tool writes: the pipe's read end closed at once.
        let mut child = Command::new(support::trace_tool())
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{args:?}: {} {stderr}", o.status);
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

/// A trace whose expandable-segment record has a granule of 0 bytes, or a range no whole
/// number of granules, as no pool writes: every command refuses it as corrupt, with one line
/// and exit 2. A replay used to divide by the granule, or round the range past `u64::MAX`.
#[test]
fn impossible_expandable_granules_are_corrupt() {
    let dir = scratch("trace-tool-granules");
    for (name, granule, range) in [
        ("zero-granule", 0, 0),
        ("odd-granule", 3 << 20, 6 << 20),
        ("huge-range", 2 << 20, u64::MAX),
        ("no-range", 2 << 20, 0),
    ] {
        let mut t = b"GPTRACE1".to_vec();
        record(&mut t, 0, 0, 0, u64::MAX, 64 << 20, u64::MAX, 0);
        record(&mut t, 1, 16, 0, granule, range, 0, 0);
        record(&mut t, 2, 1, 0, 100 << 20, 1 << 30, 100 << 20, 0);
        let path = dir.join(format!("{name}.trace"));
        std::fs::write(&path, &t).unwrap();
        for cmd in ["stats", "replay", "perfetto", "plot"] {
            let o = tool(&[cmd, path.to_str().unwrap()]);
            let stderr = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{cmd} {name}: {stderr}");
            assert!(
                stderr.starts_with("gpupool-trace: ")
                    && stderr.contains(&format!(
                        "record 1: expandable segments of {range} B ranges in {granule} B granules"
                    ))
                    && stderr.lines().count() == 1,
                "{cmd} {name}: {stderr}"
            );
        }
    }
}

/// A trace whose live block is nearly `u64::MAX` bytes (a corrupt size), followed by a request
/// that maps granules under the mapped slack: `replay --slack` and `compare` (whose lineup has
/// a slack) finish. The slack's budget, the peak allocated plus its share, used to overflow.
#[test]
fn a_huge_live_block_leaves_the_slack_budget_finite() {
    let dir = scratch("trace-tool-slack-budget");
    let mut t = b"GPTRACE1".to_vec();
    record(&mut t, 0, 0, 0, u64::MAX, 256 << 20, u64::MAX, 2);
    record(&mut t, 0, 16, 0, 2 << 20, 160 << 30, 0, 0);
    record(&mut t, 1, 1, 0, 0xfd00_0000_0002_8356, 1 << 40, 0, 0);
    record(&mut t, 2, 1, 0, 4 << 20, 2 << 40, 4 << 20, 0);
    let path = dir.join("huge-live.trace");
    std::fs::write(&path, &t).unwrap();
    let p = path.to_str().unwrap();
    tool_ok(&["replay", p, "--slack", "4%"]);
    tool_ok(&["compare", p, "--min-time", "0"]);
}

/// A trace the replay cannot follow to the end (as one recorded by threads racing for a device
/// may be): the request that took the device's last granules left out, with its free. The
/// replay maps fewer granules than recorded and so reaches a lower peak reserved; it must say
/// that it diverged, not print the lower figures as the run's. Found by replaying traces of
/// `race 8 2 300 2 1 ob` under `GPUPOOL_LIMIT=300MiB`.
#[test]
fn a_replay_that_leaves_recorded_mappings_unplayed_says_it_diverged() {
    let dir = scratch("trace-tool-unplayed");
    let good = std::fs::read(churn_trace()).unwrap();
    let recs: Vec<&[u8]> = good[8..].chunks_exact(40).collect();
    let kind = |r: &[u8]| r[36];
    let device = |r: &[u8]| r[37];
    let word = |r: &[u8], i: usize| u64::from_le_bytes(r[8 + 8 * i..][..8].try_into().unwrap());
    let last_map = recs
        .iter()
        .rposition(|r| kind(r) == 19 && device(r) == 0)
        .expect("device 0 mapped granules");
    let alloc = (last_map..recs.len())
        .find(|&i| kind(recs[i]) == 1 && device(recs[i]) == 0)
        .unwrap();
    let free = (alloc..recs.len())
        .find(|&i| {
            kind(recs[i]) == 3 && device(recs[i]) == 0 && word(recs[i], 0) == word(recs[alloc], 1)
        })
        .unwrap();
    let mut t = b"GPTRACE1".to_vec();
    for (i, r) in recs.iter().enumerate() {
        if i != alloc && i != free {
            t.extend_from_slice(r);
        }
    }
    let path = dir.join("unplayed.trace");
    std::fs::write(&path, &t).unwrap();
    let recorded = stats(&path)[&0].peak_reserved;
    let replay = String::from_utf8(tool_ok(&["replay", path.to_str().unwrap()])).unwrap();
    let device0 = &replay[..replay.find("device 1:").unwrap()];
    assert!(
        device0.contains("diverged") || peak(device0, "peak reserved ").1 == recorded,
        "recorded peak reserved {recorded}:\n{replay}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A trace whose requests are of 2^63 bytes, as only a corrupt one holds: a block of that size
/// freed and asked for again, then a second one live beside it. Every `replay` and `compare`
/// finishes with its figures. The replay used to panic ('attempt to multiply with overflow' in
/// the fit, 'attempt to add with overflow' in the counters' totals): the model driver, uncapped,
/// serves what no device could, and twice the request, or the sum of the requests, passed
/// `u64::MAX`.
#[test]
fn requests_of_half_the_address_space_replay_without_overflow() {
    let dir = scratch("trace-tool-half-space");
    let half = 1u64 << 63;
    let mut t = b"GPTRACE1".to_vec();
    record(&mut t, 0, 0, 0, u64::MAX, 64 << 20, u64::MAX, 0);
    record(&mut t, 1, 1, 0, half, 1 << 40, half, 0);
    record(&mut t, 2, 3, 0, 1 << 40, 0, half, 0);
    record(&mut t, 3, 1, 0, half, 1 << 40, half, 0);
    record(&mut t, 4, 1, 0, half, 2 << 40, half, 0);
    let path = dir.join("half.trace");
    std::fs::write(&path, &t).unwrap();
    let p = path.to_str().unwrap();
    for extra in [
        &[][..],
        &["--one-stream"],
        &["--calls", "uncached"],
        &["--reuse", "relaxed"],
        &["--expandable", "off"],
    ] {
        let args: Vec<&str> = ["replay", p].iter().chain(extra).copied().collect();
        let out = String::from_utf8(tool_ok(&args)).unwrap();
        // The first request is served and reused; the model driver refuses a second 8 EiB.
        assert!(
            out.contains(&format!("peak allocated 8192 PiB ({half} bytes)")),
            "{extra:?}: {out}"
        );
    }
    let out = String::from_utf8(tool_ok(&["compare", p, "--min-time", "0"])).unwrap();
    assert!(out.contains("| gpupool |"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}
