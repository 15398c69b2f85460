//! The live dump: the summary written while the program runs (on `SIGUSR1` and every
//! `GPUPOOL_SUMMARY_INTERVAL`, from the thread `lifecycle::dump_thread` starts), and its order
//! with the exit summary.

use std::sync::Mutex;

use crate::config::SummaryDest;

/// Held while a summary is collected and written; `true` once the exit summary was. A dump in
/// progress at exit finishes before the exit summary is collected, and none starts after it, so
/// the last summary written holds the final numbers and none is cut off when the process ends.
static WRITING: Mutex<bool> = Mutex::new(false);

/// Run `write` (the exit summary) after any dump in progress, and stop later dumps.
pub fn last_write(write: impl FnOnce()) {
    let mut done = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    *done = true;
    write();
}

/// Write the summary now, to `GPUPOOL_SUMMARY`'s destination or stderr when there is none.
pub fn dump(src: &super::Source) {
    let Some(pool) = src.pool else { return };
    let done = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return;
    }
    pool.flush_trace();
    let dest = match &src.config.summary {
        SummaryDest::Off => SummaryDest::Stderr,
        d => d.clone(),
    };
    let report =
        super::summary::Report::collect(pool, src.runtime_path, crate::pool::LockWait::Brief);
    super::write_to(
        &dest,
        super::render(&report, super::Format::of(&dest)).as_bytes(),
    );
}
