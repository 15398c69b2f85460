//! The out-of-memory report: advice that fits the situation, numbers named once per situation.

use super::*;

/// The advice of the out-of-memory report follows the situation: no split cap already in
/// force or above the pieces it means to protect, and no blame on other allocators for the CUDA
/// context.
#[test]
fn out_of_memory_advice_fits_the_situation() {
    let run = |mode: &str, env: &[(&str, &str)]| {
        let mut env = env.to_vec();
        let mem = if mode == "fragment" {
            "1400MiB"
        } else {
            "1GiB"
        };
        env.push(("CUDASIM_MEM", mem));
        // The advice for classic segments' packing: expandable segments have none of it.
        if !env.iter().any(|(k, _)| *k == "GPUPOOL_EXPANDABLE") {
            env.push(("GPUPOOL_EXPANDABLE", "0"));
        }
        let (_, out, err) = run_ok(&c_program("oom_advice"), &[mode], &env);
        assert!(out.ends_with("oom advice ok\n"), "{mode}: {out}");
        (out, err)
    };
    let advice = |mode: &str, env: &[(&str, &str)]| {
        let (_, err) = run(mode, env);
        let start = err
            .find("  you can ")
            .unwrap_or_else(|| panic!("{mode}: {err}"));
        err[start..].to_string()
    };
    // Free memory in 24 MiB pieces of a 1 GiB block, a 100 MiB request: a cap of 64 MiB would
    // keep such a block whole for requests like it, for the next run.
    let (out, _) = run("fragment", &[]);
    assert!(out.starts_with("big oom\n"), "{out}");
    let a = advice("fragment", &[]);
    assert!(
        a.contains("in the next run, GPUPOOL_MAX_SPLIT_SIZE=64.0MiB keeps cached blocks"),
        "{a}"
    );
    // Taken, the advice works: the 24 MiB blocks leave the big block alone (it goes back to the
    // driver when they need room), and the request succeeds.
    let (out, err) = run("fragment", &[("GPUPOOL_MAX_SPLIT_SIZE", "64.0MiB")]);
    assert!(out.starts_with("big ok\n"), "{out}\n{err}");
    assert!(!err.contains("out of memory"), "{err}");
    // Memory taken outside the pool after it began is named, with its size.
    let a = advice("outside", &[]);
    assert!(
        a.contains("memory used outside this pool grew by 600 MiB since its first segment"),
        "{a}"
    );
    assert!(
        a.contains("free tensors the program no longer needs"),
        "{a}"
    );
    // The driver's refusals count among its calls, and the summary says how many there were
    // (else more calls than segments go unexplained).
    let (_, err) = run("outside", &[("GPUPOOL_SUMMARY", "stderr")]);
    let line = err
        .lines()
        .find(|l| l.starts_with(" driver     cudaMalloc "))
        .unwrap_or_else(|| panic!("{err}"));
    let calls: u64 = line[" driver     cudaMalloc ".len()..]
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let segments = text_row(&err, "segments")[2].trim().parse::<u64>().unwrap();
    assert!(calls > segments, "{line}");
    assert!(
        line.contains(&format!(", {} refused (", calls - segments)),
        "{line}"
    );
    // The CUDA context alone (300 MiB in the simulator) is not blamed, and counts against what
    // the program's blocks can have: 64 MiB live and 900 MiB asked do not fit beside it.
    let a = advice("context", &[]);
    assert!(!a.contains("outside this pool"), "{a}");
    assert!(
        a.starts_with("  you can    the program's live allocations alone do not fit"),
        "{a}"
    );
}

