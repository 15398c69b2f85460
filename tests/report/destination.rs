//! Where the summary goes: path templates, unwritable paths, links at the path, and the order
//! of the summary after the program's own output.

use super::*;

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length minus the NUL kept at the end.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    assert_eq!(r, 0);
    let end = buf.iter().position(|&b| b == 0).unwrap();
    String::from_utf8_lossy(&buf[..end]).replace('/', "_")
}

#[test]
fn path_templates_name_the_pid_rank_and_host() {
    let dir = scratch("report-template");
    let template = dir.join("job-%p-%r-%h-100%%.json");
    let host = hostname();
    for (env, rank) in [
        (
            vec![("RANK", "3"), ("LOCAL_RANK", "5"), ("SLURM_PROCID", "7")],
            "3",
        ),
        (vec![("LOCAL_RANK", "5"), ("SLURM_PROCID", "7")], "5"),
        (vec![("SLURM_PROCID", "7")], "7"),
        (vec![("RANK", ""), ("SLURM_PROCID", "7")], "7"),
        (vec![], "0"),
    ] {
        let mut env = env;
        env.push(("GPUPOOL_SUMMARY", template.to_str().unwrap()));
        let (pid, _, err) = run_ok(&c_program("churn"), &["1", "50", "1"], &env);
        assert!(err.is_empty(), "{err}");
        let path = dir.join(format!("job-{pid}-{rank}-{host}-100%.json"));
        let v = read_json(&path);
        assert_eq!(v["rank"], rank, "{env:?}");
        assert_eq!(v["host"], host.as_str());
        assert_eq!(u(&v, "/pid"), u64::from(pid));
        std::fs::remove_file(&path).unwrap();
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// Runs churn briefly with `GPUPOOL_SUMMARY=dest`: exit status 0 and exactly one stderr line,
/// which names `dest`.
fn one_warning_for(dest: &Path) {
    let (_, out, err) = run_ok(
        &c_program("churn"),
        &["1", "50", "1"],
        &[("GPUPOOL_SUMMARY", dest.to_str().unwrap())],
    );
    assert!(out.contains("churn ok"), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.ends_with('\n'), "{err:?}");
    assert!(
        err.starts_with("gpupool: ") && err.contains(&format!("to {}:", dest.display())),
        "{err}"
    );
}

#[test]
fn an_unwritable_path_gives_one_warning_line() {
    let dir = scratch("report-unwritable");
    // A directory that does not exist.
    one_warning_for(&dir.join("missing/summary.json"));
    assert!(!dir.join("missing").exists());
    // A path that is a directory: left as it was, and no temporary file left beside it.
    let taken = dir.join("taken.txt");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("inside"), b"x").unwrap();
    one_warning_for(&taken);
    assert!(taken.is_dir());
    assert_eq!(std::fs::read(taken.join("inside")).unwrap(), b"x");
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["taken.txt"]);
}

#[test]
fn a_symbolic_link_at_the_path_is_replaced_not_followed() {
    let dir = scratch("report-symlink");
    let target = dir.join("victim");
    std::fs::write(&target, b"keep").unwrap();
    let link = dir.join("summary.txt");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (_, _, err) = run_ok(
        &c_program("churn"),
        &["1", "50", "1"],
        &[("GPUPOOL_SUMMARY", link.to_str().unwrap())],
    );
    assert!(err.is_empty(), "{err}");
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    let meta = std::fs::symlink_metadata(&link).unwrap();
    assert!(meta.file_type().is_file(), "{meta:?}");
    let text = std::fs::read_to_string(&link).unwrap();
    assert!(text.contains(" gpupool summary   pid "), "{text}");
    // A dangling link is replaced too, and its target not created.
    let dangling = dir.join("dangling.json");
    std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
    run_ok(
        &c_program("churn"),
        &["1", "50", "1"],
        &[("GPUPOOL_SUMMARY", dangling.to_str().unwrap())],
    );
    assert!(!dir.join("nowhere").exists());
    assert_eq!(read_json(&dangling)["intercepted"], Value::Bool(true));
}

/// With stdout and stderr one pipe (`> log 2>&1`), the program's own buffered output comes
/// before the summary (exit flushes stdio only after the exit handlers, so the pool flushes it
/// first).
#[test]
fn the_summary_follows_the_programs_own_output() {
    let exe = c_program("churn");
    for dest in ["stderr", "stdout", "always:stderr"] {
        let mut cmd = support::clean_command(Path::new("/bin/sh"));
        cmd.args(["-c", "exec \"$0\" \"$@\" 2>&1"])
            .arg(&exe)
            .args(["1", "50", "1"])
            .env("LD_PRELOAD", library())
            .env("GPUPOOL_SUMMARY", dest);
        let (out, _) = support::ok(&mut cmd);
        let program = out.find("churn ok").expect("the program's line");
        let summary = out.find("gpupool summary").expect("the summary");
        assert!(program < summary, "{dest}: the summary came first:\n{out}");
    }
}
