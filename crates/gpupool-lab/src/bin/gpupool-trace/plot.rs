//! `gpupool-trace plot`: allocated and reserved bytes over time as a self-contained SVG (no
//! script, no external resource), one panel per device.
//!
//! Each panel is a step plot of the two counters the fold computes, on a shared time axis in
//! seconds and a byte axis with power-of-two ticks in binary units. The plot has one column per
//! pixel; a column in which a counter changed several times shows their whole range (min to
//! max), so a peak survives however many records fall into one pixel, and the SVG stays small
//! for a trace of millions of records. The peaks are marked and labelled; failed allocations
//! show as red lines.

use std::fmt::Write as _;
use std::io::{self, Write};

use gpupool::pool::trace::{Kind, Record};
use gpupool::report::units::bytes;

use crate::fold::{devices, series, Fold, Sample};
use crate::svg::{byte_axis, downsample, grid, label, paths, xml, Area, FONT};

const WIDTH: u32 = 960;
const LEFT: u32 = 78;
const RIGHT: u32 = 28;
/// Title and legend.
const HEADER: u32 = 58;
/// A panel: its title line, the plot area, the time labels.
const PANEL_TITLE: u32 = 26;
const PLOT_HEIGHT: u32 = 200;
const PANEL_BOTTOM: u32 = 34;
const FOOTER: u32 = 26;

const RESERVED: &str = "#4e79a7";
const ALLOCATED: &str = "#e8762b";
const FAILED: &str = "#d62728";

struct Panel {
    device: u8,
    samples: Vec<Sample>,
    fold: Fold,
    failed: Vec<u64>,
}

/// A peak's marker (of radius `r`) and label. `below` puts the label under the marker.
struct Peak<'a> {
    t: u64,
    v: u64,
    color: &'a str,
    r: f64,
    text: String,
    below: bool,
}

fn peak_marker(out: &mut String, a: &Area, p: &Peak) {
    let Peak {
        t,
        v,
        color,
        r,
        ref text,
        below,
    } = *p;
    let (x, y) = (a.x(t), a.y(v));
    let anchor = if x < a.x0 + 70.0 {
        "start"
    } else if x > a.x0 + a.w - 70.0 {
        "end"
    } else {
        "middle"
    };
    let ly = if below { y + 17.0 } else { y - 8.0 };
    let _ = writeln!(
        out,
        r##"<circle cx="{x:.1}" cy="{y:.1}" r="{r}" fill="{color}" stroke="#fff" stroke-width="1.5"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{x:.1}" y="{ly:.1}" text-anchor="{anchor}" class="peak" fill="{color}">{}</text>"#,
        xml(text)
    );
}

fn panel(out: &mut String, p: &Panel, top: f64, t_end: u64) {
    let f = &p.fold;
    let (step, y_top) = byte_axis(f.peak_reserved.max(f.peak_allocated));
    let a = Area {
        x0: f64::from(LEFT),
        y0: top + f64::from(PANEL_TITLE),
        w: f64::from(WIDTH - LEFT - RIGHT),
        h: f64::from(PLOT_HEIGHT),
        t_end,
        y_top,
    };
    let (x1, y1) = (a.x0 + a.w, a.y0 + a.h);
    // Title line.
    label(
        out,
        a.x0,
        top + 17.0,
        "start",
        "ptitle",
        &format!("device {}", p.device),
    );
    let mut facts = format!(
        "peak reserved {} · peak allocated {} · {} allocations · {} segments · {} fences",
        bytes(f.peak_reserved),
        bytes(f.peak_allocated),
        f.allocs,
        f.segments,
        f.fences
    );
    if f.failed > 0 {
        let _ = write!(facts, " · {} failed", f.failed);
    }
    label(out, x1, top + 17.0, "end", "facts", &facts);
    grid(out, &a, step, 1e9);
    // Failed allocations.
    let mut last_x = f64::NEG_INFINITY;
    for &t in &p.failed {
        let x = a.x(t);
        if x - last_x >= 1.0 {
            let _ = writeln!(
                out,
                r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{y1:.1}" class="oom"/>"#,
                a.y0
            );
            last_x = x;
        }
    }
    // The counters.
    let columns = a.w as usize;
    let reserved: Vec<(u64, u64)> = p.samples.iter().map(|s| (s.t_ns, s.reserved)).collect();
    let allocated: Vec<(u64, u64)> = p.samples.iter().map(|s| (s.t_ns, s.allocated)).collect();
    let (r_line, r_area) = paths(&downsample(&reserved, t_end, columns), &a);
    let (a_line, a_area) = paths(&downsample(&allocated, t_end, columns), &a);
    let _ = writeln!(
        out,
        r#"<path d="{r_area}" fill="{RESERVED}" fill-opacity="0.16"/>"#
    );
    let _ = writeln!(
        out,
        r#"<path d="{a_area}" fill="{ALLOCATED}" fill-opacity="0.28"/>"#
    );
    let _ = writeln!(
        out,
        r#"<path d="{r_line}" fill="none" stroke="{RESERVED}" stroke-width="1.6" stroke-linejoin="round"/>"#
    );
    let _ = writeln!(
        out,
        r#"<path d="{a_line}" fill="none" stroke="{ALLOCATED}" stroke-width="1.3" stroke-linejoin="round"/>"#
    );
    // Plot frame.
    let _ = writeln!(
        out,
        r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" class="frame"/>"#,
        a.x0, a.y0, a.w, a.h
    );
    // Peaks: the allocated label goes below its marker when the two would collide.
    if f.records > 0 {
        let (rx, ry) = (a.x(f.peak_reserved_ns), a.y(f.peak_reserved));
        let (ax, ay) = (a.x(f.peak_allocated_ns), a.y(f.peak_allocated));
        let collide = (rx - ax).abs() < 150.0 && (ry - ay).abs() < 18.0;
        let below = collide && ay + 22.0 < y1;
        // The reserved marker is the larger: it stays visible when the peaks coincide.
        peak_marker(
            out,
            &a,
            &Peak {
                t: f.peak_reserved_ns,
                v: f.peak_reserved,
                color: RESERVED,
                r: 5.0,
                text: format!("peak reserved {}", bytes(f.peak_reserved)),
                below: false,
            },
        );
        peak_marker(
            out,
            &a,
            &Peak {
                t: f.peak_allocated_ns,
                v: f.peak_allocated,
                color: ALLOCATED,
                r: 3.2,
                text: format!("peak allocated {}", bytes(f.peak_allocated)),
                below,
            },
        );
    }
}

