//! A panic inside the library reaches C as the failing call's error code and one line on
//! stderr, once per process, naming where it happened; never Rust's multi-line report or a
//! backtrace (even with `RUST_BACKTRACE=1` in the program's environment).

use std::process::Command;

const CHILD: &str = "GPUPOOL_PANIC_LINE_CHILD";

#[test]
fn a_panic_is_one_line_once_per_process() {
    if std::env::var_os(CHILD).is_some() {
        // The child: what an exported function does with a bug inside, twice.
        gpupool::guard::quiet_panics();
        for _ in 0..2 {
            let r = gpupool::guard::boundary(999, || -> i32 { panic!("a planted bug") });
            assert_eq!(r, 999);
        }
        return;
    }
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "a_panic_is_one_line_once_per_process",
            "--nocapture",
        ])
        .args(["--test-threads", "1"])
        .env(CHILD, "1")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run the child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stderr}");
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("gpupool:"))
        .collect();
    assert_eq!(ours.len(), 1, "expected one line:\n{stderr}");
    assert!(
        ours[0].contains("internal error in libgpupool at tests/panic_line.rs:")
            && ours[0].contains("a planted bug"),
        "{}",
        ours[0]
    );
    assert!(
        !stderr.contains("panicked at") && !stderr.contains("stack backtrace"),
        "Rust's own report leaked:\n{stderr}"
    );
}