#[test]
fn out_of_memory_report_names_the_numbers_once_per_situation() {
    let (_, out, err) = run_ok(
        &c_program("oom_report"),
        &[],
        &[("CUDASIM_MEM", "1GiB"), ("CUDASIM_CONTEXT_BYTES", "0")],
    );
    assert_eq!(out, "oom report ok\n");
    // 800 MiB three times and 900 MiB once: one device, one order of magnitude (both in
    // [512 MiB, 1 GiB)), one situation, one report.
    assert_eq!(err.matches("out of memory on device").count(), 1, "{err}");
    let first = err.lines().next().unwrap();
    assert_eq!(
        first,
        format!(
            "gpupool: out of memory on device 0: cudaMalloc of 800 MiB ({} bytes) failed",
            800 * MIB
        )
    );
    let line = |key: &str| {
        err.lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no {key:?} line in:\n{err}"))
    };
    // Ten 60 MiB blocks, two freed and released at the out-of-memory: 480 MiB reserved, all of
    // it allocated; 544 MiB free, nothing used outside the pool (no context).
    assert!(
        line("device ").starts_with(
            "  device     1.00 GiB total, 544 MiB free when it failed; 0 B used outside this pool"
        ),
        "{err}"
    );
    assert!(
        line("the pool ").starts_with(
            "  the pool   reserves 480 MiB: 480 MiB allocated to the program (480 MiB requested), 0 B cached"
        ),
        "{err}"
    );
    assert!(
        line("it tried ").contains("released 120 MiB of cached segments to the driver"),
        "{err}"
    );
    // The 800 MiB request lacked more than the 424 MiB the device had free: the pool mapped
    // nothing for it (it would have filled the device, then given it back), so the peak is
    // the blocks' own.
    assert!(
        line("peak ").starts_with(
            "  peak       600 MiB allocated at most, 600 MiB reserved at most; 8 live blocks now"
        ),
        "{err}"
    );
    // Live blocks plus the request exceed the device: the advice says so, and nothing about
    // the reuse mode (nothing awaits in-flight work once the pool fenced).
    assert!(
        line("you can ").starts_with(
            "  you can    the program's live allocations alone do not fit: smaller batches"
        ),
        "{err}"
    );
    assert!(!err.contains("GPUPOOL_REUSE"), "{err}");
    // The report is the whole of stderr: the runtime's answer needs no other message.
    assert!(
        err.lines()
            .all(|l| l.starts_with("gpupool: out of memory") || l.starts_with("  ")),
        "{err}"
    );
    // Another order of magnitude is another situation: one more report (for its first request).
    let (_, _, err) = run_ok(
        &c_program("oom_report"),
        &["larger"],
        &[("CUDASIM_MEM", "1GiB"), ("CUDASIM_CONTEXT_BYTES", "0")],
    );
    let heads: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("gpupool: out of memory"))
        .collect();
    assert_eq!(
        heads,
        [
            "gpupool: out of memory on device 0: cudaMalloc of 800 MiB (838860800 bytes) failed",
            "gpupool: out of memory on device 0: cudaMalloc of 2.00 GiB (2147483648 bytes) failed"
        ],
        "{err}"
    );
    // The second finds nothing left to release, and a request no device of this size holds.
    assert_eq!(
        err.matches("released 0 B of cached segments").count(),
        1,
        "{err}"
    );
    assert!(
        err.contains(
            "  you can    the request alone is larger than the device's 1.00 GiB: split it"
        ),
        "{err}"
    );
    // And it is on stderr even with a summary elsewhere; the summary counts the errors.
    let dir = scratch("report-oom");
    let path = dir.join("oom.json");
    let (_, _, err) = run_ok(
        &c_program("oom_report"),
        &[],
        &[
            ("CUDASIM_MEM", "1GiB"),
            ("CUDASIM_CONTEXT_BYTES", "0"),
            ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
        ],
    );
    assert_eq!(err.matches("out of memory on device").count(), 1, "{err}");
    let v = read_json(&path);
    let d = &v["devices"][0];
    assert_eq!(u(d, "/out_of_memory/returned"), 4, "{d}");
    assert_eq!(u(d, "/released/out_of_memory_bytes"), 120 * MIB, "{d}");
    assert_eq!(u(d, "/allocations"), 10);
    assert_eq!(u(d, "/frees"), 10);
    assert_eq!(u(d, "/memory/total_bytes"), GIB);
}

#[test]
fn every_out_of_memory_the_program_got_is_counted() {
    // `tests/c/hostile.c` asks for seven sizes near SIZE_MAX and gets cudaErrorMemoryAllocation
    // for each: those whose rounding would overflow as well as those the driver refuses.
    let dir = scratch("report-oom-count");
    let path = dir.join("summary.json");
    let (_, out, _) = run_ok(
        &c_program("hostile"),
        &[],
        &[("GPUPOOL_SUMMARY", path.to_str().unwrap())],
    );
    assert!(out.contains("hostile ok"), "{out}");
    let v = read_json(&path);
    assert_eq!(u(&v, "/devices/0/out_of_memory/returned"), 7, "{v}");
}

