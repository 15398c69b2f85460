//! Where the pool's own writes go, and what they must never do: kill the program with
//! `SIGPIPE` when the reader of its stderr left (`./job 2>&1 | head -1`), write into a data file
//! that took over fd 2, let a wrapper process replace the summary of the program it ran, or take
//! a keyword in another case for a file name. C programs (`tests/c/writes.c`) run under
//! `LD_PRELOAD=libgpupool.so` against the CUDA runtime simulator.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, SystemTime};

use support::{c_program, output_within, output_within_stderr, pooled, scratch, texts};

/// The write end of a pipe whose read end is already closed: any write to it fails with `EPIPE`
/// and raises `SIGPIPE` in the writing thread.
fn reader_gone() -> Stdio {
    let mut fds = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 returns.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just made and are owned by nothing else.
    let (reader, writer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(reader);
    Stdio::from(writer)
}

/// Runs `cmd` with its stderr a pipe nobody reads any more; returns (exit status, stdout).
fn run_reader_gone(cmd: &mut Command) -> (ExitStatus, String) {
    let out = output_within_stderr(cmd, reader_gone(), 60);
    (out.status, texts(&out).0)
}

/// "exit 3" or "killed by signal 13 (SIGPIPE)".
fn how(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit {c}"),
        (_, Some(13)) => "killed by signal 13 (SIGPIPE)".into(),
        (_, s) => format!("killed by signal {s:?}"),
    }
}

fn writes() -> std::path::PathBuf {
    c_program("writes")
}

// ---------------------------------------------------------------------------------------------
// A reader that left

/// The exit summary to stderr after its reader left: the program's own exit status, and its own
/// exit handler (registered before the pool's) still runs.
#[test]
fn the_exit_summary_to_a_closed_pipe_keeps_the_exit_status_and_the_programs_exit_handlers() {
    for summary in ["stderr", "always:stderr"] {
        let (status, out) = run_reader_gone(&mut pooled(
            &writes(),
            &["exit", "3"],
            &[("GPUPOOL_SUMMARY", summary)],
        ));
        assert_eq!(how(status), "exit 3", "GPUPOOL_SUMMARY={summary}: {out}");
        assert_eq!(out, "checkpoint\n", "GPUPOOL_SUMMARY={summary}");
    }
    // The summary to stdout when stdout's reader left (the program prints nothing there
    // itself): the same status, and no line on stderr about the failed write.
    let mut cmd = pooled(
        &writes(),
        &["exit", "3", "quiet"],
        &[("GPUPOOL_SUMMARY", "stdout")],
    );
    cmd.stdout(reader_gone()).stderr(Stdio::piped());
    let out = cmd
        .spawn()
        .expect("start")
        .wait_with_output()
        .expect("wait");
    assert_eq!(how(out.status), "exit 3");
    assert_eq!(texts(&out).1, "");
}

/// The one warning line of a double free, with nobody reading stderr: the program goes on.
#[test]
fn a_warning_to_a_closed_pipe_does_not_stop_the_program() {
    let (status, out) = run_reader_gone(&mut pooled(&writes(), &["double_free"], &[]));
    assert_eq!(how(status), "exit 0", "{out}");
    assert_eq!(out, "after double free\n");
}

/// A program that handles out-of-memory itself, by trying smaller sizes, keeps going when the
/// pool's out-of-memory report cannot be written.
#[test]
fn the_out_of_memory_report_to_a_closed_pipe_lets_the_program_recover() {
    let env = [("CUDASIM_MEM", "256MiB"), ("CUDASIM_CONTEXT_BYTES", "0")];
    // With a reader: the report is there (so the test below does make the pool write one).
    let out = output_within(&mut pooled(&writes(), &["oom"], &env), 60);
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("gpupool: out of memory on device 0"),
        "{stderr}"
    );
    let (status, out) = run_reader_gone(&mut pooled(&writes(), &["oom"], &env));
    assert_eq!(how(status), "exit 0", "{out}");
    assert_eq!(out, stdout);
    assert!(out.starts_with("got "), "{out}");
}

