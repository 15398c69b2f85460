//! Hostile input from outside the program: every `GPUPOOL_*` variable with garbage, negative,
//! huge, empty and non-UTF-8 values (one warning line each at most, exactly as many as the
//! parser reports; defaults used; the program runs), summary and trace paths that cannot be
//! written (missing directory, a directory, a symbolic link, `/dev/full`, a named pipe without
//! a reader, a full file system, a file-size limit reached midway),
//! and hostile arguments across two devices (`tests/c/hostile.c`).

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use gpupool::config::{Config, VARIABLES};
use support::{c_program, ok, output_within, pooled, scratch, texts};

const VALUES: &[&[u8]] = &[
    b"zzz",
    b"-5",
    b"-1GiB",
    b"99999999999999999999999999TiB",
    b"1e400",
    b"18446744073709551616",
    b"",
    b"\t",
    &[0xfe, 0xff],
    b"50%%",
    b"always:",
];

/// The pool's warning lines about the value of `var`.
fn warnings_about(stderr: &str, var: &str) -> usize {
    let prefix = format!("gpupool: {var}=");
    stderr.lines().filter(|l| l.starts_with(&prefix)).count()
}

#[test]
fn every_variable_with_a_bad_value_warns_at_most_once_and_the_program_runs() {
    let exe = c_program("hostile");
    let dir = scratch("hostile-env");
    for &var in VARIABLES {
        for &value in VALUES {
            let (_, expected) = Config::parse(|name| (name == var).then(|| value.to_vec()));
            assert!(expected.len() <= 1, "{var}={value:?}: {expected:?}");
            let mut cmd = pooled(&exe, &[], &[]);
            cmd.env(var, OsStr::from_bytes(value)).current_dir(&dir);
            let (out, err) = ok(&mut cmd);
            assert!(out.contains("hostile ok"), "{var}={value:?}: {out}");
            assert_eq!(
                warnings_about(&err, var),
                expected.len(),
                "{var}={:?}: expected {expected:?}, got:\n{err}",
                String::from_utf8_lossy(value)
            );
        }
    }
    // The numeric and enumerated settings reject garbage with one line each.
    for var in [
        "GPUPOOL_RELEASE_THRESHOLD",
        "GPUPOOL_REUSE",
        "GPUPOOL_MAX_SPLIT_SIZE",
        "GPUPOOL_FENCE_BYTES",
        "GPUPOOL_SUMMARY_INTERVAL",
        "GPUPOOL_DISABLE",
    ] {
        for value in [&b"zzz"[..], b"-5GiB", &[0xfe, 0xff]] {
            let (c, w) = Config::parse(|name| (name == var).then(|| value.to_vec()));
            assert_eq!(w.len(), 1, "{var}={value:?}");
            assert_eq!(c, Config::default(), "{var}={value:?}: defaults not kept");
        }
    }
}

#[test]
fn hostile_arguments_across_two_devices() {
    let mut cmd = pooled(&c_program("hostile"), &[], &[("CUDASIM_DEVICES", "2")]);
    let (out, _) = ok(&mut cmd);
    assert!(
        out.contains("cross-device ok") && out.contains("hostile ok"),
        "{out}"
    );
}

/// Runs a small churn with `var=path`; returns the pool's stderr lines.
fn churn_with(var: &str, path: &Path) -> Vec<String> {
    let mut cmd = pooled(&c_program("churn"), &["2", "200", "1"], &[]);
    cmd.env(var, path.as_os_str());
    // With a deadline: a path that blocks the program (a named pipe) fails the test, not hangs.
    let output = output_within(&mut cmd, 60);
    let (out, err) = texts(&output);
    assert!(
        output.status.success() && out.contains("churn ok"),
        "{var}={}: {out}\n{err}",
        path.display()
    );
    err.lines()
        .filter(|l| l.starts_with("gpupool:"))
        .map(str::to_string)
        .collect()
}

