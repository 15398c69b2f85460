//! `gpupool-trace perfetto`: the trace as Chrome/Perfetto trace-event JSON (the JSON object
//! format that ui.perfetto.dev and chrome://tracing open).
//!
//! - Process `gpupool` (pid 1) with one thread track per device (`device N`, tid 100 + N).
//! - Per device two counter tracks, `device N allocated` and `device N reserved`, argument
//!   `bytes`: a sample at the device's first record and one after every record that changed the
//!   counter (the fold `stats` reports, so the last and highest samples are its figures).
//! - Instant events on the device's track for the pool's settings, failed allocations,
//!   segments allocated, refused and released (size, address, reason), fences (the host's
//!   wait), barriers, empty-cache requests, threshold changes and device resets. Allocations
//!   and frees show only in the counters: they are most of the trace.
//!
//! Timestamps are microseconds from the start of the trace, with nanosecond decimals. One event
//! per line, no indentation: about 90 bytes per counter sample.

use std::io::{self, Write};

use gpupool::pool::trace::{Kind, Record};
use gpupool::report::units::{bytes, duration_ns};

use crate::fold::{devices, Fold};

const PID: u32 = 1;

/// The thread id of a device's track (distinct from the pid, which Perfetto would take for the
/// process's main thread).
fn tid(device: u8) -> u32 {
    100 + u32::from(device)
}

/// Appends `s` to `out` as a JSON string, quotes included.
pub fn push_str(out: &mut String, s: &str) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            // Control characters, and the two separators that JavaScript string literals reject.
            c if (c as u32) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A JSON value for an event's arguments.
#[derive(Clone, Copy)]
enum Arg<'a> {
    Num(u64),
    Str(&'a str),
}

/// `t_ns` as microseconds with three decimals: an exact JSON number.
fn push_ts(out: &mut String, t_ns: u64) {
    out.push_str(&format!("{}.{:03}", t_ns / 1000, t_ns % 1000));
}

fn push_args(out: &mut String, args: &[(&str, Arg)]) {
    out.push_str(",\"args\":{");
    for (i, (k, v)) in args.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_str(out, k);
        out.push(':');
        match v {
            Arg::Num(n) => out.push_str(&n.to_string()),
            Arg::Str(s) => push_str(out, s),
        }
    }
    out.push('}');
}

/// Writes events separated by `,\n` between the array's brackets.
struct Events<'w> {
    out: &'w mut dyn Write,
    first: bool,
    line: String,
}

impl Events<'_> {
    fn emit(&mut self) -> io::Result<()> {
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        self.out.write_all(self.line.as_bytes())?;
        self.line.clear();
        Ok(())
    }

    fn metadata(&mut self, name: &str, tid: Option<u32>, args: &[(&str, Arg)]) -> io::Result<()> {
        self.line.push_str("{\"ph\":\"M\",\"pid\":1");
        if let Some(t) = tid {
            self.line.push_str(&format!(",\"tid\":{t}"));
        }
        self.line.push_str(",\"name\":");
        push_str(&mut self.line, name);
        push_args(&mut self.line, args);
        self.line.push('}');
        self.emit()
    }

    fn counter(&mut self, device: u8, what: &str, t_ns: u64, value: u64) -> io::Result<()> {
        self.line
            .push_str(&format!("{{\"ph\":\"C\",\"pid\":{PID},\"ts\":"));
        push_ts(&mut self.line, t_ns);
        self.line.push_str(",\"name\":");
        push_str(&mut self.line, &format!("device {device} {what}"));
        push_args(&mut self.line, &[("bytes", Arg::Num(value))]);
        self.line.push('}');
        self.emit()
    }

    fn instant(
        &mut self,
        r: &Record,
        t_ns: u64,
        name: &str,
        args: &[(&str, Arg)],
    ) -> io::Result<()> {
        self.line.push_str(&format!(
            "{{\"ph\":\"i\",\"s\":\"t\",\"pid\":{PID},\"tid\":{},\"ts\":",
            tid(r.device)
        ));
        push_ts(&mut self.line, t_ns);
        self.line.push_str(",\"cat\":\"gpupool\",\"name\":");
        push_str(&mut self.line, name);
        let mut all = args.to_vec();
        all.push(("thread", Arg::Num(u64::from(r.thread))));
        push_args(&mut self.line, &all);
        self.line.push('}');
        self.emit()
    }
}

fn size_or_none(n: u64) -> String {
    if n == u64::MAX {
        "none".into()
    } else {
        bytes(n)
    }
}

fn hex(n: u64) -> String {
    format!("{n:#x}")
}

