//! The `always:` summary of processes the pool never served: no CUDA, a disabled pool, no
//! allocation, every allocation passed through.

use super::*;

#[test]
fn always_reports_a_process_without_cuda_as_not_intercepted() {
    let dir = scratch("report-always");
    let path = dir.join("true.json");
    let dest = format!("always:{}", path.display());
    let (pid, out, err) = run_ok(Path::new("/bin/true"), &[], &[("GPUPOOL_SUMMARY", &dest)]);
    assert!(out.is_empty() && err.is_empty(), "{out}{err}");
    let v = read_json(&path);
    assert_eq!(v["intercepted"], Value::Bool(false), "{v}");
    assert_eq!(u(&v, "/pid"), u64::from(pid));
    assert!(v["devices"].as_array().unwrap().is_empty());
    let reason = v["reason"].as_str().unwrap();
    assert!(reason.contains("no CUDA runtime was loaded"), "{reason}");
    // The text form: one line on stderr.
    let (pid, out, err) = run_ok(
        Path::new("/bin/true"),
        &[],
        &[("GPUPOOL_SUMMARY", "always:stderr")],
    );
    assert!(out.is_empty(), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("gpupool summary   pid {pid}: ")),
        "{err}"
    );
    assert!(
        err.contains("no CUDA allocations were intercepted: no CUDA runtime was loaded"),
        "{err}"
    );
}

/// With the pool disabled, `always:` still gives its one line, saying so; a plain destination
/// prints nothing.
#[test]
fn always_reports_a_disabled_pool() {
    let exe = c_program("churn");
    let (_, out, err) = run_ok(
        &exe,
        &["1", "50", "1"],
        &[
            ("GPUPOOL_SUMMARY", "always:stderr"),
            ("GPUPOOL_DISABLE", "1"),
        ],
    );
    assert!(out.contains("churn ok"), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(
            "no CUDA allocations were intercepted: the pool is disabled (GPUPOOL_DISABLE=1)"
        ),
        "{err}"
    );
    let (_, _, err) = run_ok(
        &exe,
        &["1", "50", "1"],
        &[("GPUPOOL_SUMMARY", "stderr"), ("GPUPOOL_DISABLE", "1")],
    );
    assert!(err.is_empty(), "{err}");
}

#[test]
fn always_reports_a_cuda_program_that_never_allocated_with_its_runtime() {
    let dir = scratch("report-noalloc");
    let simlib = Sim::get().simlib.display().to_string();
    // Only cudaGetDeviceCount (the pool never starts), then also cudaDeviceSynchronize (it does).
    for mode in ["count", "sync"] {
        let path = dir.join(format!("{mode}.json"));
        let dest = format!("always:{}", path.display());
        let (pid, out, err) = run_ok(
            &c_program("no_alloc"),
            &[mode],
            &[("GPUPOOL_SUMMARY", &dest)],
        );
        assert_eq!(out, "devices 1\n");
        assert!(err.is_empty(), "{err}");
        let v = read_json(&path);
        assert_eq!(v["intercepted"], Value::Bool(false), "{mode}: {v}");
        assert_eq!(u(&v, "/pid"), u64::from(pid));
        let reason = v["reason"]
            .as_str()
            .unwrap_or_else(|| panic!("{mode}: no reason in {v}"));
        assert!(
            reason.contains("a CUDA runtime was loaded")
                && reason.contains(&format!("{simlib}/libcudart.so")),
            "{mode}: {reason}"
        );
        // Without always:, nothing.
        let quiet = dir.join(format!("{mode}-quiet.json"));
        let (_, _, err) = run_ok(
            &c_program("no_alloc"),
            &[mode],
            &[("GPUPOOL_SUMMARY", quiet.to_str().unwrap())],
        );
        assert!(err.is_empty(), "{err}");
        assert!(!quiet.exists());
    }
}

/// A process that never allocated writes no trace: a file at the path (another process's trace,
/// a worker's parent's) keeps every byte, and none is created. `sync` starts the pool.
#[test]
fn a_process_that_never_allocated_leaves_the_trace_path_alone() {
    let dir = scratch("report-noalloc-trace");
    let earlier = b"GPTRACE1 another process's records".to_vec();
    for mode in ["count", "sync"] {
        let held = dir.join(format!("{mode}-held.trace"));
        std::fs::write(&held, &earlier).unwrap();
        let absent = dir.join(format!("{mode}-absent.trace"));
        for path in [&held, &absent] {
            let (_, out, err) = run_ok(
                &c_program("no_alloc"),
                &[mode],
                &[("GPUPOOL_TRACE", path.to_str().unwrap())],
            );
            assert_eq!(out, "devices 1\n");
            assert!(err.is_empty(), "{mode}: {err}");
        }
        assert_eq!(std::fs::read(&held).unwrap(), earlier, "{mode}");
        assert!(!absent.exists(), "{mode}: a trace was created");
    }
}