/// The live dumps (`SIGUSR1`, `GPUPOOL_SUMMARY_INTERVAL`) to a stderr nobody reads: the
/// program goes on.
#[test]
fn live_dumps_to_a_closed_pipe_do_not_stop_the_program() {
    let env = [("GPUPOOL_SUMMARY_INTERVAL", "100ms")];
    // With a reader: several dumps are written while the program sleeps.
    let out = output_within(&mut pooled(&writes(), &["dump"], &env), 60);
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let dumps = stderr.matches(" gpupool summary   pid ").count();
    assert!(dumps >= 2, "{dumps} dumps:\n{stderr}");
    let (status, out) = run_reader_gone(&mut pooled(&writes(), &["dump"], &env));
    assert_eq!(how(status), "exit 0", "{out}");
    assert_eq!(out, "after dumps\n");
}

/// `gpupool_write_summary` to a pipe whose reader left: the failure comes back as 999 with
/// `errno` EPIPE, and the program goes on.
#[test]
fn the_api_summary_to_a_closed_pipe_returns_an_error() {
    let out = output_within(&mut pooled(&writes(), &["api_summary"], &[]), 60);
    let (stdout, stderr) = texts(&out);
    assert_eq!(how(out.status), "exit 0", "{stdout}{stderr}");
    assert_eq!(stdout, "write_summary 999 EPIPE\n");
    assert_eq!(stderr, "");
}

// ---------------------------------------------------------------------------------------------
// fd 2 taken over by a data file

/// A daemon closes fd 2 and opens a data file, which becomes fd 2: the pool's warning and its
/// exit summary never go into it.
#[test]
fn a_data_file_that_became_fd_2_gets_no_warning_and_no_summary() {
    let dir = scratch("output-fd2");
    let data = dir.join("data.txt");
    let out = output_within(
        &mut pooled(
            &writes(),
            &["reuse_fd2", data.to_str().unwrap()],
            &[("GPUPOOL_SUMMARY", "stderr")],
        ),
        60,
    );
    let (stdout, _) = texts(&out);
    assert_eq!(how(out.status), "exit 0", "{stdout}");
    assert_eq!(stdout, "data written\n");
    assert_eq!(
        std::fs::read_to_string(&data).unwrap(),
        "data 1\ndata 2\n",
        "the pool wrote into the program's data file"
    );
}

/// A file the program was started with as its stderr (`2>log`) is its stderr: the warning and
/// the summary go there.
#[test]
fn a_file_given_as_stderr_at_start_gets_the_warning_and_the_summary() {
    let dir = scratch("output-stderr-file");
    let log = dir.join("log.txt");
    let file = std::fs::File::create(&log).unwrap();
    let out = output_within_stderr(
        &mut pooled(
            &writes(),
            &["double_free"],
            &[("GPUPOOL_SUMMARY", "stderr")],
        ),
        Stdio::from(file),
        60,
    );
    assert_eq!(how(out.status), "exit 0");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.starts_with("gpupool: "), "{text}");
    assert!(text.contains(" gpupool summary   pid "), "{text}");
}

/// A pipe the program put on fd 2 itself, as Jupyter does to capture the output of C code, is
/// its stderr: the warning goes there.
#[test]
fn a_pipe_the_program_put_on_fd_2_gets_the_warning() {
    let out = output_within(&mut pooled(&writes(), &["capture_fd2"], &[]), 60);
    let (stdout, _) = texts(&out);
    assert_eq!(how(out.status), "exit 0", "{stdout}");
    assert!(
        stdout.starts_with("captured: gpupool: cudaFree(") && stdout.ends_with('\n'),
        "{stdout}"
    );
}

// ---------------------------------------------------------------------------------------------
// `always:` and wrapper processes

