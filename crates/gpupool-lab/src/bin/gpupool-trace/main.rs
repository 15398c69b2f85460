//! `gpupool-trace`: read an allocation trace written with `GPUPOOL_TRACE=PATH`.
//!
//! ```text
//! gpupool-trace stats TRACE                      what the trace holds, per device
//! gpupool-trace replay TRACE [options]           replay it through the pool algorithm
//!     --threshold SIZE|none  --max-split SIZE|none  --fence-bytes SIZE
//!     --reuse strict|barrier|relaxed  --capacity SIZE  --limit SIZE|none
//!     --calls recorded|pluggable|uncached|async  (--one-stream: --calls pluggable)
//!     --expandable recorded|on|off|both  (both: with and without expandable segments)
//!     --slack PCT|none  (the mapped slack, GPUPOOL_EXPANDABLE_SLACK)
//! gpupool-trace perfetto TRACE [OUT.json]        Chrome/Perfetto trace-event JSON
//! gpupool-trace plot TRACE [OUT.svg]             allocated and reserved bytes over time, as SVG
//! gpupool-trace generate WORKLOAD [--seed N] [--out FILE]
//!     a workload's trace: training[:STEPS], inference[:REQUESTS], random[:MAX_SIZE[:OPS]]
//! gpupool-trace compare (WORKLOAD|TRACE)... [--seed N] [--threshold SIZE] [--capacity SIZE]
//!     [--reuse MODE] [--svg-dir DIR] [--min-time SECONDS]
//!     every policy side by side on each, as Markdown tables
//! ```
//!
//! Output goes to stdout unless OUT is given. Any error (arguments, an unreadable or corrupt
//! trace, a failed write) gives a message on stderr and exit code 2; a reader of stdout that
//! stops early (`| head`) is not an error. `-h`/`--help` anywhere prints the usage.

mod chart;
mod compare;
mod fold;
mod perfetto;
mod plot;
mod svg;
mod text;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;

use gpupool::pool::trace::{self, Record, MAGIC, RECORD_SIZE};

const USAGE: &str = "usage: gpupool-trace stats TRACE
       gpupool-trace replay TRACE [--threshold SIZE|none] [--max-split SIZE|none]
                                  [--fence-bytes SIZE] [--reuse strict|barrier|relaxed]
                                  [--capacity SIZE] [--limit SIZE|none]
                                  [--calls recorded|pluggable|uncached|async] [--one-stream]
                                  [--expandable recorded|on|off|both] [--slack PCT|none]
       gpupool-trace perfetto TRACE [OUT.json]   (trace-event JSON for ui.perfetto.dev)
       gpupool-trace plot TRACE [OUT.svg]        (allocated and reserved bytes over time)
       gpupool-trace generate WORKLOAD [--seed N] [--out FILE]
       gpupool-trace compare (WORKLOAD|TRACE)... [--seed N] [--threshold SIZE|none]
                             [--capacity SIZE] [--reuse strict|barrier|relaxed]
                             [--svg-dir DIR] [--min-time SECONDS]
  WORKLOAD: training[:STEPS] | inference[:REQUESTS] | random[:MAX_SIZE[:OPS]]";

enum Error {
    /// The command line is wrong: the message and the usage.
    Usage(String),
    /// Anything else: the message alone.
    Other(String),
    /// Whoever read stdout stopped (`| head`): nothing more to do, and nothing wrong.
    ReaderGone,
}

/// A failed write to `to`.
fn written(e: io::Error, to: &str) -> Error {
    if to == "stdout" && e.kind() == io::ErrorKind::BrokenPipe {
        Error::ReaderGone
    } else {
        Error::Other(format!("writing {to}: {e}"))
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) | Err(Error::ReaderGone) => ExitCode::SUCCESS,
        Err(Error::Usage(e)) => {
            eprintln!("gpupool-trace: {e}\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Error::Other(e)) => {
            eprintln!("gpupool-trace: {e}");
            ExitCode::from(2)
        }
    }
}

/// Whether two paths name one file: the same path another way, a symbolic link or a hard link.
fn same_file(a: &str, b: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        _ => false,
    }
}

/// Reads and parses a trace. A record cut short at the end (a process killed while the library
/// wrote a chunk) is left out with a warning, as the library's parser does.
fn load(path: &str) -> Result<Vec<Record>, Error> {
    let data = std::fs::read(path).map_err(|e| Error::Other(format!("{path}: {e}")))?;
    let records = trace::parse(&data).map_err(|e| {
        Error::Other(format!(
            "{path}: {e}{}",
            if data.len() < MAGIC.len() && MAGIC.starts_with(&data) {
                " (the file is empty or cut short)"
            } else {
                ""
            }
        ))
    })?;
    let tail = data.len().saturating_sub(MAGIC.len()) % RECORD_SIZE;
    if tail != 0 {
        eprintln!(
            "gpupool-trace: {path}: warning: the trace ends with {tail} bytes of a cut-off \
             record (the process was probably killed while writing it); ignored"
        );
    }
    Ok(records)
}

