//! The live dump: `SIGUSR1` and the periodic summary while the program runs, and the signals the
//! pool leaves to the program.

use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::time::{Duration, Instant};

use super::*;

/// A started program whose stdout and stderr are read by threads.
struct Running {
    child: Child,
    stdout: std::sync::mpsc::Receiver<String>,
    stderr: std::thread::JoinHandle<String>,
}

impl Running {
    fn start(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Running {
        let mut child = pooled(exe, args, env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start program");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Running {
            child,
            stdout: rx,
            stderr,
        }
    }

    /// Waits for the line `want` on stdout.
    fn wait_for_line(&self, want: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) if line == want => return,
                Ok(_) => {}
                Err(e) => panic!("no {want:?} on stdout: {e}"),
            }
        }
    }

    /// Waits for the exit (killing the program and failing after `timeout`); asserts status 0;
    /// returns (the rest of stdout, stderr).
    fn finish(mut self, timeout: Duration) -> (String, String) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "still running after {timeout:?} (deadlock?); stderr so far:\n{}",
                    self.stderr.join().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = self.stderr.join().unwrap();
        let out: Vec<String> = self.stdout.iter().collect();
        let out = out.join("\n") + "\n";
        assert!(
            status.success(),
            "{status}:\n--- stdout\n{out}\n--- stderr\n{err}"
        );
        (out, err)
    }
}

/// Splits stderr holding only text summaries into them, asserting each is whole: header, one
/// block per device with every line, closing rule. Returns each one's device-0 calls line.
fn summaries(err: &str) -> Vec<(u64, u64, u64, u64)> {
    let rule = "=".repeat(78);
    let start = format!("{rule}\n gpupool summary   pid ");
    let mut rest = err;
    let mut out = Vec::new();
    while !rest.is_empty() {
        assert!(
            rest.starts_with(&start),
            "stderr holds something other than whole summaries here:\n{}\n--- all of stderr\n{err}",
            &rest[..rest.len().min(400)]
        );
        let end = rest[1..].find(&start).map_or(rest.len(), |i| i + 1);
        let block = &rest[..end];
        assert!(
            block.ends_with(&format!("\n{rule}\n")),
            "torn summary:\n{block}"
        );
        let devices = text_devices(block);
        assert_eq!(devices.keys().copied().collect::<Vec<_>>(), [0], "{block}");
        let d = &devices[&0];
        for line in [
            " metric ",
            " requested memory ",
            " allocated memory ",
            " reserved (from driver) ",
            " allocations ",
            " segments ",
            " cached ",
            " expandable ",
            " calls ",
            " driver ",
            " in flight ",
            " released ",
            " out of mem ",
        ] {
            assert!(
                d.lines().any(|l| l.starts_with(line)),
                "no line {line:?} in:\n{block}"
            );
        }
        out.push(calls_line(d));
        rest = &rest[end..];
    }
    out
}

/// Blocks the program never freed: the exit summary lists them by size, and the JSON counts
/// them.
#[test]
fn the_exit_summary_lists_what_the_program_never_freed() {
    let (_, out, err) = run_ok(&c_program("leak"), &[], &[("GPUPOOL_SUMMARY", "stderr")]);
    assert!(out.contains("leak ok"), "{out}");
    let want = format!(
        " still allocated at exit: 4 blocks, {} requested\n   {:>8} x {}\n   {:>8} x {}\n",
        human(2 * MIB + 8192),
        2,
        human(MIB),
        2,
        human(4096)
    );
    assert!(err.contains(&want), "want {want:?} in:\n{err}");
    let dir = scratch("report-leak");
    let path = dir.join("s.json");
    run_ok(
        &c_program("leak"),
        &[],
        &[("GPUPOOL_SUMMARY", path.to_str().unwrap())],
    );
    let v = read_json(&path);
    let d = &v["devices"][0];
    assert_eq!(u(d, "/still_allocated/blocks"), 4, "{d}");
    // A reset drops the four: the totals out count them, and the text says so.
    let (_, _, err) = run_ok(
        &c_program("leak"),
        &["reset"],
        &[("GPUPOOL_SUMMARY", "stderr")],
    );
    assert!(err.contains(" calls      7 mallocs, 2 frees;"), "{err}");
    assert_eq!(text_row(&err, "allocations"), ["1", "5", "7", "6"], "{err}");
    assert!(
        err.contains(" total freed includes what 1 device reset dropped"),
        "{err}"
    );
    assert!(
        err.contains(" still allocated at exit: 1 block, 1.00 MiB requested"),
        "{err}"
    );
    assert_eq!(
        u(d, "/still_allocated/requested_bytes"),
        2 * MIB + 8192,
        "{d}"
    );
}