/// A wrapper (`bash -c 'app; true'`, `timeout`) inherits the preload and
/// `GPUPOOL_SUMMARY=always:FILE`, never allocates, and exits after the program: the file keeps
/// the program's summary.
#[test]
fn a_wrapper_that_never_allocated_keeps_the_summary_its_program_wrote() {
    let dir = scratch("output-wrapper");
    let exe = writes();
    let exe = exe.to_str().unwrap();
    // `; true`: bash forks the program and waits, instead of exec'ing it.
    let script = format!("'{exe}' exit 0; true");
    let wrappers: [&[&str]; 2] = [
        &["bash", "-c", &script],
        &["timeout", "20", exe, "exit", "0"],
    ];
    for wrapper in wrappers {
        for name in ["summary.txt", "summary.json"] {
            let path = dir.join(name);
            let dest = format!("always:{}", path.display());
            let mut cmd = support::clean_command(Path::new(wrapper[0]));
            cmd.args(&wrapper[1..])
                .env("LD_PRELOAD", support::library())
                .env("GPUPOOL_SUMMARY", &dest);
            let out = output_within(&mut cmd, 60);
            let (stdout, stderr) = texts(&out);
            assert!(out.status.success(), "{wrapper:?}: {stdout}{stderr}");
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                !text.contains("no CUDA allocations were intercepted")
                    && !text.contains("\"intercepted\":false"),
                "{wrapper:?} replaced the program's summary in {name}:\n{text}"
            );
            assert!(
                text.contains(" gpupool summary   pid ") || text.contains("\"intercepted\":true"),
                "{name}: {text}"
            );
        }
    }
}

/// A file left at the path by an earlier run is replaced by a process that never allocated.
#[test]
fn a_summary_left_by_an_earlier_run_is_replaced_by_the_not_intercepted_line() {
    let dir = scratch("output-stale");
    let path = dir.join("summary.txt");
    std::fs::write(&path, "an earlier run's summary\n").unwrap();
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    let dest = format!("always:{}", path.display());
    let out = output_within(
        &mut pooled(Path::new("/bin/true"), &[], &[("GPUPOOL_SUMMARY", &dest)]),
        60,
    );
    assert!(out.status.success());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("no CUDA allocations were intercepted"),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// Keywords in any case

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `OFF`, `Stderr`, `STDOUT`, `ALWAYS:stderr`: keywords, not file names; a bare word that is
/// none (`stdrr`) gives one warning line and no file.
#[test]
fn summary_keywords_in_any_case_write_no_file() {
    let dir = scratch("output-keywords");
    let exe = writes();
    for (value, on_stdout, on_stderr) in [
        ("OFF", false, false),
        ("Stderr", false, true),
        ("STDOUT", true, false),
        ("ALWAYS:Stderr", false, true),
    ] {
        let mut cmd = pooled(&exe, &["exit", "0"], &[("GPUPOOL_SUMMARY", value)]);
        let out = output_within(cmd.current_dir(&dir), 60);
        let (stdout, stderr) = texts(&out);
        assert!(out.status.success(), "{value}: {stdout}{stderr}");
        let summary = " gpupool summary   pid ";
        assert_eq!(stdout.contains(summary), on_stdout, "{value}: {stdout}");
        assert_eq!(stderr.contains(summary), on_stderr, "{value}: {stderr}");
        assert_eq!(names_in(&dir), Vec::<String>::new(), "{value}");
    }
    // `always:` in another case, in a process that never used CUDA: its one line.
    let mut cmd = pooled(
        Path::new("/bin/true"),
        &[],
        &[("GPUPOOL_SUMMARY", "ALWAYS:STDERR")],
    );
    let out = output_within(cmd.current_dir(&dir), 60);
    let (_, stderr) = texts(&out);
    assert!(
        stderr.contains("no CUDA allocations were intercepted"),
        "{stderr}"
    );
    assert_eq!(names_in(&dir), Vec::<String>::new());
    // A typo: one warning line, which says how to ask for a file of that name.
    let mut cmd = pooled(&exe, &["exit", "0"], &[("GPUPOOL_SUMMARY", "stdrr")]);
    let out = output_within(cmd.current_dir(&dir), 60);
    let (_, stderr) = texts(&out);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("gpupool: GPUPOOL_SUMMARY=\"stdrr\"") && stderr.contains("./stdrr"),
        "{stderr}"
    );
    // Off keywords of the trace: no trace file.
    for value in ["OFF", "0", "none"] {
        let mut cmd = pooled(&exe, &["exit", "0"], &[("GPUPOOL_TRACE", value)]);
        let out = output_within(cmd.current_dir(&dir), 60);
        let (_, stderr) = texts(&out);
        assert_eq!(stderr, "", "GPUPOOL_TRACE={value}");
    }
    assert_eq!(names_in(&dir), Vec::<String>::new());
}

