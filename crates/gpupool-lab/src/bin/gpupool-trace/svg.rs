//! SVG building blocks shared by `plot` and `compare`: step-plot downsampling that keeps every
//! peak, XML escaping, axes with binary byte ticks and 1-2-5 x ticks, plot-area geometry and
//! the line and area paths of a downsampled counter.

use std::fmt::Write as _;

pub const FONT: &str = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif";

/// What a counter did within one column of the plot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    /// The value the column starts with (held from the column before it).
    pub first: u64,
    pub min: u64,
    pub max: u64,
    /// The value it ends with.
    pub last: u64,
}

/// A step function given by `(t_ns, value)` changes, in time order, reduced to `columns` columns
/// spanning `0..=t_end`: `None` before the first change, the range of values each column saw
/// after it. Every value the function takes lies within its column's `min..=max`.
pub fn downsample(points: &[(u64, u64)], t_end: u64, columns: usize) -> Vec<Option<Column>> {
    let mut out: Vec<Option<Column>> = vec![None; columns];
    if columns == 0 {
        return out;
    }
    let column_of = |t: u64| -> usize {
        if t_end == 0 {
            return 0;
        }
        let c = u128::from(t) * columns as u128 / u128::from(t_end);
        usize::try_from(c).unwrap_or(usize::MAX).min(columns - 1)
    };
    let mut held: Option<(usize, u64)> = None; // last column touched, and the value it ended with
    for &(t, v) in points {
        let c = column_of(t);
        match held {
            Some((hc, _)) if hc >= c => {
                // Same column (or a point out of order, which joins the column already drawn).
                if let Some(col) = out[hc].as_mut() {
                    col.min = col.min.min(v);
                    col.max = col.max.max(v);
                    col.last = v;
                }
                held = Some((hc, v));
                continue;
            }
            Some((hc, hv_prev)) => {
                // Columns between hold the previous value.
                for slot in out.iter_mut().take(c).skip(hc + 1) {
                    *slot = Some(flat(hv_prev));
                }
                out[c] = Some(Column {
                    first: hv_prev,
                    min: hv_prev.min(v),
                    max: hv_prev.max(v),
                    last: v,
                });
            }
            None => out[c] = Some(flat(v)),
        }
        held = Some((c, v));
    }
    if let Some((hc, hv)) = held {
        for slot in out.iter_mut().skip(hc + 1) {
            *slot = Some(flat(hv));
        }
    }
    out
}

pub fn flat(v: u64) -> Column {
    Column {
        first: v,
        min: v,
        max: v,
        last: v,
    }
}

/// Appends `s` as XML character data or attribute text. Characters XML 1.0 cannot hold become
/// U+FFFD.
pub fn push_xml(out: &mut String, s: &str) {
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(ch),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
}

pub fn xml(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    push_xml(&mut o, s);
    o
}

/// A byte count on the axis: `0`, `512 B`, `384 MiB`, `1.5 GiB`.
pub fn tick_bytes(v: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if v == 0 {
        return "0".into();
    }
    let mut u = 0;
    while u + 1 < UNITS.len() && v >> (10 * (u + 1)) > 0 {
        u += 1;
    }
    let x = v as f64 / (1u64 << (10 * u)) as f64;
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s} {}", UNITS[u])
}

/// The byte axis: a power-of-two tick step, and the axis top (a whole number of steps, with
/// room above `peak` for its label).
pub fn byte_axis(peak: u64) -> (u64, u64) {
    let peak = peak.max(1024);
    let want = peak.saturating_add(peak / 8);
    let mut step: u64 = 1;
    while step < want.div_ceil(5) && step < 1 << 62 {
        step <<= 1;
    }
    let top = want.div_ceil(step).saturating_mul(step);
    (step, top.max(step))
}

/// The time axis: a 1-2-5 tick step in seconds for `0..=end_s`, and how many decimals it needs.
pub fn time_axis(end_s: f64) -> (f64, usize) {
    let raw = (end_s / 10.0).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw * 0.999)
        .unwrap_or(10.0 * mag);
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    (step, decimals)
}

/// Geometry of one panel's plot area.
pub struct Area {
    pub x0: f64,
    pub y0: f64,
    pub w: f64,
    pub h: f64,
    pub t_end: u64,
    pub y_top: u64,
}

impl Area {
    pub fn x(&self, t: u64) -> f64 {
        self.x0 + self.w * (t as f64 / self.t_end.max(1) as f64).min(1.0)
    }
    pub fn y(&self, v: u64) -> f64 {
        self.y0 + self.h - self.h * (v as f64 / self.y_top.max(1) as f64).min(1.0)
    }
    pub fn column_x(&self, c: usize) -> f64 {
        self.x0 + c as f64 + 0.5
    }
}

/// The line of a counter through its columns, and the same line closed down to zero (the
/// area under it).
pub fn paths(cols: &[Option<Column>], a: &Area) -> (String, String) {
    let mut line = String::new();
    let mut start_x = None;
    let mut cur: Option<u64> = None;
    let mut last_x = 0.0;
    for (c, col) in cols.iter().enumerate() {
        let Some(col) = col else { continue };
        let x = a.column_x(c);
        last_x = x;
        match cur {
            None => {
                start_x = Some(x);
                let _ = write!(line, "M{x:.1} {:.1}", a.y(col.first));
            }
            Some(v) if v != col.first => {
                let _ = write!(line, "H{x:.1}V{:.1}", a.y(col.first));
            }
            Some(_) => {}
        }
        if col.min != col.max || col.first != col.last {
            let _ = write!(
                line,
                "H{x:.1}V{:.1}V{:.1}V{:.1}",
                a.y(col.max),
                a.y(col.min),
                a.y(col.last)
            );
        }
        cur = Some(col.last);
    }
    let Some(sx) = start_x else {
        return (String::new(), String::new());
    };
    let end_x = last_x + 0.5;
    let _ = write!(line, "H{end_x:.1}");
    let area = format!("{line}V{:.1}H{sx:.1}Z", a.y(0));
    (line, area)
}