/// Where a command's output goes: the file named, or stdout.
fn output(path: Option<&String>) -> Result<(Box<dyn Write>, String), Error> {
    match path {
        None => Ok((
            Box::new(BufWriter::new(io::stdout().lock())),
            "stdout".into(),
        )),
        Some(p) => {
            let f = File::create(p).map_err(|e| Error::Other(format!("{p}: {e}")))?;
            Ok((Box::new(BufWriter::new(f)), p.clone()))
        }
    }
}

/// The usage on stdout, asked for: a failed write is an error like any other output's.
fn usage() -> Result<(), Error> {
    let mut out = io::stdout().lock();
    writeln!(out, "{USAGE}")
        .and_then(|()| out.flush())
        .map_err(|e| written(e, "stdout"))
}

/// `generate` and `compare`, which take workloads as well as traces.
fn run_workloads(cmd: &str, args: &[String]) -> Result<(), Error> {
    if cmd == "generate" {
        let (bytes, out) = compare::generate(args).map_err(Error::Usage)?;
        let (mut w, to) = output(out.as_ref())?;
        return w
            .write_all(&bytes)
            .and_then(|()| w.flush())
            .map_err(|e| written(e, &to));
    }
    let (sources, o) = compare::options(args).map_err(Error::Usage)?;
    if let Some(dir) = &o.svg_dir {
        std::fs::create_dir_all(dir).map_err(|e| Error::Other(format!("{dir}: {e}")))?;
    }
    let mut all = Vec::new();
    let (mut out, to) = output(None)?;
    for source in &sources {
        for (title, w) in compare::load(source, o.seed).map_err(Error::Other)? {
            let w = compare::with_reuse(w, o.reuse);
            let c = compare::compare(&title, &w, &o);
            out.write_all(compare::markdown(&c).as_bytes())
                .and_then(|()| out.write_all(b"\n"))
                .and_then(|()| out.flush())
                .map_err(|e| written(e, &to))?;
            if let Some(dir) = &o.svg_dir {
                let file: String = title
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                    .collect();
                let path = Path::new(dir).join(format!("{file}.svg"));
                let svg = compare::chart(&title, &w, o.threshold);
                std::fs::write(&path, svg).map_err(|e| written(e, &path.display().to_string()))?;
            }
            all.push(c);
        }
    }
    out.write_all(compare::against_torch(&all).as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.write_all(compare::against_torch_expandable(&all).as_bytes()))
        .and_then(|()| out.flush())
        .map_err(|e| written(e, &to))
}

fn run(args: &[String]) -> Result<(), Error> {
    if args.iter().any(|a| matches!(a.as_str(), "-h" | "--help")) {
        return usage();
    }
    if let Some((cmd, rest)) = args.split_first() {
        if matches!(cmd.as_str(), "generate" | "compare") {
            return run_workloads(cmd, rest);
        }
    }
    let (cmd, path, rest) = match args {
        [cmd, path, rest @ ..] => (cmd.as_str(), path, rest),
        [cmd] if cmd == "help" => return usage(),
        _ => return Err(Error::Usage("missing arguments".into())),
    };
    if !matches!(cmd, "stats" | "replay" | "perfetto" | "plot") {
        return Err(Error::Usage(format!("unknown command {cmd:?}")));
    }
    let (text, dest): (Option<String>, Option<&String>) = match cmd {
        "stats" => {
            if let Some(extra) = rest.first() {
                return Err(Error::Usage(format!("unexpected argument {extra:?}")));
            }
            (Some(text::stats(&load(path)?)), None)
        }
        "replay" => {
            let o = text::overrides(rest).map_err(Error::Usage)?;
            (Some(text::replay(&load(path)?, &o)), None)
        }
        _ => match rest {
            [] => (None, None),
            [out] => (None, Some(out)),
            [_, extra, ..] => return Err(Error::Usage(format!("unexpected argument {extra:?}"))),
        },
    };
    if let Some(t) = text {
        let (mut out, to) = output(None)?;
        return out
            .write_all(t.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| written(e, &to));
    }
    if let Some(out) = dest {
        if same_file(path, out) {
            return Err(Error::Usage(format!(
                "the output {out:?} is the trace itself (it would be overwritten)"
            )));
        }
    }
    // Parse before creating the output, so a bad trace leaves no empty file behind.
    let records = load(path)?;
    let source = Path::new(path)
        .file_name()
        .map_or_else(|| path.clone(), |n| n.to_string_lossy().into_owned());
    let (mut out, to) = output(dest)?;
    let result = match cmd {
        "perfetto" => perfetto::write(&records, &source, &mut out),
        _ => plot::write(&records, &source, &mut out),
    };
    result.map_err(|e| written(e, &to))
}