/// Writes the SVG for `records`; `source` (the trace's file name) goes into the title.
pub fn write(records: &[Record], source: &str, out: &mut dyn Write) -> io::Result<()> {
    let panels: Vec<Panel> = devices(records)
        .into_iter()
        .map(|d| {
            let (samples, fold) = series(records, d);
            let mut t = 0;
            let failed = records
                .iter()
                .filter(|r| r.device == d)
                .filter_map(|r| {
                    t = r.t_ns.max(t);
                    (r.kind == Kind::AllocFailed).then_some(t)
                })
                .collect();
            Panel {
                device: d,
                samples,
                fold,
                failed,
            }
        })
        .collect();
    let t_end = panels.iter().map(|p| p.fold.t_ns).max().unwrap_or(0).max(1);
    let any_failed = panels.iter().any(|p| !p.failed.is_empty());
    let panel_h = PANEL_TITLE + PLOT_HEIGHT + PANEL_BOTTOM;
    let n = u32::try_from(panels.len()).unwrap_or(u32::MAX).max(1);
    let height = HEADER + n.saturating_mul(panel_h) + FOOTER;

    let mut s = String::with_capacity(64 * 1024);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="{FONT}" font-size="12">"#
    );
    let title = format!("GPU memory over time: {source}");
    let _ = writeln!(s, "<title>{}</title>", xml(&title));
    let _ = writeln!(
        s,
        "<style>\
         .title{{font-size:16px;font-weight:600;fill:#222}}\
         .sub{{fill:#666}}\
         .ptitle{{font-size:13px;font-weight:600;fill:#222}}\
         .facts{{fill:#555}}\
         .tick{{font-size:11px;fill:#555}}\
         .legend{{fill:#333}}\
         .peak_ever(){{font-size:11.5px;font-weight:600;paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}}\
         .grid line{{stroke:#e9e9e9;stroke-width:1}}\
         .axis{{stroke:#999;stroke-width:1}}\
         .frame{{fill:none;stroke:#bbb;stroke-width:1}}\
         .oom{{stroke:{FAILED};stroke-width:1;stroke-dasharray:3 2}}\
         </style>"
    );
    let _ = writeln!(
        s,
        r##"<rect width="{WIDTH}" height="{height}" fill="#fff"/>"##
    );
    label(
        &mut s,
        f64::from(LEFT),
        24.0,
        "start",
        "title",
        "GPU memory over time",
    );
    label(&mut s, f64::from(LEFT), 43.0, "start", "sub", source);
    // Legend, right-aligned: swatch, text, for each series.
    let mut items = vec![
        (RESERVED, "reserved from the driver", false),
        (ALLOCATED, "allocated by the program", false),
    ];
    if any_failed {
        items.push((FAILED, "failed allocation", true));
    }
    let mut x = f64::from(WIDTH - RIGHT);
    for (color, text, dashed) in items.iter().rev() {
        // An estimate of the text's width at 12px: the legend only needs to not overlap.
        let w = text.chars().count() as f64 * 6.4;
        x -= w;
        label(&mut s, x, 29.0, "start", "legend", text);
        x -= 22.0;
        if *dashed {
            let _ = writeln!(
                s,
                r#"<line x1="{:.1}" y1="25" x2="{:.1}" y2="25" class="oom" style="stroke-width:2"/>"#,
                x,
                x + 16.0
            );
        } else {
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="19" width="16" height="11" rx="2" fill="{color}" fill-opacity="0.3" stroke="{color}" stroke-width="1.5"/>"#
            );
        }
        x -= 18.0;
    }
    if panels.is_empty() {
        label(
            &mut s,
            f64::from(WIDTH) / 2.0,
            f64::from(HEADER + panel_h / 2),
            "middle",
            "facts",
            "the trace holds no records",
        );
    }
    for (i, p) in panels.iter().enumerate() {
        let top = f64::from(HEADER) + i as f64 * f64::from(panel_h);
        let _ = writeln!(s, r#"<g class="panel" id="device-{}">"#, p.device);
        panel(&mut s, p, top, t_end);
        let _ = writeln!(s, "</g>");
    }
    label(
        &mut s,
        f64::from(LEFT) + f64::from(WIDTH - LEFT - RIGHT) / 2.0,
        f64::from(height) - 10.0,
        "middle",
        "sub",
        "time since the pool started (s)",
    );
    s.push_str("</svg>\n");
    out.write_all(s.as_bytes())?;
    out.flush()
}