/// A program whose every allocation went to CUDA (its own memory pool current, or a stream being
/// captured) used CUDA: it writes its summary, at exit and periodically, and the summary names
/// what passed through, in each form.
#[test]
fn a_program_whose_every_allocation_passed_through_writes_its_summary() {
    let exe = c_program("passed_through");
    let dir = scratch("report-passed-through");
    let cases = [
        (
            "own-pool",
            "own_memory_pool",
            "served by the program's own memory pool",
        ),
        ("capture", "graph_capture", "captured into a CUDA graph"),
    ];
    // Three blocks of 1, 2 and 3 MiB.
    let (n, bytes) = (3, 6 * MIB);
    for (mode, reason, why) in cases {
        // `always:` too gets the whole summary, not the line for a process the pool never saw.
        for dest in ["stderr", "always:stderr"] {
            let (_, out, err) = run_ok(&exe, &[mode, "3"], &[("GPUPOOL_SUMMARY", dest)]);
            assert!(out.contains("passed_through ok"), "{mode}: {out}");
            let said = (figure(&out, "passed="), figure(&out, "passed_bytes="));
            assert_eq!(said, (n, bytes), "{mode}");
            let line = format!(
                " passed through to CUDA: {n} allocations ({}) {why}\n",
                human(bytes)
            );
            assert!(err.contains(&line), "{mode} {dest}: no {line:?} in:\n{err}");
            assert!(
                err.contains(" every allocation passed through to CUDA; the pool served none\n"),
                "{mode} {dest}: {err}"
            );
        }
        let json = dir.join(format!("{mode}.json"));
        let prom = dir.join(format!("{mode}.prom"));
        for path in [&json, &prom] {
            run_ok(
                &exe,
                &[mode, "3"],
                &[("GPUPOOL_SUMMARY", path.to_str().unwrap())],
            );
        }
        let v = read_json(&json);
        assert_eq!(v["intercepted"], Value::Bool(false), "{mode}: {v}");
        for (_, r, _) in cases {
            let want = if r == reason { (n, bytes) } else { (0, 0) };
            let got = (
                u(&v, &format!("/passed_through/{r}/allocations")),
                u(&v, &format!("/passed_through/{r}/bytes")),
            );
            assert_eq!(got, want, "{mode}: {r}");
        }
        let prom = std::fs::read_to_string(&prom).expect("the Prometheus summary");
        let sample = format!("gpupool_passed_through_allocations_total{{reason=\"{reason}\",");
        let line = prom.lines().find(|l| l.starts_with(&sample));
        assert_eq!(
            line.and_then(|l| l.rsplit(' ').next()),
            Some(n.to_string().as_str()),
            "{mode}:\n{prom}"
        );
    }
    // While it runs, the periodic summary too: several whole summaries on stderr.
    let (_, _, err) = run_ok(
        &exe,
        &["own-pool", "2", "1000"],
        &[
            ("GPUPOOL_SUMMARY", "stderr"),
            ("GPUPOOL_SUMMARY_INTERVAL", "100ms"),
        ],
    );
    let summaries = err
        .matches(" passed through to CUDA: 2 allocations ")
        .count();
    assert!(summaries >= 2, "{summaries} summaries:\n{err}");
}

/// A program whose only request ran out of memory (200000 MiB on an 80 GiB device) reached
/// the pool, which printed its out-of-memory report: it writes its summary, which counts the
/// error returned, rather than nothing (or, with `always:`, a line saying that no `cudaMalloc`
/// reached the pool). In classic and expandable segments.
#[test]
fn a_program_whose_only_request_ran_out_of_memory_writes_its_summary() {
    let dir = scratch("report-only-oom");
    for expandable in ["0", "1"] {
        let path = dir.join(format!("expandable-{expandable}.json"));
        let (_, out, err) = run_ok(
            &c_program("requests"),
            &["200000"],
            &[
                ("GPUPOOL_EXPANDABLE", expandable),
                ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
            ],
        );
        assert!(out.contains("200000 MiB -> 2\n"), "{out}");
        assert!(err.contains("out of memory on device 0"), "{err}");
        assert!(path.exists(), "expandable {expandable}: no summary written");
        let v = read_json(&path);
        assert_eq!(v["intercepted"], Value::Bool(true), "{v}");
        let d = &v["devices"][0];
        assert_eq!(u(d, "/allocations"), 0, "{d}");
        assert_eq!(u(d, "/out_of_memory/returned"), 1, "{d}");

        let (_, _, err) = run_ok(
            &c_program("requests"),
            &["200000"],
            &[
                ("GPUPOOL_EXPANDABLE", expandable),
                ("GPUPOOL_SUMMARY", "always:stderr"),
            ],
        );
        assert!(
            !err.contains("no CUDA allocations were intercepted"),
            "{err}"
        );
        assert!(err.contains(", 1 returned to the program"), "{err}");
    }
}