#[test]
fn unwritable_summary_and_trace_paths_give_one_warning_and_the_program_runs() {
    let dir = scratch("bad-paths");
    let target = dir.join("elsewhere.txt");
    std::fs::write(&target, "keep me").expect("write");
    let link = dir.join("link");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let missing = Path::new("/nonexistent-gpupool-dir/summary.txt");
    // A named pipe no one reads: the trace must not wait for a reader forever.
    let fifo = dir.join("fifo");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(status.success());
    for var in ["GPUPOOL_SUMMARY", "GPUPOOL_TRACE"] {
        for path in [missing, dir.as_path(), Path::new("/dev/full"), &fifo] {
            let lines = churn_with(var, path);
            assert_eq!(lines.len(), 1, "{var}={}: {lines:?}", path.display());
        }
    }
    // A symbolic link is never written through: the trace refuses it (one warning), the summary
    // replaces the link (tests/report/destination.rs checks that in detail).
    assert_eq!(churn_with("GPUPOOL_TRACE", &link).len(), 1);
    assert!(churn_with("GPUPOOL_SUMMARY", &link).is_empty());
    assert_eq!(std::fs::read_to_string(&target).expect("read"), "keep me");
    // A device at the path is written to, never replaced (as root, a rename would replace it).
    let full = std::fs::symlink_metadata("/dev/full").expect("/dev/full");
    assert!(full.file_type().is_char_device(), "/dev/full was replaced");
    assert!(churn_with("GPUPOOL_SUMMARY", Path::new("/dev/null")).is_empty());
    let null = std::fs::symlink_metadata("/dev/null").expect("/dev/null");
    assert!(null.file_type().is_char_device(), "/dev/null was replaced");
}

/// A trace whose writes start failing midway (here the file-size limit, as a full disk would):
/// one warning, tracing stops, and the file keeps whole records only, which the trace tool
/// reads: a failing write must be noticed, and a partly written chunk must not shift every
/// record written once the disk has room again.
#[test]
fn a_trace_cut_short_by_a_failing_write_keeps_whole_records_and_warns_once() {
    let dir = scratch("trace-fsize");
    let trace = dir.join("cut.trace");
    let limit_blocks = 200; // 102 400 bytes: not a whole number of records after the magic
                            // The shell (preloaded too, and using no CUDA) sets the limit and runs the program.
    let script = format!("trap '' XFSZ; ulimit -f {limit_blocks} && exec \"$0\" \"$@\"");
    let churn = c_program("churn");
    // Classic segments: the simulator backs mapped memory with memfds, which the file-size
    // limit bounds too (a GPU's memory is not), so every mapping would fail.
    let mut cmd = pooled(
        Path::new("/bin/sh"),
        &["-c", &script, churn.to_str().unwrap(), "2", "3000", "1"],
        &[
            ("GPUPOOL_TRACE", trace.to_str().unwrap()),
            ("GPUPOOL_EXPANDABLE", "0"),
        ],
    );
    let (out, err) = ok(&mut cmd);
    assert!(out.contains("churn ok"), "{out}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("gpupool:")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].contains("tracing stopped"), "{err}");
    let len = std::fs::metadata(&trace).expect("trace").len();
    assert!(len > 50_000 && len <= limit_blocks * 512, "{len}");
    assert_eq!(
        (len - 8) % 40,
        0,
        "a cut record left at the end: {len} bytes"
    );
    let records = gpupool::pool::trace::parse(&std::fs::read(&trace).unwrap()).unwrap();
    assert!(records.len() > 1000, "{}", records.len());
}

#[test]
fn a_full_file_system_gives_one_warning() {
    let dir = scratch("full-fs");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&dir)
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        eprintln!("skipped: cannot mount a small tmpfs here (needs privileges)");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&dir);
    // Fill it.
    let _ = std::fs::write(dir.join("filler"), vec![0u8; 1 << 20]);
    for var in ["GPUPOOL_SUMMARY", "GPUPOOL_TRACE"] {
        let lines = churn_with(var, &dir.join("out.txt"));
        assert_eq!(lines.len(), 1, "{var} on a full file system: {lines:?}");
    }
}