#[test]
fn sigusr1_during_an_allocation_storm_dumps_whole_summaries_without_deadlock() {
    let run = Running::start(
        &c_program("storm"),
        &["1600", "4"],
        &[("GPUPOOL_SUMMARY", "stderr")],
    );
    run.wait_for_line("ready", Duration::from_secs(10));
    let pid = run.child.id() as libc::pid_t;
    for _ in 0..10 {
        // SAFETY: signalling our own child, which has not been waited for yet.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0);
        std::thread::sleep(Duration::from_millis(100));
    }
    let (out, err) = run.finish(Duration::from_secs(20));
    assert!(out.contains("storm ok"), "{out}");
    let program = figure(&out, "program mallocs");
    let all = summaries(&err);
    // Ten signals make at most ten dumps (several pending at once make one), plus the exit
    // summary; at least one dump happened during the second of signals.
    assert!(
        (2..=11).contains(&all.len()),
        "{} summaries:\n{err}",
        all.len()
    );
    // Live dumps see the counts grow; the exit summary has everything given back.
    assert!(all.windows(2).all(|w| w[0].0 <= w[1].0), "{all:?}");
    for &(mallocs, frees, hits, misses) in &all {
        assert!(frees <= mallocs && hits + misses == mallocs, "{all:?}");
    }
    let last = *all.last().unwrap();
    assert_eq!((last.0, last.1), (program, program), "{err}");
    // A live dump lists the blocks held as allocated now, never as left at exit (found in
    // review); at exit there are none.
    assert!(err.contains(" allocated now: "), "{err}");
    assert!(!err.contains("still allocated at exit"), "{err}");
}

#[test]
fn the_periodic_summary_is_written_while_the_program_runs() {
    let dir = scratch("report-interval");
    let path = dir.join("live.json");
    let mut run = Running::start(
        &c_program("storm"),
        &["1200", "4"],
        &[
            ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
            ("GPUPOOL_SUMMARY_INTERVAL", "200ms"),
        ],
    );
    run.wait_for_line("ready", Duration::from_secs(10));
    let started = Instant::now();
    let mut seen = Vec::new();
    while run.child.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(20) {
        if let Ok(text) = std::fs::read_to_string(&path) {
            // Written atomically: whatever is there is a whole summary.
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("partial summary ({e}):\n{text}"));
            let allocs = u(&v, "/devices/0/allocations");
            if seen.last() != Some(&allocs) {
                seen.push(allocs);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (out, err) = run.finish(Duration::from_secs(20));
    assert!(err.is_empty(), "{err}");
    assert!(
        !seen.is_empty(),
        "no summary appeared while the program ran"
    );
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    // At exit, the final numbers.
    let program = figure(&out, "program mallocs");
    let v = read_json(&path);
    let d = &v["devices"][0];
    check_json_device_at_exit(d);
    assert_eq!(u(d, "/allocations"), program);
    assert!(seen.iter().all(|&n| n <= program));
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["live.json"]);
}

#[test]
fn a_program_that_handles_sigusr1_itself_keeps_it() {
    for mode in ["handle", "ignore"] {
        let (_, out, err) = run_ok(&c_program("own_sigusr1"), &[mode], &[]);
        assert_eq!(out, "own handler ok\n");
        assert!(err.is_empty(), "{mode}: a summary was dumped:\n{err}");
        // With a summary asked for: only the one at exit.
        let (_, _, err) = run_ok(
            &c_program("own_sigusr1"),
            &[mode],
            &[("GPUPOOL_SUMMARY", "stderr")],
        );
        assert_eq!(summaries(&err), [(2, 2, 1, 1)], "{mode}");
    }
}

/// A child forked after the pool took `SIGUSR1` has no dump thread: the signal ends it, as it
/// would without the pool (the program never handled it), rather than being swallowed.
#[test]
fn sigusr1_ends_a_forked_child_as_it_would_without_the_pool() {
    let exe = c_program("fork_usr1");
    let without = support::ok(&mut support::unpooled(&exe, &[], &[])).0;
    assert_eq!(without, "child killed by signal 10\n");
    for env in [&[][..], &[("GPUPOOL_SUMMARY", "stderr")][..]] {
        let (_, out, err) = run_ok(&exe, &[], env);
        assert_eq!(out, without, "{env:?}\n{err}");
    }
}

/// The live-dump thread takes none of the program's signals: a program that blocks SIGTERM
/// and waits for it with `sigwait` still gets it (a thread that inherited the mask of the first
/// allocating thread would take the signal, and the process would die of it).
#[test]
fn the_dump_thread_takes_none_of_the_programs_signals() {
    for env in [
        &[][..],
        &[
            ("GPUPOOL_SUMMARY_INTERVAL", "1s"),
            ("GPUPOOL_SUMMARY", "stderr"),
        ][..],
    ] {
        let (_, out, _) = run_ok(&c_program("sigwait"), &[], env);
        assert_eq!(out, "sigwait got SIGTERM\n", "{env:?}");
    }
}

/// Where the live-dump thread cannot start (no thread may be created), `SIGUSR1` ends the
/// program as it would without the pool: the pool leaves the signal to it, rather than taking it
/// for a dump that never comes.
#[test]
fn sigusr1_ends_a_program_that_may_start_no_thread_as_it_would_without_the_pool() {
    use std::os::unix::process::ExitStatusExt;
    let exe = c_program("no_threads_usr1");
    let without = support::unpooled(&exe, &[], &[]).output().unwrap();
    assert_eq!(without.status.signal(), Some(libc::SIGUSR1));
    let with = pooled(&exe, &[], &[]).output().unwrap();
    let (out, err) = support::texts(&with);
    assert_eq!(with.status.signal(), Some(libc::SIGUSR1), "{out}{err}");
}