pub fn label(out: &mut String, x: f64, y: f64, anchor: &str, class: &str, text: &str) {
    let _ = writeln!(
        out,
        r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" class="{class}">{}</text>"#,
        xml(text)
    );
}

/// The grid, the byte axis's labels and the x axis's ticks and labels of plot area `a`, bytes
/// in steps of `step`; x labels are `a.t_end / x_unit` units long (1e9: nanoseconds shown as
/// seconds).
pub fn grid(out: &mut String, a: &Area, step: u64, x_unit: f64) {
    let y_top = a.y_top;
    let (x1, y1) = (a.x0 + a.w, a.y0 + a.h);
    let _ = writeln!(out, r#"<g class="grid">"#);
    let mut v = 0u64;
    while v <= y_top {
        let y = a.y(v);
        let _ = writeln!(
            out,
            r#"<line x1="{:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}"/>"#,
            a.x0
        );
        v = match v.checked_add(step) {
            Some(n) => n,
            None => break,
        };
    }
    let t_end_s = a.t_end as f64 / x_unit;
    let (tstep, decimals) = time_axis(t_end_s);
    let ticks = (t_end_s / tstep + 1e-9).floor() as u64;
    for i in 0..=ticks {
        let x = a.x0 + a.w * (i as f64 * tstep / t_end_s.max(1e-12)).min(1.0);
        let _ = writeln!(
            out,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{y1:.1}"/>"#,
            a.y0
        );
    }
    let _ = writeln!(out, "</g>");
    let mut v = 0u64;
    while v <= y_top {
        label(out, a.x0 - 8.0, a.y(v) + 4.0, "end", "tick", &tick_bytes(v));
        v = match v.checked_add(step) {
            Some(n) => n,
            None => break,
        };
    }
    for i in 0..=ticks {
        let x = a.x0 + a.w * (i as f64 * tstep / t_end_s.max(1e-12)).min(1.0);
        let _ = writeln!(
            out,
            r#"<line x1="{x:.1}" y1="{y1:.1}" x2="{x:.1}" y2="{:.1}" class="axis"/>"#,
            y1 + 4.0
        );
        label(
            out,
            x,
            y1 + 17.0,
            "middle",
            "tick",
            &format!("{:.decimals$}", i as f64 * tstep),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_sample_spike_survives_downsampling() {
        // A million changes over 1 s; one of them, alone, is a spike ten times the rest.
        let mut pts: Vec<(u64, u64)> = (0..1_000_000u64).map(|i| (i * 1000, i % 7)).collect();
        pts[654_321].1 = 1_000;
        let cols = downsample(&pts, 1_000_000_000, 800);
        assert_eq!(cols.len(), 800);
        let max = cols.iter().flatten().map(|c| c.max).max();
        assert_eq!(max, Some(1_000));
        let spike = cols.iter().position(|c| c.is_some_and(|c| c.max == 1_000));
        assert_eq!(spike, Some(523)); // 654_321e3 ns of 1e9 ns, in 800 columns
        assert!(cols.iter().all(|c| c.is_some_and(|c| c.min == 0)));
    }

    #[test]
    fn downsampling_holds_values_between_changes() {
        // Two changes far apart: the columns between them hold the first value; columns before
        // the first change are empty.
        let cols = downsample(&[(250, 5), (500, 3), (501, 9), (750, 2)], 1000, 4);
        assert_eq!(cols[0], None);
        assert_eq!(cols[1], Some(flat(5)));
        assert_eq!(
            cols[2],
            Some(Column {
                first: 5,
                min: 3,
                max: 9,
                last: 9
            })
        );
        assert_eq!(
            cols[3],
            Some(Column {
                first: 9,
                min: 2,
                max: 9,
                last: 2
            })
        );
        // A spike within one column, back to where it started: still there.
        let cols = downsample(&[(0, 1), (10, 100), (11, 1)], 1000, 10);
        assert_eq!(cols[0].map(|c| c.max), Some(100));
        assert_eq!(cols[9], Some(flat(1)));
        assert!(downsample(&[], 10, 5).iter().all(Option::is_none));
        assert_eq!(downsample(&[(7, 1)], 0, 3)[0], Some(flat(1)));
    }

    #[test]
    fn axes() {
        assert_eq!(tick_bytes(0), "0");
        assert_eq!(tick_bytes(512), "512 B");
        assert_eq!(tick_bytes(384 << 20), "384 MiB");
        assert_eq!(tick_bytes(3 << 29), "1.5 GiB");
        assert_eq!(tick_bytes(u64::MAX), "16 EiB");
        let (step, top) = byte_axis(420 << 20);
        assert_eq!((step, top), (128 << 20, 512 << 20));
        let (step, top) = byte_axis(u64::MAX);
        assert!(step > 0 && top >= step);
        assert_eq!(byte_axis(0), (256, 1280));
        let (s, d) = time_axis(0.911);
        assert!((s - 0.1).abs() < 1e-12 && d == 1, "{s} {d}");
        let (s, d) = time_axis(37.0);
        assert!((s - 5.0).abs() < 1e-12 && d == 0, "{s} {d}");
    }

    #[test]
    fn escapes_xml() {
        assert_eq!(
            xml("a<b>&\"c\"'d'\u{1}\u{ffff}\té"),
            "a&lt;b&gt;&amp;&quot;c&quot;&apos;d&apos;\u{fffd}\u{fffd}\té"
        );
    }
}