/// The paths of the process's own streams are the streams: the summary arrives there, with no
/// warning, and nothing is renamed over them. (`/dev/stderr` itself only in the parser's tests:
/// run as root, a pool that took it for a file would replace it for every later process.)
#[test]
fn the_paths_of_the_standard_streams_get_the_summary_on_the_streams() {
    let exe = writes();
    for (value, on_stdout) in [
        ("/dev/fd/2", false),
        ("/proc/self/fd/2", false),
        ("always:/dev/fd/1", true),
        ("/proc/self/fd/1", true),
    ] {
        let mut cmd = pooled(&exe, &["exit", "0"], &[("GPUPOOL_SUMMARY", value)]);
        let out = output_within(&mut cmd, 60);
        let (stdout, stderr) = texts(&out);
        assert!(out.status.success(), "{value}: {stdout}{stderr}");
        let summary = " gpupool summary   pid ";
        let (there, elsewhere) = if on_stdout {
            (&stdout, &stderr)
        } else {
            (&stderr, &stdout)
        };
        assert_eq!(there.matches(summary).count(), 1, "{value}: {there}");
        assert!(!elsewhere.contains(summary), "{value}: {elsewhere}");
        assert!(!stderr.contains("gpupool: "), "{value}: {stderr}");
    }
}

/// `cmd` with `file` open, for writing, as its descriptor 3 (a shell's `3>file`).
fn with_fd3(cmd: &mut Command, file: &std::fs::File) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let fd = file.as_raw_fd();
    // SAFETY: between fork and exec the closure only calls dup2 and fcntl, which are
    // async-signal-safe; `file` outlives the spawn.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself would leave close-on-exec set.
            let r = match fd {
                3 => libc::fcntl(3, libc::F_SETFD, 0),
                _ => libc::dup2(fd, 3),
            };
            match r {
                -1 => Err(std::io::Error::last_os_error()),
                _ => Ok(()),
            }
        });
    }
}

/// A descriptor the program was started with (`3>file`, or a shell's `>(command)`, which is
/// `/dev/fd/63`) gets the summary written into it, with no warning. Renaming a file over
/// `/dev/fd/3` cannot work: before, a warning and no summary.
#[test]
fn a_descriptor_the_program_was_started_with_gets_the_summary() {
    let dir = scratch("output-fd3");
    for value in ["/dev/fd/3", "/proc/self/fd/3", "always:/dev/fd/3"] {
        let path = dir.join("fd3.txt");
        let file = std::fs::File::create(&path).unwrap();
        let mut cmd = pooled(&writes(), &["exit", "0"], &[("GPUPOOL_SUMMARY", value)]);
        with_fd3(&mut cmd, &file);
        let out = output_within(&mut cmd, 60);
        let (stdout, stderr) = texts(&out);
        assert!(out.status.success(), "{value}: {stdout}{stderr}");
        let got = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            got.matches(" gpupool summary   pid ").count(),
            1,
            "{value}: {got}"
        );
        assert!(!stderr.contains("gpupool: "), "{value}: {stderr}");
        assert!(!stderr.contains("gpupool summary"), "{value}: {stderr}");
    }
}

/// A program that closed its descriptor 3 and opened a data file there gets no summary in its
/// data: the descriptor is not the file it was at the start. One warning says why.
#[test]
fn a_descriptor_the_program_reopened_gets_no_summary() {
    let dir = scratch("output-fd3-reused");
    let (at_start, data) = (dir.join("fd3.txt"), dir.join("data.txt"));
    let file = std::fs::File::create(&at_start).unwrap();
    let mut cmd = pooled(
        &writes(),
        &["reuse_fd3", data.to_str().unwrap()],
        &[("GPUPOOL_SUMMARY", "/dev/fd/3")],
    );
    with_fd3(&mut cmd, &file);
    let out = output_within(&mut cmd, 60);
    let (stdout, stderr) = texts(&out);
    assert_eq!(how(out.status), "exit 0", "{stdout}{stderr}");
    assert_eq!(stdout, "data written\n");
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "data 1\ndata 2\n");
    assert_eq!(std::fs::read_to_string(&at_start).unwrap(), "");
    let warning = "cannot write the summary to /dev/fd/3: the descriptor is closed, or no longer";
    assert_eq!(stderr.matches(warning).count(), 1, "{stderr}");
}

