//! `gpupool-trace compare` and `generate`: workloads (generated from a seed, or the requests of a
//! recorded trace) replayed through every policy of `gpupool_lab::policies`, side by side.

use std::fmt::Write as _;
use std::time::Instant;

use gpupool::config::ReuseMode;
use gpupool::pool::{need_for, FreeKind, NO_STREAM};
use gpupool::report::units::bytes;
use gpupool_lab::policies::{lineup, run, series, Outcome, RecordedOoms, LINEUP};
use gpupool_lab::workloads::{self, record, Kind, Op, Workload};

use crate::chart::{self, Line};
use crate::text::{reuse_mode, size_or_none};

pub struct Options {
    pub seed: u64,
    pub threshold: u64,
    pub capacity: Option<u64>,
    pub reuse: Option<ReuseMode>,
    pub svg_dir: Option<String>,
    /// Replays of each policy are repeated until they took this long (throughput).
    pub min_seconds: f64,
}

/// Splits `args` into sources and options.
pub fn options(args: &[String]) -> Result<(Vec<String>, Options), String> {
    let mut o = Options {
        seed: 1,
        threshold: 1 << 30,
        capacity: None,
        reuse: None,
        svg_dir: None,
        min_seconds: 0.2,
    };
    let mut sources = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if !a.starts_with("--") {
            sources.push(a.clone());
            continue;
        }
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--seed" => o.seed = v.parse().map_err(|_| format!("bad seed {v:?}"))?,
            "--threshold" => o.threshold = size_or_none(v)?,
            "--capacity" => o.capacity = Some(size_or_none(v)?),
            "--reuse" => o.reuse = Some(reuse_mode(v)?),
            "--svg-dir" => o.svg_dir = Some(v.clone()),
            "--min-time" => {
                o.min_seconds = v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| (0.0..=60.0).contains(s))
                    .ok_or_else(|| format!("bad time {v:?}"))?
            }
            _ => return Err(format!("unknown option {a:?}")),
        }
    }
    if sources.is_empty() {
        return Err("no workload or trace given".into());
    }
    Ok((sources, o))
}

/// The workloads a source names: a generated one, or one per device of a trace file.
pub fn load(source: &str, seed: u64) -> Result<Vec<(String, Workload)>, String> {
    if let Some(kind) = Kind::parse(source) {
        let w = kind?.generate(seed);
        return Ok(vec![(source.to_string(), w)]);
    }
    let data = std::fs::read(source).map_err(|e| format!("{source}: {e}"))?;
    let records = gpupool::pool::trace::parse(&data).map_err(|e| format!("{source}: {e}"))?;
    let name = std::path::Path::new(source)
        .file_name()
        .map_or_else(|| source.to_string(), |n| n.to_string_lossy().into_owned());
    // A device asked for nothing (its settings recorded, and no request but ones refused for
    // another reason than memory) has no figure to compare.
    let ws: Vec<_> = workloads::from_records(&records, &name)
        .into_iter()
        .filter(|(_, w)| w.requests() > 0)
        .collect();
    if ws.is_empty() {
        return Err(format!("{source}: the trace holds no allocations"));
    }
    Ok(ws
        .into_iter()
        .map(|(d, w)| (format!("{name}, device {d}"), w))
        .collect())
}

/// `generate SPEC [--seed N] [--out FILE]`: the trace bytes.
pub fn generate(args: &[String]) -> Result<(Vec<u8>, Option<String>), String> {
    let (spec, rest) = args.split_first().ok_or("generate needs a workload")?;
    let kind = Kind::parse(spec).ok_or_else(|| format!("unknown workload {spec:?}"))??;
    let (mut seed, mut out) = (1u64, None);
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--seed" => seed = v.parse().map_err(|_| format!("bad seed {v:?}"))?,
            "--out" => out = Some(v.clone()),
            _ => return Err(format!("unknown option {a:?}")),
        }
    }
    Ok((record::to_trace(&kind.generate(seed)), out))
}

/// One policy's results on a workload: uncapped (peaks, calls, throughput) and under the cap
/// (out-of-memory failures).
pub struct Row {
    pub outcome: Outcome,
    pub capped: Outcome,
}

/// Where the cap of a comparison comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapOrigin {
    /// `--capacity`.
    Asked,
    /// The workload's own: RMM's 16 GiB, or the limit a trace recorded.
    Workload,
    /// 1.1 × peak requested, for want of either.
    PeakRequested,
}

pub struct Comparison {
    pub title: String,
    pub requests: u64,
    pub events: u64,
    pub peak_requested: u64,
    pub cap: u64,
    pub cap_origin: CapOrigin,
    /// Requests that failed out of memory in the recorded run (0 for a generated workload).
    pub recorded_ooms: u64,
    pub rows: Vec<Row>,
}

