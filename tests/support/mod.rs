//! Helpers the integration tests share on top of the simulator's (`sim`, which the including
//! test declares with `#[path = "../cudasim/tests/common/mod.rs"] mod sim;`): the library built
//! in the test's profile, a link directory for `-lgpupool`, and running programs with a clean
//! `GPUPOOL_*`/`CUDASIM_*` environment.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::sim::{self, Sim};

/// The repository root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `target/<profile>/libgpupool.so`, built with this test's profile.
pub fn library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "-p", "gpupool", "--lib"]);
        if !cfg!(debug_assertions) {
            cmd.arg("--release");
        }
        assert!(cmd.status().expect("cargo build").success());
        let lib = Sim::get().profile_dir.join("libgpupool.so");
        assert!(lib.exists(), "{} missing", lib.display());
        lib
    })
    .clone()
}

/// `target/<profile>/gpupool-trace`, the trace tool of the `gpupool-lab` crate, built with this
/// test's profile.
pub fn trace_tool() -> PathBuf {
    static TOOL: OnceLock<PathBuf> = OnceLock::new();
    TOOL.get_or_init(|| {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args([
            "build",
            "--quiet",
            "-p",
            "gpupool-lab",
            "--bin",
            "gpupool-trace",
        ]);
        if !cfg!(debug_assertions) {
            cmd.arg("--release");
        }
        assert!(cmd.status().expect("cargo build").success());
        let tool = Sim::get().profile_dir.join("gpupool-trace");
        assert!(tool.exists(), "{} missing", tool.display());
        tool
    })
    .clone()
}

/// `target/<profile>/gpupoollib/`: `libgpupool.so` (for `-lgpupool`) and `libgpupool.so.0`
/// (its soname, which linked programs load), links to the built library.
pub fn link_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        library();
        let dir = Sim::get().profile_dir.join("gpupoollib");
        std::fs::create_dir_all(&dir).expect("create gpupoollib/");
        for name in ["libgpupool.so", "libgpupool.so.0"] {
            sim::symlink("../libgpupool.so", &dir.join(name));
        }
        dir
    })
    .clone()
}

/// Linker arguments that put libgpupool ahead of the runtime, with an rpath to it.
pub fn gpupool_libs() -> Vec<String> {
    let dir = link_dir();
    vec![
        "-L".into(),
        dir.display().to_string(),
        "-lgpupool".into(),
        format!("-Wl,-rpath,{}", dir.display()),
    ]
}

/// A command for `exe` without any inherited `GPUPOOL_*`, `CUDASIM_*`, `PYTORCH_*` or
/// `LD_PRELOAD`.
pub fn clean_command(exe: &Path) -> Command {
    let mut cmd = Command::new(exe);
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if k.starts_with("CUDASIM_")
            || k.starts_with("GPUPOOL_")
            || k.starts_with("PYTORCH_")
            || k == "LD_PRELOAD"
        {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// Runs `cmd`; asserts it succeeded; returns (stdout, stderr).
pub fn ok(cmd: &mut Command) -> (String, String) {
    // A deadline: a program that deadlocks fails its test instead of hanging the suite.
    let out = output_within(cmd, 180);
    let (stdout, stderr) = texts(&out);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

pub fn texts(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The number after `key` on its own line of `text`.
pub fn number<T: std::str::FromStr>(text: &str, key: &str) -> T {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no '{key}' in:\n{text}"))
}

/// The allocations the pool served, over every device, as the JSON summary at `path` counts
/// them.
pub fn summary_allocations(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read the summary {}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("a JSON summary");
    v["devices"]
        .as_array()
        .unwrap_or_else(|| panic!("no devices in {v}"))
        .iter()
        .map(|d| d["allocations"].as_u64().expect("allocations"))
        .sum()
}

/// The allocations the pool passed through to CUDA, and their bytes, as the JSON summary at
/// `path` counts them: [served by the program's own memory pool, captured into a graph].
pub fn summary_passed_through(path: &Path) -> [(u64, u64); 2] {
    ["own_memory_pool", "graph_capture"].map(|reason| summary_passed_for(path, reason))
}

/// The JSON summary's (allocations, bytes) passed through to CUDA for `reason`.
pub fn summary_passed_for(path: &Path, reason: &str) -> (u64, u64) {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read the summary {}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("a JSON summary");
    let field = |name: &str| {
        v["passed_through"][reason][name]
            .as_u64()
            .unwrap_or_else(|| panic!("no passed_through.{reason}.{name} in {v}"))
    };
    (field("allocations"), field("bytes"))
}

/// A fresh scratch directory under the target's temporary directory.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// `tests/c/NAME.c` compiled against the simulator (once per test process).
pub fn c_program(name: &str) -> PathBuf {
    let src = root().join(format!("tests/c/{name}.c"));
    Sim::get().compile(&src, &[])
}

/// `tests/c/NAME.c` linked with the simulator's runtime and its driver (`-lcuda`).
pub fn c_program_with_driver(name: &str) -> PathBuf {
    let sim = Sim::get();
    let simlib = sim.simlib.display().to_string();
    let build = sim::Build {
        compiler: "cc",
        flags: &["-std=c11"],
        libs: &["-L", &simlib, "-lcuda"],
        cudart: true,
    };
    sim.build(&root().join(format!("tests/c/{name}.c")), &build)
}

/// `tests/c/NAME.c` compiled as a shared library against the simulator.
pub fn c_library(name: &str) -> PathBuf {
    let src = root().join(format!("tests/c/{name}.c"));
    Sim::get().compile(&src, &["-shared", "-fPIC"])
}

/// A command running `exe` under `LD_PRELOAD=libgpupool.so`, with a clean `GPUPOOL_*` and
/// `CUDASIM_*` environment plus `env`.
pub fn pooled(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = clean_command(exe);
    cmd.args(args).env("LD_PRELOAD", library());
    cmd.envs(env.iter().copied());
    cmd
}

/// The same program without the pool (for comparisons), same clean environment.
pub fn unpooled(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = clean_command(exe);
    cmd.args(args).envs(env.iter().copied());
    cmd
}

/// Runs `cmd` with a deadline; a program still running then is killed and the test fails (a
/// deadlock). Returns its output.
pub fn output_within(cmd: &mut Command, seconds: u64) -> Output {
    output_within_stderr(cmd, std::process::Stdio::piped(), seconds)
}

/// `output_within` with the program's stderr given (a file, a pipe nobody reads); the output's
/// stderr holds what it wrote only when `stderr` is `Stdio::piped()`.
pub fn output_within_stderr(
    cmd: &mut Command,
    stderr: std::process::Stdio,
    seconds: u64,
) -> Output {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start program");
    // Read both pipes on threads so a chatty program never blocks on a full pipe.
    fn read_all(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut v);
            }
            v
        })
    }
    let t_out = read_all(child.stdout.take());
    let t_err = read_all(child.stderr.take());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} still running after {seconds} s: deadlock");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    Output {
        status,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    }
}