#[test]
fn a_summary_longer_than_a_pipe_reaches_a_slow_reader_of_a_named_pipe_whole() {
    // A collector reading the JSON summary from a named pipe, slower than the program writes:
    // 4 000 sizes left allocated make a summary of about 160 KiB, more than the pipe holds.
    let exe = c_program("leak_sizes");
    let dir = scratch("fifo-slow-reader");
    let fifo = dir.join("summary.json");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    // Opened for reading before the program starts (without waiting for a writer), then read
    // in blocking mode, late and in small pieces, to the end the program's close makes.
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("open the fifo");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    // SAFETY: a descriptor this test owns; F_SETFL takes flags.
    let cleared = unsafe { libc::fcntl(fd, libc::F_SETFL, 0) };
    assert_eq!(cleared, 0);
    let mut cmd = pooled(
        &exe,
        &["4000"],
        &[("GPUPOOL_SUMMARY", fifo.to_str().unwrap())],
    );
    let child = std::thread::spawn(move || output_within(&mut cmd, 120));
    std::thread::sleep(Duration::from_millis(1500));
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        use std::io::Read;
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        std::thread::sleep(Duration::from_millis(2));
    }
    let out = child.join().expect("the program");
    let (stdout, stderr) = texts(&out);
    assert!(
        out.status.success() && stdout.contains("leak_sizes: all checks passed"),
        "{stdout}\n{stderr}"
    );
    assert!(!stderr.contains("gpupool:"), "{stderr}");
    let text = String::from_utf8(got).expect("UTF-8");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "{e}: {} bytes, ending {:?}",
            text.len(),
            &text[text.len().saturating_sub(80)..]
        )
    });
    let by_size = &v["devices"][0]["still_allocated"]["by_size"];
    assert_eq!(
        by_size.as_array().map(Vec::len),
        Some(4000),
        "{}",
        text.len()
    );
}

#[test]
fn a_reader_of_a_named_pipe_that_stops_reading_costs_the_program_a_bounded_wait() {
    // The collector opened the pipe and never reads: the program waits a few seconds for room,
    // then gives up with one warning and exits as it would.
    let exe = c_program("leak_sizes");
    let dir = scratch("fifo-stalled-reader");
    let fifo = dir.join("summary.json");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    use std::os::unix::fs::OpenOptionsExt;
    let _stalled = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("open the fifo");
    let mut cmd = pooled(
        &exe,
        &["4000"],
        &[("GPUPOOL_SUMMARY", fifo.to_str().unwrap())],
    );
    let started = std::time::Instant::now();
    let out = output_within(&mut cmd, 60);
    let (stdout, stderr) = texts(&out);
    assert!(
        out.status.success() && stdout.contains("leak_sizes: all checks passed"),
        "{stdout}\n{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("gpupool:"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
}

#[test]
fn a_summary_file_the_program_may_write_is_written_in_a_directory_it_may_not() {
    // Ops pre-create the job's summary file, writable by the job, in a directory the job may
    // not write (no temporary file beside it, so no rename): the summary still goes into it.
    let leak = c_program("leak");
    let dir = scratch("summary-readonly-dir");
    let file = dir.join("job.json");
    std::fs::write(&file, b"").expect("create the file");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    // As root, permissions do not apply: the program runs without the capabilities that
    // override them, still as root, so that it reads its libraries wherever the tree is (a
    // clone under a 0700 temporary directory, which another user could not enter).
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let leak_arg = leak.to_str().unwrap().to_string();
    let (exe, args): (&Path, Vec<&str>) = if root {
        (
            Path::new("/usr/bin/setpriv"),
            vec![
                "--bounding-set=-dac_override,-dac_read_search,-fowner",
                "--",
                &leak_arg,
            ],
        )
    } else {
        (&leak, vec![])
    };
    let mut cmd = pooled(exe, &args, &[("GPUPOOL_SUMMARY", file.to_str().unwrap())]);
    let out = output_within(&mut cmd, 60);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (stdout, stderr) = texts(&out);
    assert!(
        out.status.success() && stdout.contains("leak ok"),
        "{stdout}\n{stderr}"
    );
    assert!(!stderr.contains("gpupool:"), "{stderr}");
    let text = std::fs::read_to_string(&file).expect("read the summary");
    let v: serde_json::Value = serde_json::from_str(&text).expect("a JSON summary");
    assert_eq!(v["devices"][0]["still_allocated"]["blocks"], 4, "{v}");
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(names.len(), 1, "{names:?}");
}