pub fn with_reuse(mut w: Workload, reuse: Option<ReuseMode>) -> Workload {
    if let Some(mode) = reuse {
        for op in w.ops.iter_mut() {
            if let Op::Free { need, how, .. } = op {
                let kind = FreeKind::from_code(u16::from(how.code), NO_STREAM);
                *need = need_for(mode, kind, how.beyond_barriers);
            }
        }
    }
    w
}

/// Every policy on `w`: uncapped (peaks, calls, throughput: the median of repeated replays),
/// then under the capacity (out-of-memory failures).
pub fn compare(title: &str, w: &Workload, o: &Options) -> Comparison {
    let peak_requested = w.peak_requested();
    let (cap, cap_origin) = match (o.capacity, w.capacity) {
        (Some(c), _) => (c, CapOrigin::Asked),
        (None, Some(c)) => (c, CapOrigin::Workload),
        (None, None) => (
            (peak_requested.saturating_add(peak_requested / 10))
                .checked_next_multiple_of(1 << 20)
                .unwrap_or(u64::MAX),
            CapOrigin::PeakRequested,
        ),
    };
    let mut rows = Vec::new();
    for i in 0..LINEUP {
        let fresh = || lineup(o.threshold, None).swap_remove(i);
        let mut times = Vec::new();
        let started = Instant::now();
        let mut outcome = None;
        while times.len() < 3
            || (started.elapsed().as_secs_f64() < o.min_seconds && times.len() < 25)
        {
            let mut p = fresh();
            let r = run(p.as_mut(), w);
            times.push(r.seconds);
            outcome.get_or_insert(r);
        }
        times.sort_by(f64::total_cmp);
        let mut outcome = outcome.expect("ran at least once");
        outcome.seconds = times[times.len() / 2];
        let mut capped = lineup(o.threshold, Some(cap)).swap_remove(i);
        let capped = run(capped.as_mut(), w);
        rows.push(Row { outcome, capped });
    }
    Comparison {
        title: title.to_string(),
        requests: w.requests(),
        events: w.ops.len() as u64,
        peak_requested,
        cap,
        cap_origin,
        recorded_ooms: w.recorded_ooms(),
        rows,
    }
}

/// Digits in groups of three: `12 345`.
pub fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// `1 request`, `12 345 requests`.
fn counted(n: u64, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        n => format!("{} {noun}s", grouped(n)),
    }
}

fn rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1} M", v / 1e6)
    } else {
        format!("{:.0} k", v / 1e3)
    }
}

/// `a ÷ b` with three decimals; `n/a` over nothing (a workload whose peak requested is 0).
pub fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        "n/a".into()
    } else {
        format!("{:.3}", a as f64 / b as f64)
    }
}

/// The comparison as a Markdown section. A workload with requests that failed in the recorded
/// run gets a paragraph on them and two columns: how many each policy served and failed.
pub fn markdown(c: &Comparison) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "#### {}\n", c.title);
    let _ = writeln!(
        s,
        "{}, {}; peak requested {}. OOMs: requests failed with every policy's driver \
         capped at {}.\n",
        counted(c.requests, "request"),
        counted(c.events, "operation"),
        bytes(c.peak_requested),
        bytes(c.cap)
    );
    let oom_columns = c.recorded_ooms > 0;
    if oom_columns {
        let _ = writeln!(s, "{}\n", recorded_ooms_paragraph(c));
    }
    let _ = write!(
        s,
        "| policy | peak reserved | ÷ peak requested | cudaMalloc per 1 000 requests | \
         cudaFree calls | OOMs at {} | replay events/s |",
        bytes(c.cap)
    );
    if oom_columns {
        let _ = write!(
            s,
            " recorded OOMs served / failed | recorded OOMs at {} served / failed |",
            bytes(c.cap)
        );
    }
    let more = if oom_columns { " ---: | ---: |" } else { "" };
    let _ = writeln!(
        s,
        "\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |{more}"
    );
    for r in &c.rows {
        let o = &r.outcome;
        let _ = write!(
            s,
            "| {} | {} | {} | {:.2} | {} | {} | {} |",
            o.policy,
            bytes(o.counters.peak_reserved),
            ratio(o.counters.peak_reserved, c.peak_requested),
            o.mallocs_per_1000(),
            grouped(o.counters.frees),
            grouped(r.capped.ooms),
            rate(o.events_per_second())
        );
        if oom_columns {
            let served_failed = |o: &Outcome| {
                let RecordedOoms { served, failed } = o.recorded_ooms;
                format!("{} / {}", grouped(served), grouped(failed))
            };
            let _ = write!(s, " {} | {} |", served_failed(o), served_failed(&r.capped));
        }
        s.push('\n');
    }
    s
}