/// `tests/c/secure_mode.c` linked with the pool (and with the simulator's runtime, or with no
/// runtime: `cudart`), and a set-group-ID copy of it owned by group nogroup in `dir`. Whether
/// the copy could be given that group (it needs root).
fn secure_mode_programs(dir: &Path, cudart: bool) -> (PathBuf, PathBuf, bool) {
    use std::os::unix::fs::PermissionsExt;
    let libs = support::gpupool_libs();
    let exe = sim::Sim::get().build(
        &support::root().join("tests/c/secure_mode.c"),
        &sim::Build {
            compiler: "cc",
            flags: &["-std=c11", "-Wl,--no-as-needed"],
            libs: &libs.iter().map(String::as_str).collect::<Vec<_>>(),
            cudart,
        },
    );
    let setgid = dir.join("secure_mode");
    std::fs::copy(&exe, &setgid).unwrap();
    let path = std::ffi::CString::new(setgid.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; to root and group nogroup (65534).
    let owned = unsafe { libc::chown(path.as_ptr(), 0, 65534) } == 0;
    std::fs::set_permissions(&setgid, std::fs::Permissions::from_mode(0o2755)).unwrap();
    (exe, setgid, owned)
}

/// Whether the set-group-ID copy ran in secure mode, by its first line; if not, says so.
fn ran_secure(owned: bool, out: &str) -> bool {
    let secure = owned && out.starts_with("secure 1\n");
    if !secure {
        eprintln!("not checked: the set-group-ID copy does not run in secure mode here ({out})");
    }
    secure
}

/// A set-group-ID program linked with the pool (secure mode, `AT_SECURE`) writes no file that
/// the environment of whoever runs it names: `GPUPOOL_SUMMARY` (with `always:`, or after an
/// allocation) and `GPUPOOL_TRACE` are ignored there, as glibc ignores `MALLOC_TRACE`. Else any
/// user could have it write, with its group's rights, where only that group may. The same
/// program without the bit writes the summary and the trace. Needs root (to give the file
/// another group); elsewhere, or on a file system mounted `nosuid`, the program reports no
/// secure mode and the test says so and checks nothing.
#[test]
fn a_privileged_program_writes_no_file_its_environment_names() {
    let dir = scratch("secure-mode");
    let (exe, setgid, owned) = secure_mode_programs(&dir, true);
    let summary = dir.join("summary.txt");
    let trace = dir.join("trace.bin");
    // (arguments, GPUPOOL_SUMMARY): no CUDA with `always:`, then an allocation.
    let runs = [
        (&[][..], format!("always:{}", summary.display())),
        (&["alloc"][..], summary.display().to_string()),
    ];
    let run = |exe: &Path, args: &[&str], dest: &str| {
        let mut cmd = support::clean_command(exe);
        cmd.args(args)
            .env("GPUPOOL_SUMMARY", dest)
            .env("GPUPOOL_TRACE", &trace);
        ok(&mut cmd)
    };
    for (args, dest) in &runs {
        let (out, err) = run(&exe, args, dest);
        assert!(out.starts_with("secure 0\n"), "{out}{err}");
        assert!(
            summary.exists(),
            "{args:?}: the unprivileged run wrote no summary"
        );
        std::fs::remove_file(&summary).unwrap();
        if !args.is_empty() {
            assert!(out.ends_with("cudaMalloc 0\n"), "{out}{err}");
            assert!(trace.exists(), "the unprivileged run wrote no trace");
            std::fs::remove_file(&trace).unwrap();
        }
    }
    for (args, dest) in &runs {
        let (out, err) = run(&setgid, args, dest);
        if !ran_secure(owned, &out) {
            return;
        }
        assert!(err.is_empty(), "{err}");
        assert!(!args.is_empty() || out == "secure 1\n", "{out}");
        assert!(args.is_empty() || out.ends_with("cudaMalloc 0\n"), "{out}");
        assert!(
            !summary.exists(),
            "{args:?}: the privileged program wrote the summary"
        );
        assert!(
            !trace.exists(),
            "{args:?}: the privileged program wrote the trace"
        );
    }
}

/// A set-group-ID program linked with the pool and no CUDA runtime loads none that its caller's
/// `GPUPOOL_CUDART` names: else any user could run code of their own with the program's group.
/// Without the bit, the named library is loaded (a marker that says so on stderr; it is no
/// runtime, so the allocation fails either way). Needs root, as the test above.
#[test]
fn a_privileged_program_loads_no_runtime_its_environment_names() {
    let dir = scratch("secure-cudart");
    let (exe, setgid, owned) = secure_mode_programs(&dir, false);
    let marker = sim::Sim::get().build(
        &support::root().join("tests/c/marker_runtime.c"),
        &sim::Build {
            compiler: "cc",
            flags: &["-std=c11", "-shared", "-fPIC"],
            libs: &[],
            cudart: false,
        },
    );
    let run = |exe: &Path| {
        let mut cmd = support::clean_command(exe);
        cmd.arg("alloc").env("GPUPOOL_CUDART", &marker);
        ok(&mut cmd)
    };
    let (out, err) = run(&exe);
    assert!(out.starts_with("secure 0\n"), "{out}{err}");
    assert!(err.contains("marker runtime loaded"), "{out}{err}");
    let (out, err) = run(&setgid);
    if !ran_secure(owned, &out) {
        return;
    }
    assert!(out.contains("cudaMalloc "), "{out}{err}");
    assert!(
        !err.contains("marker runtime loaded"),
        "the privileged program loaded the runtime its caller named:\n{err}"
    );
}
