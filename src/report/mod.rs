//! What the pool tells its user: the summary (at exit, on `SIGUSR1`, periodically), the
//! out-of-memory report, and the trace file.

pub mod dump;
mod holders;
pub mod json;
pub mod oom;
pub mod prometheus;
pub mod summary;
pub mod trace_file;
pub mod units;
pub mod unloaded;

use crate::config::{Config, SummaryDest};
use crate::cuda::backend::CudaBackend;
use crate::log;
use crate::pool::Pool;

/// What a report reads of the process: the pool (none when it is off or in a forked child),
/// the configuration, and the path of the runtime in use.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    pub pool: Option<&'a Pool<CudaBackend>>,
    pub config: &'a Config,
    pub runtime_path: &'a str,
}

/// The summary's form, chosen by the destination's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Prometheus,
}

impl Format {
    pub fn of(dest: &SummaryDest) -> Format {
        match dest {
            SummaryDest::Path(p) if p.ends_with(b".json") => Format::Json,
            SummaryDest::Path(p) if p.ends_with(b".prom") => Format::Prometheus,
            _ => Format::Text,
        }
    }
}

pub fn render(r: &summary::Report, format: Format) -> String {
    match format {
        Format::Text => summary::render_text(r),
        Format::Json => json::render_json(r),
        Format::Prometheus => prometheus::render_prometheus(r),
    }
}

/// Write the exit summary to `dest`. Only a process that allocated through the hooks (served by
/// the pool or passed through to CUDA) writes one, unless `GPUPOOL_SUMMARY=always:...`.
fn write_summary(src: &Source, dest: &SummaryDest) {
    let Some(pool) = src.pool else {
        // Off (`GPUPOOL_DISABLE=1`): nothing to count, but `always:` still gets its one line.
        if src.config.summary_always && src.config.disable {
            write_none_intercepted(
                dest,
                &format!(
                    "the pool is disabled (GPUPOOL_DISABLE=1): every call went to {}",
                    src.runtime_path
                ),
            );
        }
        return;
    };
    let mut report = summary::Report::collect(pool, src.runtime_path, crate::pool::LockWait::Brief);
    report.at_exit = true;
    if report.allocated() {
        write_to(dest, render(&report, Format::of(dest)).as_bytes());
    } else if src.config.summary_always {
        // The pool started (a hooked call reached it) but saw no allocation: the same
        // answer, with its likely cause, as when it never started.
        write_not_intercepted(dest);
    }
}

/// Write the summary where `GPUPOOL_SUMMARY` says, if it says anything; after it, no live dump.
pub fn write_exit_summary(src: &Source) {
    dump::last_write(|| {
        if src.config.summary != SummaryDest::Off {
            write_summary(src, &src.config.summary);
        }
    });
}

/// `GPUPOOL_SUMMARY=always:...` in a process where the pool never started (no CUDA call reached
/// it): say so, and why that may be. Runs at exit; makes no CUDA call.
pub fn write_not_intercepted(dest: &SummaryDest) {
    write_none_intercepted(dest, &not_intercepted_why());
}

/// Why no allocation reached the pool, as far as the loaded libraries tell.
fn not_intercepted_why() -> String {
    let loaded = crate::cuda::loader::loaded_runtimes();
    if loaded.is_empty() {
        "no CUDA runtime was loaded dynamically and no driver allocation reached libgpupool: \
         the program does not use CUDA, or the driver hooks were off (GPUPOOL_DRIVER_HOOKS=0, \
         or a platform without the dlsym hook: only x86-64 Linux has it)"
            .to_string()
    } else {
        format!(
            "a CUDA runtime was loaded ({}) but no cudaMalloc reached libgpupool: the program \
             allocates otherwise (cudaMallocManaged, CUDA virtual memory management), or \
             the driver hooks were off (GPUPOOL_DRIVER_HOOKS=0)",
            loaded.join(", ")
        )
    }
}

/// The one `always:` line (or JSON object, or metric) saying no allocation went through the
/// pool, and `why`. Never over a summary another process wrote since this one started: a
/// wrapper (`bash -c`, `timeout`, `time`) inherits the preload and exits after its program.
fn write_none_intercepted(dest: &SummaryDest, why: &str) {
    if let SummaryDest::Path(template) = dest {
        if written_since_start(&expand_path(template)) {
            return;
        }
    }
    write_to(dest, none_intercepted(Format::of(dest), why).as_bytes());
}

/// The summary of a process the pool did not serve, saying `why`, in `format`.
pub fn none_intercepted(format: Format, why: &str) -> String {
    match format {
        Format::Json => format!(
            "{{\"gpupool_version\":{},\"pid\":{},\"rank\":{},\"host\":{},\"intercepted\":false,\"reason\":{},\"devices\":[]}}\n",
            json::quote(env!("CARGO_PKG_VERSION")),
            std::process::id(),
            json::quote(&rank()),
            json::quote(&hostname()),
            json::quote(why)
        ),
        Format::Prometheus => format!(
            "# HELP gpupool_intercepted Whether any CUDA allocation went through libgpupool.\n\
             # TYPE gpupool_intercepted gauge\n\
             gpupool_intercepted{{rank=\"{}\",pid=\"{}\"}} 0\n",
            rank(),
            std::process::id()
        ),
        Format::Text => format!(
            "gpupool summary   pid {}: no CUDA allocations were intercepted: {why}\n",
            std::process::id()
        ),
    }
}