/// What the recorded OOM columns count, and under which cap.
fn recorded_ooms_paragraph(c: &Comparison) -> String {
    let origin = match c.cap_origin {
        CapOrigin::Asked => "`--capacity`",
        // Only a trace records failures, and its workload's cap is its limit.
        CapOrigin::Workload => "the limit the trace recorded, `GPUPOOL_LIMIT`",
        CapOrigin::PeakRequested => {
            "1.1 × peak requested: the trace records no device memory, so give it with \
             `--capacity`"
        }
    };
    format!(
        "{} failed out of memory in the recorded run. The last two columns say how \
         many of them each policy served and failed, uncapped and at {} ({origin}). The OOMs \
         column counts the other requests.",
        counted(c.recorded_ooms, "request"),
        bytes(c.cap)
    )
}

/// The row of `name` (`gpupool`, `PyTorch rules`).
pub fn row<'a>(c: &'a Comparison, name: &str) -> Option<&'a Outcome> {
    c.rows.iter().map(|r| &r.outcome).find(|o| o.policy == name)
}

/// gpupool against the PyTorch rules, one line per workload.
pub fn against_torch(cs: &[Comparison]) -> String {
    let mut s = String::from(
        "| workload | gpupool peak reserved vs PyTorch rules | cudaMalloc calls vs PyTorch rules | gpupool ÷ peak requested | gpupool replay events/s |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
    );
    for c in cs {
        let (Some(us), Some(pt)) = (row(c, "gpupool"), row(c, "PyTorch rules")) else {
            continue;
        };
        // Nothing to compare with (every request failed, say): no percentage.
        let pct = |a: u64, b: u64| {
            if b == 0 {
                "n/a".to_string()
            } else {
                format!("{:+.1}%", (a as f64 / b as f64 - 1.0) * 100.0)
            }
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} ({} vs {}) | {} | {} |",
            c.title,
            pct(us.counters.peak_reserved, pt.counters.peak_reserved),
            pct(us.counters.mallocs, pt.counters.mallocs),
            grouped(us.counters.mallocs),
            grouped(pt.counters.mallocs),
            ratio(us.counters.peak_reserved, c.peak_requested),
            rate(us.events_per_second())
        );
    }
    s
}

/// Our pool with expandable segments, without and with the lineup's mapped slack, against
/// PyTorch's expandable-segment rules, one line per workload, as ratios to the program's peak
/// requested bytes (issue 20's targets: at most PyTorch's on every workload, at most 1.05 on
/// training and inference), with what each costs in maps and unmaps.
pub fn against_torch_expandable(cs: &[Comparison]) -> String {
    let slack = gpupool_lab::policies::ours::slack_name(gpupool_lab::policies::LINEUP_SLACK);
    let slacked = format!("gpupool, expandable, slack {slack}");
    let mut s = format!(
        "| workload | gpupool, expandable ÷ peak requested | slack {slack} | PyTorch expandable ÷ peak requested | gpupool ÷ peak requested | maps per 1 000 requests (expandable) | maps, unmaps per 1 000 requests (slack {slack}) |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for c in cs {
        let (Some(x), Some(xs), Some(pt), Some(us)) = (
            row(c, "gpupool, expandable"),
            row(c, &slacked),
            row(c, "PyTorch expandable"),
            row(c, "gpupool"),
        ) else {
            continue;
        };
        let ratio = |o: &Outcome| ratio(o.counters.peak_reserved, c.peak_requested);
        let per_1000 = |n: u64| n as f64 * 1000.0 / c.requests.max(1) as f64;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.1} | {:.1}, {:.1} |",
            c.title,
            ratio(x),
            ratio(xs),
            ratio(pt),
            ratio(us),
            per_1000(x.counters.maps),
            per_1000(xs.counters.maps),
            per_1000(xs.counters.unmaps),
        );
    }
    s
}

/// The chart of `w` (reserved over operations per policy), for `--svg-dir`.
pub fn chart(title: &str, w: &Workload, threshold: u64) -> String {
    let requested: Vec<(u64, u64)> = std::iter::once((0, 0))
        .chain(
            w.requested_over_time()
                .map(|(i, bytes)| (i as u64 + 1, bytes)),
        )
        .collect();
    let lines: Vec<Line> = lineup(threshold, None)
        .into_iter()
        .map(|mut p| Line {
            name: p.name(),
            points: series(p.as_mut(), w),
        })
        .collect();
    chart::svg(title, w.ops.len() as u64, &requested, &lines)
}
