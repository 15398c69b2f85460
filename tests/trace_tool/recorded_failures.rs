//! `gpupool-trace compare` on a trace whose run failed out of memory: how many requests failed,
//! and which policies would have served them.

use super::*;

/// `tests/c/oom_advice.c fragment` under classic segments (`GPUPOOL_EXPANDABLE=0`) with
/// `GPUPOOL_LIMIT=1100MiB`, recorded once per test process. A 1 GiB block is freed and carved
/// into forty 24 MiB blocks, every other one freed, then 100 MiB asked. The pool's one segment
/// holds 544 MiB free in pieces, and the limit refuses a second: out of memory.
fn fragmented_trace() -> &'static Path {
    static TRACE: OnceLock<PathBuf> = OnceLock::new();
    TRACE.get_or_init(|| {
        let trace = scratch("trace-tool-recorded-failures").join("fragmented.trace");
        let env = [
            ("CUDASIM_MEM", "1400MiB"),
            ("GPUPOOL_EXPANDABLE", "0"),
            ("GPUPOOL_LIMIT", "1100MiB"),
        ];
        let stdout = record_trace("oom_advice", &["fragment"], &env, &trace);
        assert!(stdout.starts_with("big oom\n"), "{stdout}");
        trace
    })
}

/// The last two cells of `policy`'s row: its recorded failures served / failed, uncapped and
/// under the cap.
fn recorded_cells<'a>(out: &'a str, policy: &str) -> [&'a str; 2] {
    let row = out
        .lines()
        .find(|l| l.starts_with(&format!("| {policy} |")))
        .unwrap_or_else(|| panic!("no {policy:?} row in\n{out}"));
    let cells: Vec<&str> = row.trim_end_matches(" |").split(" | ").collect();
    [cells[cells.len() - 2], cells[cells.len() - 1]]
}

/// The 100 MiB request the program got out-of-memory for stays in the comparison. Under the
/// limit the trace recorded, classic segments (ours and the PyTorch rules) fail it again, and
/// expandable segments (ours and PyTorch's) serve it; uncapped, or on a 2 GiB device, every
/// policy serves it. The program's peak requested stays the 1 GiB it held.
#[test]
fn compare_says_which_policies_serve_the_requests_that_failed() {
    let t = fragmented_trace().to_str().unwrap();
    let out = String::from_utf8(tool_ok(&["compare", t, "--min-time", "0"])).unwrap();
    for text in [
        "42 requests, ",
        "peak requested 1.00 GiB.",
        "1 request failed out of memory in the recorded run.",
        "uncapped and at 1.07 GiB (the limit the trace recorded, `GPUPOOL_LIMIT`)",
        "| recorded OOMs served / failed | recorded OOMs at 1.07 GiB served / failed |",
    ] {
        assert!(out.contains(text), "no {text:?} in\n{out}");
    }
    for (policy, capped) in [
        ("gpupool", "0 / 1"),
        ("PyTorch rules", "0 / 1"),
        ("gpupool, expandable", "1 / 0"),
        ("PyTorch expandable", "1 / 0"),
    ] {
        assert_eq!(
            recorded_cells(&out, policy),
            ["1 / 0", capped],
            "{policy}\n{out}"
        );
    }

    let roomy = String::from_utf8(tool_ok(&[
        "compare",
        t,
        "--capacity",
        "2GiB",
        "--min-time",
        "0",
    ]))
    .unwrap();
    assert!(
        roomy.contains("uncapped and at 2.00 GiB (`--capacity`)"),
        "{roomy}"
    );
    for policy in ["gpupool", "PyTorch rules", "no cache"] {
        assert_eq!(
            recorded_cells(&roomy, policy),
            ["1 / 0", "1 / 0"],
            "{policy}\n{roomy}"
        );
    }
}