/// Whether `path` is a regular file last modified after this process started (a file older
/// than that was left by an earlier run).
fn written_since_start(path: &[u8]) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Some(start) = crate::load_time::loaded_at() else {
        return false;
    };
    std::fs::symlink_metadata(std::ffi::OsStr::from_bytes(path))
        .and_then(|m| Ok(m.is_file() && m.modified()? >= start))
        .unwrap_or(false)
}

pub(crate) fn write_to(dest: &SummaryDest, bytes: &[u8]) {
    match dest {
        SummaryDest::Off => {}
        SummaryDest::Stderr => {
            flush_program_output();
            log::write_stream(log::Stream::Stderr, bytes);
        }
        SummaryDest::Stdout => {
            flush_program_output();
            log::write_stream(log::Stream::Stdout, bytes);
        }
        SummaryDest::Descriptor(fd) => {
            flush_program_output();
            let written = log::write_summary_descriptor(*fd, bytes);
            warn_unless_reader_left(written, || format!("/dev/fd/{fd}"));
        }
        SummaryDest::Path(template) => {
            let path = expand_path(template);
            let written = crate::pool::cancel::uncancellable(|| write_atomically(&path, bytes));
            warn_unless_reader_left(written, || String::from_utf8_lossy(&path).into_owned());
        }
    }
}

/// Let the program's buffered output go first: at exit, stdio is flushed only after the exit
/// handlers ran, so with stdout a file or a pipe (also one shared with stderr: `> log 2>&1`,
/// or a descriptor on stdout's file) the summary came before the program's last lines.
fn flush_program_output() {
    // SAFETY: fflush(NULL) flushes every open stdio stream.
    crate::pool::cancel::uncancellable(|| unsafe { libc::fflush(std::ptr::null_mut()) });
}

/// One warning for a summary not written to `name`. A reader that left a pipe is not worth a
/// line: it chose to stop reading.
fn warn_unless_reader_left(written: std::io::Result<()>, name: impl FnOnce() -> String) {
    match written {
        Err(e) if e.raw_os_error() != Some(libc::EPIPE) => {
            log::warn(&format!("cannot write the summary to {}: {e}", name()))
        }
        _ => {}
    }
}

/// `%p` → pid, `%r` → rank (`RANK`, `LOCAL_RANK`, `SLURM_PROCID`, else 0), `%h` → host name,
/// `%%` → `%`.
pub fn expand_path(template: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(template.len() + 16);
    let mut it = template.iter().copied().peekable();
    while let Some(c) = it.next() {
        if c != b'%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some(b'p') => out.extend(std::process::id().to_string().bytes()),
            Some(b'r') => out.extend(rank().bytes()),
            Some(b'h') => out.extend(hostname().bytes()),
            Some(b'%') => out.push(b'%'),
            Some(other) => {
                out.push(b'%');
                out.push(other);
            }
            None => out.push(b'%'),
        }
    }
    out
}

pub(crate) fn rank() -> String {
    ["RANK", "LOCAL_RANK", "SLURM_PROCID"]
        .iter()
        .find_map(|v| {
            std::env::var(v)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        })
        .unwrap_or_else(|| "0".into())
}

pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or
    // truncates, and we stop at the first NUL.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(0);
    if ok && end > 0 {
        String::from_utf8_lossy(&buf[..end]).replace('/', "_")
    } else {
        "localhost".into()
    }
}

/// Write to a temporary file beside `path`, then rename over it: readers never see a partial
/// file, and a symbolic link at `path` is replaced, never written through. Where no temporary
/// file may be made, a regular file at `path` that the program may write is written in place.
/// A device, FIFO or socket at `path` (`/dev/null`, `/dev/full`, a named pipe a collector
/// reads) is written to as it is, never replaced: renaming over `/dev/null` as root would break
/// the machine.
fn write_atomically(path: &[u8], bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path));
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        let t = meta.file_type();
        if t.is_char_device() || t.is_block_device() || t.is_fifo() || t.is_socket() {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
                .open(path)?;
            // Not `File::write_all`: a FIFO whose reader left would raise SIGPIPE.
            return log::write_all_fd(std::os::fd::AsRawFd::as_raw_fd(&f), bytes);
        }
    }
    // Unique per write: a periodic dump and the exit summary may overlap.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}.{n}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    })();
    match result {
        // No temporary file allowed beside it (a directory the program may not write, where
        // ops made the file for it): the file itself, if it is one the program may write, is
        // written in place. A reader may then see it half written.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let _ = std::fs::remove_file(&tmp);
            let regular = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file());
            if !regular {
                return Err(e);
            }
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path)
                .map_err(|_| e)?;
            f.write_all(bytes)?;
            f.sync_data()
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
        Ok(()) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_expansion() {
        let pid = std::process::id().to_string();
        assert_eq!(
            expand_path(b"/x/job-%p.txt"),
            format!("/x/job-{pid}.txt").into_bytes()
        );
        assert_eq!(expand_path(b"100%%-%q-%"), b"100%-%q-%".to_vec());
        assert!(!expand_path(b"%h").contains(&b'/'));
    }

    #[test]
    fn atomic_write_replaces_a_symlink_instead_of_following_it() {
        let dir = std::env::temp_dir().join(format!("gpupool-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("victim");
        std::fs::write(&target, b"keep").unwrap();
        let link = dir.join("summary.txt");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        use std::os::unix::ffi::OsStrExt;
        write_atomically(link.as_os_str().as_bytes(), b"report").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert_eq!(std::fs::read(&link).unwrap(), b"report");
        assert!(!std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
