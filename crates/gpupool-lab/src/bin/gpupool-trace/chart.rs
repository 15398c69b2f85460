//! `compare --svg-dir`: reserved bytes over the workload, one line per policy, beside the bytes
//! the program held (requested), as a self-contained SVG. The x axis counts operations
//! (allocations and frees), which every policy replays alike.

use std::fmt::Write as _;

use gpupool::report::units::bytes;

use crate::svg::{byte_axis, downsample, grid, label, paths, xml, Area, FONT};

const WIDTH: u32 = 960;
const LEFT: u32 = 78;
const RIGHT: u32 = 28;
const TOP: u32 = 96;
const HEIGHT: u32 = 300;
const BOTTOM: u32 = 44;
const COLORS: [&str; 6] = [
    "#4e79a7", "#59a14f", "#e15759", "#b07aa1", "#9c755f", "#f28e2b",
];
const REQUESTED: &str = "#888888";

/// One line: its name, its `(operation, bytes)` changes, and its peak.
pub struct Line {
    pub name: String,
    pub points: Vec<(u64, u64)>,
}

/// The SVG of `lines` over `ops` operations, with `requested` drawn as a grey area.
pub fn svg(title: &str, ops: u64, requested: &[(u64, u64)], lines: &[Line]) -> String {
    let peak = |pts: &[(u64, u64)]| pts.iter().map(|p| p.1).max().unwrap_or(0);
    // A line far above the others (the exact-size cache) would flatten them all: the axis
    // stops at three times the next highest peak, and that line runs along the top (its
    // legend entry gives its peak).
    let mut peaks: Vec<u64> = lines
        .iter()
        .map(|l| peak(&l.points))
        .chain([peak(requested)])
        .collect();
    peaks.sort_unstable();
    let top = match peaks.as_slice() {
        [.., second, first] if *first / 3 > *second => second.saturating_mul(3),
        [.., first] => *first,
        [] => 0,
    };
    let (step, y_top) = byte_axis(top);
    let height = TOP + HEIGHT + BOTTOM;
    let a = Area {
        x0: f64::from(LEFT),
        y0: f64::from(TOP),
        w: f64::from(WIDTH - LEFT - RIGHT),
        h: f64::from(HEIGHT),
        t_end: ops.max(1),
        y_top,
    };
    let mut s = String::with_capacity(64 * 1024);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="{FONT}" font-size="12">"#
    );
    let _ = writeln!(s, "<title>{}</title>", xml(title));
    let _ = writeln!(
        s,
        "<style>.title{{font-size:16px;font-weight:600;fill:#222}}.sub{{fill:#666}}\
         .tick{{font-size:11px;fill:#555}}.legend{{fill:#333}}\
         .grid line{{stroke:#e9e9e9;stroke-width:1}}.axis{{stroke:#999;stroke-width:1}}\
         .frame{{fill:none;stroke:#bbb;stroke-width:1}}</style>"
    );
    let _ = writeln!(
        s,
        r##"<rect width="{WIDTH}" height="{height}" fill="#fff"/>"##
    );
    label(&mut s, a.x0, 24.0, "start", "title", title);
    label(
        &mut s,
        a.x0,
        43.0,
        "start",
        "sub",
        "reserved bytes per policy (coinciding lines hide each other); grey: bytes the program holds",
    );
    // Legend: two rows of up to four entries.
    let mut entries: Vec<(String, &str)> = vec![(
        format!("requested (peak {})", bytes(peak(requested))),
        REQUESTED,
    )];
    for (i, l) in lines.iter().enumerate() {
        entries.push((
            format!("{} (peak {})", l.name, bytes(peak(&l.points))),
            COLORS[i % COLORS.len()],
        ));
    }
    for (i, (text, color)) in entries.iter().enumerate() {
        let x = a.x0 + (i % 3) as f64 * 270.0;
        let y = 62.0 + (i / 3) as f64 * 16.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x:.1}" y="{:.1}" width="14" height="4" fill="{color}"/>"#,
            y - 6.0
        );
        label(&mut s, x + 20.0, y, "start", "legend", text);
    }
    grid(&mut s, &a, step, 1.0);
    let columns = a.w as usize;
    let (_, area) = paths(&downsample(requested, a.t_end, columns), &a);
    let _ = writeln!(
        s,
        r#"<path d="{area}" fill="{REQUESTED}" fill-opacity="0.25"/>"#
    );
    // Drawn last to first, so the first policy (ours) lies on top where lines coincide.
    for (i, l) in lines.iter().enumerate().rev() {
        let (line, _) = paths(&downsample(&l.points, a.t_end, columns), &a);
        let _ = writeln!(
            s,
            r#"<path d="{line}" fill="none" stroke="{}" stroke-width="1.5" stroke-linejoin="round"/>"#,
            COLORS[i % COLORS.len()]
        );
    }
    let _ = writeln!(
        s,
        r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" class="frame"/>"#,
        a.x0, a.y0, a.w, a.h
    );
    label(
        &mut s,
        a.x0 + a.w / 2.0,
        f64::from(height) - 8.0,
        "middle",
        "sub",
        "operations (allocations and frees)",
    );
    s.push_str("</svg>\n");
    s
}
