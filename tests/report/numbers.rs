//! The summary's numbers: JSON, Prometheus and text checked number by number against what the
//! test program did.

use super::*;

#[test]
fn json_summary_of_two_threads_on_two_devices_counts_what_the_program_did() {
    let dir = scratch("report-json");
    let path = dir.join("summary.json");
    let (pid, out, err) = run_ok(
        &c_program("churn"),
        &["2", "600", "2", "9"],
        &[
            ("CUDASIM_DEVICES", "2"),
            ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
        ],
    );
    assert!(err.is_empty(), "{err}");
    let v = read_json(&path);
    assert_eq!(v["intercepted"], Value::Bool(true), "{v}");
    assert_eq!(u(&v, "/pid"), u64::from(pid));
    assert_eq!(v["rank"], "0");
    assert_eq!(v["reuse"], "strict");
    assert!(
        v["runtime"].as_str().unwrap().contains("libcudart.so"),
        "{v}"
    );
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{v}");
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(u(d, "/device"), i as u64);
        check_json_device_at_exit(d);
    }
    let sum = |p: &str| devices.iter().map(|d| u(d, p)).sum::<u64>();
    let program = figure(&out, "program mallocs");
    assert_eq!(sum("/allocations"), program);
    assert_eq!(sum("/frees"), program);
    assert_eq!(sum("/driver/mallocs"), figure(&out, "real mallocs"));
    assert_eq!(sum("/reserved_bytes/peak"), figure(&out, "peak real bytes"));
    // Device by device: the simulator sees only the pool's segments.
    let sim = churn_devices(&out);
    assert_eq!(sim.len(), 2, "{out}");
    for (d, (real, peak)) in devices.iter().zip(sim) {
        assert_eq!(u(d, "/driver/mallocs"), real, "{d}");
        assert_eq!(u(d, "/reserved_bytes/peak"), peak, "{d}");
    }
    // Only the summary was written: no temporary file left behind.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["summary.json"]);
}

/// Runs `python3 tests/prom_check.py FILE`: the reference parser's samples, by (sample name,
/// device label; for the process's samples, `reason=` and their reason label).
fn parse_prometheus(path: &Path) -> (Vec<Value>, BTreeMap<(String, String), Value>) {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(python)
        .arg(support::root().join("tests/prom_check.py"))
        .arg(path)
        .output()
        .expect("run python3 tests/prom_check.py");
    let (stdout, stderr) = support::texts(&out);
    assert!(
        out.status.success(),
        "the Prometheus parser rejected {} (is prometheus_client installed? scripts/test.sh \
         installs it):\n{stderr}\n--- file\n{}",
        path.display(),
        std::fs::read_to_string(path).unwrap_or_default()
    );
    let samples: Vec<Value> = serde_json::from_str(&stdout).expect("prom_check.py output");
    let mut by_name = BTreeMap::new();
    for s in &samples {
        let name = s["name"].as_str().unwrap().to_string();
        let labels = &s["labels"];
        if labels.get("le").is_some() {
            continue;
        }
        let device = match labels["reason"].as_str() {
            Some(reason) => format!("reason={reason}"),
            None => labels["device"].as_str().unwrap_or("").to_string(),
        };
        let old = by_name.insert((name.clone(), device.clone()), s["value"].clone());
        assert!(old.is_none(), "duplicate sample {name} device {device}");
    }
    (samples, by_name)
}

fn prom(map: &BTreeMap<(String, String), Value>, name: &str, device: u64) -> f64 {
    map.get(&(name.to_string(), device.to_string()))
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no sample {name}{{device=\"{device}\"}}"))
}