/// The pool runs out of memory (the simulator refuses its three tries), and CUDA's own try then
/// serves the request: the program got its memory, so the summary counts a recovery and an
/// allocation CUDA served, and no out-of-memory returned to the program. Through each way in
/// that can run out: `cudaMalloc`, `cudaMallocPitch`, `cudaMallocAsync`, `cuMemAlloc_v2`,
/// `cuMemAllocAsync`.
#[test]
fn a_request_cuda_serves_after_the_pool_ran_out_is_no_out_of_memory_returned() {
    let dir = scratch("report-oom-cuda-serves");
    for mode in ["runtime", "pitch", "async", "driver", "driver_async"] {
        let path = dir.join(format!("{mode}.json"));
        let (_, out, err) = run_ok(
            &c_program("oom_cuda_serves"),
            &[mode],
            &[
                (
                    "CUDASIM_FAIL",
                    "cuMemAlloc_v2@1=2,cuMemAlloc_v2@2=2,cuMemAlloc_v2@3=2",
                ),
                ("GPUPOOL_EXPANDABLE", "0"),
                ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
            ],
        );
        assert!(out.ends_with("oom_cuda_serves ok\n"), "{mode}: {out}");
        assert!(!err.contains("out of memory on device"), "{mode}: {err}");
        let v = read_json(&path);
        let d = &v["devices"][0];
        let oom = (
            u(d, "/out_of_memory/retries"),
            u(d, "/out_of_memory/recovered"),
            u(d, "/out_of_memory/returned"),
        );
        assert_eq!(oom, (1, 1, 0), "{mode}: {d}");
        let after = "/passed_through/after_out_of_memory";
        assert_eq!(u(&v, &format!("{after}/allocations")), 1, "{mode}: {v}");
        assert!(u(&v, &format!("{after}/bytes")) >= MIB, "{mode}: {v}");
    }
}

/// Expandable segments under `GPUPOOL_LIMIT=101MiB`, on a device with 100 MiB free (400 MiB,
/// 300 MiB of context): a request of 97 MiB beside a 4 MiB block gets no whole granule under
/// the limit, and then the driver refuses the 97 MiB segment the limit allows. The device
/// lacks the memory, so the report does not blame the limit (nor say "the driver may have the
/// memory"). A request the limit alone refuses (99 MiB: 4 + 99 > 101) still names it. What the
/// pool tried names the segment the driver refused.
#[test]
fn an_out_of_memory_the_driver_refused_is_not_blamed_on_the_limit() {
    let blamed = "the pool's limit refused it";
    let asked = "then asked the driver for a 97.0 MiB segment";
    for (size, limit_refused) in [("97", false), ("99", true)] {
        let (_, out, err) = run_ok(
            &c_program("requests"),
            &["4", size],
            &[("CUDASIM_MEM", "400MiB"), ("GPUPOOL_LIMIT", "101MiB")],
        );
        assert!(out.contains(&format!("{size} MiB -> 2\n")), "{out}");
        assert!(err.contains("out of memory on device 0"), "{err}");
        assert_eq!(err.contains(blamed), limit_refused, "{size} MiB:\n{err}");
        assert_eq!(err.contains(asked), !limit_refused, "{size} MiB:\n{err}");
    }
}

/// With expandable segments the limit refuses granules to map, not segments: the summary's
/// device line and the replay of the trace count the refusals as times the limit refused
/// memory (`GPUPOOL_LIMIT=512MiB`, one request of 600 MiB, which no segment served), as many
/// as the JSON's `limit_refusals`.
#[test]
fn limit_refusals_are_not_called_segments() {
    let dir = scratch("report-limit-refusals");
    let json = dir.join("s.json");
    let trace = dir.join("t.trace");
    let env = [("GPUPOOL_LIMIT", "512MiB")];
    let mut with = env.to_vec();
    with.push(("GPUPOOL_SUMMARY", json.to_str().unwrap()));
    with.push(("GPUPOOL_TRACE", trace.to_str().unwrap()));
    run_ok(&c_program("requests"), &["600"], &with);
    let refusals = u(&read_json(&json)["devices"][0], "/limit_refusals");
    assert!(refusals > 1, "{refusals}");
    let mut with = env.to_vec();
    with.push(("GPUPOOL_SUMMARY", "stderr"));
    let (_, _, err) = run_ok(&c_program("requests"), &["600"], &with);
    let line = err
        .lines()
        .find(|l| l.starts_with(" device 0 "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.ends_with(&format!("refused memory {refusals} times)")),
        "{line}"
    );
    let replay = Command::new(support::trace_tool())
        .arg("replay")
        .arg(&trace)
        .output()
        .expect("run gpupool-trace");
    let (out, _) = support::texts(&replay);
    assert!(
        out.contains(&format!("limit 512 MiB: refused memory {refusals} times")),
        "{out}"
    );
}