/// The instant event a record shows as, if any.
fn instant(ev: &mut Events, r: &Record, t_ns: u64) -> io::Result<()> {
    use Arg::{Num, Str};
    match r.kind {
        Kind::Settings => {
            let reuse = match r.aux {
                0 => "strict".to_string(),
                1 => "barrier".to_string(),
                2 => "relaxed".to_string(),
                n => format!("unknown ({n})"),
            };
            ev.instant(
                r,
                t_ns,
                "pool settings",
                &[
                    ("max_split_size", Str(&size_or_none(r.a))),
                    ("fence_bytes", Str(&size_or_none(r.b))),
                    ("release_threshold", Str(&size_or_none(r.c))),
                    ("reuse", Str(&reuse)),
                ],
            )
        }
        Kind::AllocFailed => ev.instant(
            r,
            t_ns,
            if r.b == 2 {
                "out of memory"
            } else {
                "allocation failed"
            },
            &[
                ("requested", Num(r.a)),
                ("requested_size", Str(&bytes(r.a))),
                ("error", Num(r.b)),
            ],
        ),
        Kind::SegmentAlloc => ev.instant(
            r,
            t_ns,
            "segment allocated",
            &[
                ("size", Num(r.b)),
                ("size_h", Str(&bytes(r.b))),
                ("address", Str(&hex(r.a))),
            ],
        ),
        Kind::SegmentRefused => ev.instant(
            r,
            t_ns,
            "segment refused",
            &[
                ("size", Num(r.a)),
                ("size_h", Str(&bytes(r.a))),
                ("error", Num(r.b)),
            ],
        ),
        Kind::SegmentFree => {
            let reason = match r.aux {
                0 => "threshold".to_string(),
                1 => "empty cache".to_string(),
                2 => "out of memory".to_string(),
                3 => "outgrown".to_string(),
                n => format!("unknown ({n})"),
            };
            ev.instant(
                r,
                t_ns,
                "segment released",
                &[
                    ("size", Num(r.b)),
                    ("size_h", Str(&bytes(r.b))),
                    ("address", Str(&hex(r.a))),
                    ("reason", Str(&reason)),
                ],
            )
        }
        Kind::Fence => ev.instant(
            r,
            t_ns,
            "fence",
            &[("wait_ns", Num(r.a)), ("wait", Str(&duration_ns(r.a)))],
        ),
        Kind::Barrier => ev.instant(r, t_ns, "barrier", &[]),
        Kind::EmptyCache if r.b != 0 => {
            ev.instant(r, t_ns, "cache given back for another allocator", &[])
        }
        Kind::EmptyCache => ev.instant(r, t_ns, "empty cache", &[]),
        Kind::Threshold => ev.instant(
            r,
            t_ns,
            "release threshold",
            &[("bytes", Num(r.a)), ("threshold", Str(&size_or_none(r.a)))],
        ),
        Kind::Limit => ev.instant(
            r,
            t_ns,
            "limit",
            &[("bytes", Num(r.a)), ("limit", Str(&size_or_none(r.a)))],
        ),
        Kind::Reset => ev.instant(r, t_ns, "device reset", &[]),
        Kind::BeyondBarriers => ev.instant(
            r,
            t_ns,
            "work no barrier orders (a non-blocking stream or context)",
            &[],
        ),
        Kind::Expandable => ev.instant(
            r,
            t_ns,
            "expandable segments",
            &[("granule", Str(&bytes(r.a))), ("range", Str(&bytes(r.b)))],
        ),
        Kind::RangeReserved => ev.instant(
            r,
            t_ns,
            "range reserved",
            &[("size_h", Str(&bytes(r.b))), ("address", Str(&hex(r.a)))],
        ),
        Kind::RangeRefused => ev.instant(
            r,
            t_ns,
            "range refused",
            &[("size_h", Str(&bytes(r.a))), ("error", Num(r.b))],
        ),
        Kind::MappedSlack => ev.instant(r, t_ns, "mapped slack", &[("permille", Num(r.a))]),
        Kind::MapRefused => ev.instant(
            r,
            t_ns,
            "map refused",
            &[("address", Str(&hex(r.a))), ("error", Num(r.c))],
        ),
        // Shown by the counters, or too frequent to be worth an event.
        Kind::Alloc | Kind::Free | Kind::Observe | Kind::SyncPoint | Kind::Map | Kind::Unmap => {
            Ok(())
        }
    }
}

/// Writes the trace-event JSON for `records`; `source` (the trace's file name) goes into the
/// file's `otherData`.
pub fn write(records: &[Record], source: &str, out: &mut dyn Write) -> io::Result<()> {
    let mut ev = Events {
        out,
        first: true,
        line: String::with_capacity(256),
    };
    ev.out.write_all(b"{\"traceEvents\":[\n")?;
    ev.metadata("process_name", None, &[("name", Arg::Str("gpupool"))])?;
    for d in devices(records) {
        ev.metadata(
            "thread_name",
            Some(tid(d)),
            &[("name", Arg::Str(&format!("device {d}")))],
        )?;
        ev.metadata(
            "thread_sort_index",
            Some(tid(d)),
            &[("sort_index", Arg::Num(u64::from(d)))],
        )?;
    }
    let mut folds = vec![Fold::default(); 256];
    for r in records {
        let f = &mut folds[usize::from(r.device)];
        let first = f.records == 0;
        let changed = f.apply(r);
        let (t, allocated, reserved) = (f.t_ns, f.allocated, f.reserved);
        if first || changed.allocated {
            ev.counter(r.device, "allocated", t, allocated)?;
        }
        if first || changed.reserved {
            ev.counter(r.device, "reserved", t, reserved)?;
        }
        instant(&mut ev, r, t)?;
    }
    let mut tail = String::from("\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"source\":");
    push_str(&mut tail, source);
    tail.push_str(",\"generator\":\"gpupool-trace\"}}\n");
    ev.out.write_all(tail.as_bytes())?;
    ev.out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(s: &str) -> String {
        let mut o = String::new();
        push_str(&mut o, s);
        o
    }

    #[test]
    fn escapes_strings() {
        assert_eq!(json("plain"), r#""plain""#);
        assert_eq!(json(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(json("l1\nl2\r\t"), r#""l1\nl2\r\t""#);
        assert_eq!(json("\u{0}\u{1f}\u{7f}"), "\"\\u0000\\u001f\u{7f}\"");
        assert_eq!(json("\u{2028}é€😀"), "\"\\u2028é€😀\"");
        assert_eq!(json(""), r#""""#);
    }

    #[test]
    fn timestamps_are_exact_microseconds() {
        let mut o = String::new();
        push_ts(&mut o, 1_234_567);
        o.push(' ');
        push_ts(&mut o, 5);
        o.push(' ');
        push_ts(&mut o, u64::MAX);
        assert_eq!(o, "1234.567 0.005 18446744073709551.615");
    }
}