#[test]
fn one_thread_summary_gives_the_same_numbers_in_json_prometheus_and_text() {
    let dir = scratch("report-forms");
    let args = ["1", "1500", "2", "9"];
    let mut runs = BTreeMap::new();
    for ext in ["json", "prom", "txt"] {
        let path = dir.join(format!("summary.{ext}"));
        let (pid, out, err) = run_ok(
            &c_program("churn"),
            &args,
            &[
                ("CUDASIM_DEVICES", "2"),
                ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
            ],
        );
        assert!(err.is_empty(), "{err}");
        runs.insert(ext, (pid, out, path));
    }
    // One thread: the program and the pool's decisions are the same in every run.
    let out = &runs["json"].1;
    assert_eq!(runs["prom"].1, *out);
    assert_eq!(runs["txt"].1, *out);
    let program = figure(out, "program mallocs");
    let sim = churn_devices(out);
    assert_eq!(sim.len(), 2);

    // JSON.
    let v = read_json(&runs["json"].2);
    assert_eq!(u(&v, "/pid"), u64::from(runs["json"].0));
    assert_eq!(v["intercepted"], Value::Bool(true));
    let devices = v["devices"].as_array().unwrap().clone();
    assert_eq!(devices.len(), 2);
    for (d, (real, peak)) in devices.iter().zip(&sim) {
        check_json_device_at_exit(d);
        assert_eq!(u(d, "/driver/mallocs"), *real);
        assert_eq!(u(d, "/reserved_bytes/peak"), *peak);
        // One thread: the sample is exact, and the simulator's context is all there is outside.
        assert_eq!(u(d, "/memory/outside_pool_bytes"), 300 * MIB, "{d}");
    }
    assert_eq!(
        devices.iter().map(|d| u(d, "/allocations")).sum::<u64>(),
        program
    );

    // Prometheus, through the reference parser.
    let (samples, p) = parse_prometheus(&runs["prom"].2);
    let pid = runs["prom"].0.to_string();
    for s in &samples {
        assert_eq!(s["labels"]["pid"], pid.as_str(), "{s}");
        assert_eq!(s["labels"]["rank"], "0", "{s}");
        let name = s["name"].as_str().unwrap();
        assert!(name.starts_with("gpupool_"), "{s}");
        if name.ends_with("_total") {
            assert_eq!(s["type"], "counter", "{s}");
        }
    }
    let mut program_from_prom = 0.0;
    for (i, d) in devices.iter().enumerate() {
        let i = i as u64;
        let g = |name: &str| prom(&p, name, i);
        // Every figure the two forms share is the same number (times differ between runs).
        for (name, pointer) in [
            ("gpupool_requested_bytes", "/requested_bytes/current"),
            ("gpupool_requested_bytes_peak", "/requested_bytes/peak"),
            ("gpupool_allocated_bytes", "/allocated_bytes/current"),
            ("gpupool_allocated_bytes_peak", "/allocated_bytes/peak"),
            ("gpupool_reserved_bytes", "/reserved_bytes/current"),
            ("gpupool_reserved_bytes_peak", "/reserved_bytes/peak"),
            ("gpupool_cached_bytes", "/cached_bytes"),
            ("gpupool_pending_bytes", "/pending_bytes"),
            (
                "gpupool_largest_free_block_bytes",
                "/largest_free_block_bytes",
            ),
            ("gpupool_live_blocks", "/live_blocks/current"),
            ("gpupool_live_blocks_peak", "/live_blocks/peak"),
            ("gpupool_segments", "/segments/current"),
            ("gpupool_segments_peak", "/segments/peak"),
            ("gpupool_allocations_total", "/allocations"),
            ("gpupool_frees_total", "/frees"),
            ("gpupool_cache_hits_total", "/cache_hits"),
            ("gpupool_cache_misses_total", "/cache_misses"),
            ("gpupool_driver_mallocs_total", "/driver/mallocs"),
            (
                "gpupool_driver_mallocs_refused_total",
                "/driver/mallocs_refused",
            ),
            ("gpupool_driver_frees_total", "/driver/frees"),
            (
                "gpupool_threshold_released_bytes_total",
                "/released/threshold_bytes",
            ),
            (
                "gpupool_empty_cache_released_bytes_total",
                "/released/empty_cache_bytes",
            ),
            (
                "gpupool_outgrown_released_bytes_total",
                "/released/outgrown_bytes",
            ),
            (
                "gpupool_oom_released_bytes_total",
                "/released/out_of_memory_bytes",
            ),
            ("gpupool_oom_retries_total", "/out_of_memory/retries"),
            ("gpupool_oom_recovered_total", "/out_of_memory/recovered"),
            ("gpupool_ooms_total", "/out_of_memory/returned"),
            (
                "gpupool_threshold_released_segments_total",
                "/released/threshold_segments",
            ),
            (
                "gpupool_empty_cache_released_segments_total",
                "/released/empty_cache_segments",
            ),
            (
                "gpupool_outgrown_released_segments_total",
                "/released/outgrown_segments",
            ),
            (
                "gpupool_threshold_released_granules_total",
                "/released/threshold_granules",
            ),
            (
                "gpupool_empty_cache_released_granules_total",
                "/released/empty_cache_granules",
            ),
            (
                "gpupool_program_syncs_used_total",
                "/in_flight/program_syncs_used",
            ),
            ("gpupool_resets_total", "/resets"),
            ("gpupool_fences_total", "/in_flight/fences"),
            ("gpupool_barriers_total", "/in_flight/barriers"),
            ("gpupool_invalid_frees_total", "/invalid_frees"),
            ("gpupool_device_total_bytes", "/memory/total_bytes"),
            (
                "gpupool_device_outside_pool_bytes",
                "/memory/outside_pool_bytes",
            ),
            ("gpupool_releasable_bytes", "/releasable_bytes"),
            ("gpupool_stranded_bytes", "/stranded_bytes"),
            (
                "gpupool_expandable_address_space_bytes",
                "/expandable/address_space_bytes",
            ),
            (
                "gpupool_expandable_mapped_bytes",
                "/expandable/mapped_bytes",
            ),
            (
                "gpupool_granules_mapped_total",
                "/expandable/granules_mapped",
            ),
            (
                "gpupool_granules_unmapped_total",
                "/expandable/granules_unmapped",
            ),
            (
                "gpupool_slack_moved_granules_total",
                "/expandable/slack_moved_granules",
            ),
            ("gpupool_request_size_bytes_count", "/allocations"),
            (
                "gpupool_request_size_bytes_sum",
                "/requested_bytes/total_in",
            ),
        ] {
            assert_eq!(g(name), u(d, pointer) as f64, "{name} vs JSON {pointer}");
        }
        let frag = d["fragmentation"].as_f64().unwrap();
        assert!((g("gpupool_fragmentation_ratio") - frag).abs() < 1e-3);
        assert_eq!(
            p[&("gpupool_release_threshold_bytes".to_string(), i.to_string())],
            "+Inf"
        );
        assert_eq!(
            g("gpupool_cache_hits_total") + g("gpupool_cache_misses_total"),
            g("gpupool_allocations_total")
        );
        assert_eq!(g("gpupool_reserved_bytes_peak"), sim[i as usize].1 as f64);
        assert_eq!(g("gpupool_driver_mallocs_total"), sim[i as usize].0 as f64);
        assert_eq!(g("gpupool_requested_bytes"), 0.0);
        assert_eq!(g("gpupool_allocated_bytes"), 0.0);
        program_from_prom += g("gpupool_allocations_total");
        // The histogram: cumulative buckets by size, ending at +Inf with every request, and
        // the same counts as the JSON's buckets.
        let buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter(|s| {
                s["name"] == "gpupool_request_size_bytes_bucket"
                    && s["labels"]["device"] == i.to_string().as_str()
            })
            .map(|s| {
                let le = s["labels"]["le"].as_str().unwrap();
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                (le, s["value"].as_f64().unwrap())
            })
            .collect();
        assert!(buckets.len() > 2);
        assert!(buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(
            *buckets.last().unwrap(),
            (f64::INFINITY, g("gpupool_allocations_total"))
        );
        for b in d["request_histogram"].as_array().unwrap() {
            let Some(below) = b["below"].as_u64() else {
                continue;
            };
            let upto = |le: f64| {
                buckets
                    .iter()
                    .find(|(l, _)| *l == le)
                    .unwrap_or_else(|| panic!("no bucket le={le}"))
                    .1
            };
            // Requests in [below/2, below) are those counted up to below-1 and not up to below/2-1.
            let n = upto((below - 1) as f64)
                - if below > 1 {
                    upto((below / 2 - 1) as f64)
                } else {
                    0.0
                };
            assert_eq!(n, u(b, "/count") as f64, "bucket below {below}");
        }
    }
    assert_eq!(program_from_prom, program as f64);
    // Nothing passed through to CUDA: zeros in both forms, no line in the text.
    for reason in ["own_memory_pool", "graph_capture"] {
        for (name, field) in [
            ("gpupool_passed_through_allocations_total", "allocations"),
            ("gpupool_passed_through_bytes_total", "bytes"),
        ] {
            let key = (name.to_string(), format!("reason={reason}"));
            assert_eq!(p[&key].as_f64(), Some(0.0), "{name} {reason}");
            assert_eq!(u(&v, &format!("/passed_through/{reason}/{field}")), 0);
        }
    }

    // The text table.
    let text = std::fs::read_to_string(&runs["txt"].2).unwrap();
    assert!(!text.contains("passed through"), "{text}");
    let header = text.lines().nth(1).unwrap_or("");
    assert!(
        header.starts_with(" gpupool summary   pid ")
            && header.contains(&format!("pid {}   rank 0   reuse strict", runs["txt"].0)),
        "{text}"
    );
    let blocks = text_devices(&text);
    assert_eq!(blocks.keys().copied().collect::<Vec<_>>(), [0, 1], "{text}");
    let mut program_from_text = 0;
    for (i, d) in devices.iter().enumerate() {
        let b = &blocks[&(i as u64)];
        let (mallocs, frees, hits, misses) = calls_line(b);
        assert_eq!(mallocs, u(d, "/allocations"), "{b}");
        assert_eq!(frees, mallocs);
        assert_eq!((hits, misses), (u(d, "/cache_hits"), u(d, "/cache_misses")));
        assert_eq!(hits + misses, mallocs);
        program_from_text += mallocs;
        assert!(
            b.contains(&format!(" driver     cudaMalloc {} (", sim[i].0)),
            "{b}"
        );
        let driver_calls = u(d, "/driver/mallocs")
            + u(d, "/driver/frees")
            + u(d, "/expandable/granules_mapped")
            + u(d, "/expandable/granules_unmapped");
        assert!(
            b.contains(&format!(
                ": {driver_calls} calls for the program's {}\n",
                mallocs + frees
            )),
            "{b}"
        );
        for (row, key) in [
            ("requested memory", "requested_bytes"),
            ("allocated memory", "allocated_bytes"),
            ("reserved (from driver)", "reserved_bytes"),
        ] {
            let want = ["current", "peak", "total_in", "total_out"]
                .map(|f| human(u(d, &format!("/{key}/{f}"))));
            assert_eq!(text_row(b, row), want, "{row}:\n{b}");
        }
        assert_eq!(text_row(b, "reserved (from driver)")[1], human(sim[i].1));
        let want = ["current", "peak", "total_in", "total_out"]
            .map(|f| u(d, &format!("/live_blocks/{f}")).to_string());
        assert_eq!(text_row(b, "allocations"), want, "{b}");
        assert!(
            b.contains(&format!(
                "\n device     80.0 GiB total; at the last sample {} free, 300 MiB used outside the pool",
                human(u(d, "/memory/free_bytes"))
            )),
            "{b}"
        );
        assert_eq!(
            u(d, "/memory/free_bytes"),
            80 * GIB - 300 * MIB - last_sample_reserved(d)
        );
        assert!(
            b.contains(" request sizes (count of requests below each bound):"),
            "{b}"
        );
        assert!(!b.contains("still allocated at exit"), "{b}");
    }
    assert_eq!(program_from_text, program);
    assert!(text.ends_with(&format!("{}\n", "=".repeat(78))), "{text}");
}

/// The reserved bytes at the device's last memory sample, from the JSON (free = total − context −
/// reserved at that moment, in the simulator).
fn last_sample_reserved(d: &Value) -> u64 {
    u(d, "/memory/total_bytes") - u(d, "/memory/free_bytes") - u(d, "/memory/outside_pool_bytes")
}

/// With expandable segments on, a request that the limit leaves no whole granule for gets a
/// classic segment of its own size from `cudaMalloc` (`GPUPOOL_LIMIT=101MiB`: 4 MiB mapped,
/// 97 MiB asked for). When the driver refuses that call, the summary says so in each form, as
/// it does with classic segments: the simulator's own count of refused calls, not 0 (a range of
/// address space counts as a segment, but no `cudaMalloc` made it).
#[test]
fn a_refused_driver_malloc_is_counted_with_expandable_segments() {
    let dir = scratch("report-refused-malloc");
    for fail in ["", "cudaMalloc@1=2"] {
        for (form, name) in [("json", "s.json"), ("prom", "s.prom"), ("text", "s.txt")] {
            let path = dir.join(name);
            let (_, out, _) = run_ok(
                &c_program("requests"),
                &["4", "97"],
                &[
                    ("CUDASIM_FAIL", fail),
                    ("GPUPOOL_LIMIT", "101MiB"),
                    ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
                ],
            );
            let served = if fail.is_empty() { 0 } else { 2 };
            assert!(
                out.contains(&format!("97 MiB -> {served}\n")),
                "{fail}: {out}"
            );
            let sim: (u64, u64) = (figure(&out, "sim mallocs"), figure(&out, "sim refused"));
            assert_eq!(sim.0, 1, "{fail}: the pool's one cudaMalloc: {out}");
            let (mallocs, refused) = match form {
                "json" => {
                    let v = read_json(&path);
                    let d = &v["devices"][0];
                    (u(d, "/driver/mallocs"), u(d, "/driver/mallocs_refused"))
                }
                "prom" => {
                    let (_, map) = parse_prometheus(&path);
                    (
                        prom(&map, "gpupool_driver_mallocs_total", 0) as u64,
                        prom(&map, "gpupool_driver_mallocs_refused_total", 0) as u64,
                    )
                }
                _ => {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let line = text
                        .lines()
                        .find(|l| l.starts_with(" driver "))
                        .unwrap_or_else(|| panic!("no driver line: {text}"));
                    // "cudaMalloc 1, 1 refused (8.0 us), ..." or "cudaMalloc 1 (21.1 us), ...".
                    let calls = line.split("cudaMalloc ").nth(1).unwrap();
                    let calls = calls.split(" (").next().unwrap();
                    let mut parts = calls.split(", ");
                    let mallocs = parse(parts.next().unwrap());
                    let refused = parts
                        .next()
                        .map_or(0, |p| parse(p.strip_suffix(" refused").unwrap()));
                    (mallocs, refused)
                }
            };
            assert_eq!((mallocs, refused), sim, "{fail} {form}");
        }
    }
}

/// The releases by threshold say what went back: with classic segments the segments freed
/// (as many as the `segments` row's total freed), with expandable segments the granules
/// unmapped, none of them a segment (the range stays). `tests/c/threshold.c` frees 1 GiB in
/// 64 MiB blocks under `GPUPOOL_RELEASE_THRESHOLD=0`.
#[test]
fn releases_by_threshold_count_segments_and_granules_apart() {
    let dir = scratch("report-release-units");
    for expandable in ["0", "1"] {
        let env = [
            ("GPUPOOL_EXPANDABLE", expandable),
            ("GPUPOOL_RELEASE_THRESHOLD", "0"),
        ];
        let (v, text) = json_and_text(&dir.join(expandable), "threshold", &[], &env);
        let d = &v["devices"][0];
        let segments = u(d, "/segments/total_out");
        let granules = u(d, "/expandable/granules_unmapped");
        assert_eq!(u(d, "/released/threshold_segments"), segments, "{d}");
        assert_eq!(u(d, "/released/threshold_granules"), granules, "{d}");
        assert_eq!(u(d, "/released/threshold_bytes"), GIB, "{d}");
        let want = if expandable == "1" {
            assert_eq!((segments, granules), (0, 512), "{d}");
            "by threshold 512 granules (1.00 GiB)"
        } else {
            assert_eq!((segments, granules), (16, 0), "{d}");
            "by threshold 16 segments (1.00 GiB)"
        };
        assert!(
            text.contains(&format!(" released   {want}\n")),
            "expandable {expandable}: {text}"
        );
    }
}

/// The cache given back because another allocator ran out of memory (`cudaMallocManaged` of
/// 500 MiB on a 1 GiB device whose 900 MiB sit in the pool's cache, `tests/c/cache_in_the_way.c`)
/// is released at out-of-memory, not "by empty_cache": the program asked for no empty cache.
#[test]
fn cache_given_back_for_another_allocator_is_released_at_out_of_memory() {
    let dir = scratch("report-release-for-others");
    for expandable in ["0", "1"] {
        let env = [
            ("CUDASIM_MEM", "1GiB"),
            ("CUDASIM_CONTEXT_BYTES", "0"),
            ("GPUPOOL_EXPANDABLE", expandable),
        ];
        let (v, text) = json_and_text(
            &dir.join(expandable),
            "cache_in_the_way",
            &["managed"],
            &env,
        );
        let d = &v["devices"][0];
        assert_eq!(u(d, "/released/empty_cache_bytes"), 0, "{d}");
        assert_eq!(u(d, "/released/empty_cache_segments"), 0, "{d}");
        assert_eq!(u(d, "/released/empty_cache_granules"), 0, "{d}");
        assert_eq!(
            u(d, "/released/out_of_memory_bytes"),
            u(d, "/reserved_bytes/total_out"),
            "{d}"
        );
        assert!(u(d, "/released/out_of_memory_bytes") >= 500 * MIB, "{d}");
        assert!(!text.contains("by empty_cache"), "{text}");
        assert!(text.contains(" released   at out-of-memory "), "{text}");
    }
}

/// Runs the C program `name` twice, writing its summary to `prefix.json` and `prefix.txt`:
/// the JSON summary and the text one.
fn json_and_text(
    prefix: &Path,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Value, String) {
    let json = prefix.with_extension("json");
    let txt = prefix.with_extension("txt");
    for path in [&json, &txt] {
        let mut env = env.to_vec();
        env.push(("GPUPOOL_SUMMARY", path.to_str().unwrap()));
        run_ok(&c_program(name), args, &env);
    }
    (read_json(&json), std::fs::read_to_string(&txt).unwrap())
}
