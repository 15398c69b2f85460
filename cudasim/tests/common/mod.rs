//! Helpers to build C programs against cudasim and run them: the tests of cudasim use them, and
//! other crates of the workspace may copy this file (it finds `cudasim/` on its own).
//!
//! - [`Sim::get`] builds `libcudasim.so` (with `cargo build -p cudasim`, in the same profile as
//!   the test; quick when it is up to date: a cdylib-only crate's tests do not build it), and
//!   makes `target/<profile>/simlib/` holding `libcudart.so`, `libcudart.so.12` and
//!   `libcuda.so.1`, links to `../libcudasim.so` (the driver is a second name of the same
//!   library), and `libcuda.so`, a link-time stub with the soname `libcuda.so.1` built from
//!   `cudasim/stub/libcuda.c` (linked against the library itself, `-lcuda` would record the
//!   runtime's soname).
//! - [`Sim::compile`] compiles a C program with `cc` against it (`-lcudart`, with an rpath to
//!   `simlib/`, so the program runs without `LD_LIBRARY_PATH`); [`Sim::build`] takes the
//!   compiler, flags and libraries to put ahead of the runtime (C++, `-lgpupool`);
//!   [`Sim::compile_driver`] links with `-lcuda` alone (no runtime).
//! - [`Sim::run`] runs a program with a clean `CUDASIM_*` environment plus the given variables.
#![allow(dead_code)]

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock, PoisonError};

/// How [`Sim::build`] builds a program: `compiler [-Wall -Wextra -Werror -O1] -I cudasim/include
/// FLAGS SRC -o EXE LIBS [-L simlib -lcudart -rpath simlib] -lpthread`.
pub struct Build<'a> {
    /// `cc` or `c++`.
    pub compiler: &'a str,
    /// Before the source: the language standard, include directories, definitions.
    pub flags: &'a [&'a str],
    /// After it, ahead of the runtime: libraries that must come first (`-lgpupool`).
    pub libs: &'a [&'a str],
    /// Link against the simulator (`-lcudart`).
    pub cudart: bool,
}

/// The built simulator and where things are.
pub struct Sim {
    /// `target/<profile>`.
    pub profile_dir: PathBuf,
    /// `target/<profile>/simlib`: link directory with `libcudart.so{,.12}`, `libcuda.so{,.1}`.
    pub simlib: PathBuf,
    /// `cudasim/include`.
    pub include: PathBuf,
    /// `cudasim/`.
    pub cudasim_dir: PathBuf,
    /// Executables compiled by this process, by source and flags.
    compiled: Mutex<HashMap<(PathBuf, Vec<String>), PathBuf>>,
}

/// `cudasim/`, whether this file is compiled in the cudasim crate or in the workspace root.
fn cudasim_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    if manifest.join("include/cudasim.h").exists() {
        manifest.to_path_buf()
    } else {
        manifest.join("cudasim")
    }
}

/// `target/<profile>`: the test executable is `target/<profile>/deps/<name>-<hash>`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable in target/<profile>/deps")
        .to_path_buf()
}

/// Builds `libcudasim.so` in the test's profile.
fn build_library(cudasim_dir: &Path) {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.arg("build")
        .arg("--quiet")
        .arg("--manifest-path")
        .arg(cudasim_dir.join("Cargo.toml"))
        .arg("-p")
        .arg("cudasim");
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("run cargo build -p cudasim");
    assert!(status.success(), "cargo build -p cudasim failed");
}

/// Builds `simlib/libcuda.so`, the link-time stub of the driver, unless it is newer than its
/// source. Written under a temporary name and renamed, for concurrent test processes.
fn build_driver_stub(cudasim_dir: &Path, simlib: &Path) {
    let src = cudasim_dir.join("stub/libcuda.c");
    let stub = simlib.join("libcuda.so");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(built), Some(source)) = (modified(&stub), modified(&src)) {
        if built >= source && std::fs::symlink_metadata(&stub).is_ok_and(|m| m.is_file()) {
            return;
        }
    }
    let tmp = simlib.join(format!("libcuda.so.tmp{}", std::process::id()));
    let output = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror"])
        .arg("-Wl,-soname,libcuda.so.1")
        .arg(&src)
        .arg("-o")
        .arg(&tmp)
        .output()
        .expect("run the compiler");
    assert!(
        output.status.success(),
        "cc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    // A link left by an older harness is replaced by the stub.
    std::fs::rename(&tmp, &stub).expect("rename the driver stub");
}

/// Makes (or refreshes) `link` → `target`.
pub fn symlink(target: &str, link: &Path) {
    match std::fs::read_link(link) {
        Ok(t) if t == Path::new(target) => return,
        Ok(_) => std::fs::remove_file(link).expect("remove stale link"),
        Err(_) => {}
    }
    if let Err(e) = std::os::unix::fs::symlink(target, link) {
        // Another test process may have made it meanwhile.
        assert!(
            std::fs::read_link(link).is_ok_and(|t| t == Path::new(target)),
            "symlink {}: {e}",
            link.display()
        );
    }
}

impl Sim {
    /// Builds the simulator and its link directory, once per test process.
    pub fn get() -> &'static Sim {
        static SIM: OnceLock<Sim> = OnceLock::new();
        SIM.get_or_init(|| {
            let cudasim_dir = cudasim_dir();
            build_library(&cudasim_dir);
            let profile_dir = profile_dir();
            let library = profile_dir.join("libcudasim.so");
            assert!(library.exists(), "{} missing", library.display());
            let simlib = profile_dir.join("simlib");
            std::fs::create_dir_all(&simlib).expect("create simlib/");
            for name in ["libcudart.so", "libcudart.so.12", "libcuda.so.1"] {
                symlink("../libcudasim.so", &simlib.join(name));
            }
            build_driver_stub(&cudasim_dir, &simlib);
            Sim {
                profile_dir,
                simlib,
                include: cudasim_dir.join("include"),
                cudasim_dir,
                compiled: Mutex::new(HashMap::new()),
            }
        })
    }

    /// The scratch directory for compiled programs: `target/tmp/cudasim-c/`.
    pub fn scratch(&self) -> PathBuf {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cudasim-c");
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        dir
    }

    /// Compiles the C source `src` (with `extra_flags`) into an executable named after it, once
    /// per test process; panics with the compiler's output on failure.
    pub fn compile(&self, src: &Path, extra_flags: &[&str]) -> PathBuf {
        let mut flags = vec!["-std=c11"];
        flags.extend_from_slice(extra_flags);
        self.build(
            src,
            &Build {
                compiler: "cc",
                flags: &flags,
                libs: &[],
                cudart: true,
            },
        )
    }

    /// Compiles the C source `src` linked with `-lcuda` alone, as a program of the driver API
    /// (no runtime), with an rpath to `simlib/`.
    pub fn compile_driver(&self, src: &Path) -> PathBuf {
        let simlib = self.simlib.display().to_string();
        let rpath = format!("-Wl,-rpath,{simlib}");
        self.build(
            src,
            &Build {
                compiler: "cc",
                flags: &["-std=c11"],
                libs: &["-L", &simlib, "-lcuda", &rpath, "-ldl"],
                cudart: false,
            },
        )
    }

    /// Builds `src` as `build` says, once per test process; panics with the compiler's output
    /// on failure. The executable is written under a temporary name and renamed, so concurrent
    /// test processes never run a half-written file.
    pub fn build(&self, src: &Path, build: &Build) -> PathBuf {
        let mut key_flags: Vec<String> = vec![build.compiler.to_string()];
        key_flags.extend(build.flags.iter().map(|f| f.to_string()));
        key_flags.push("--".into());
        key_flags.extend(build.libs.iter().map(|f| f.to_string()));
        key_flags.push(build.cudart.to_string());
        let key = (src.to_path_buf(), key_flags);
        let mut compiled = self.compiled.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(exe) = compiled.get(&key) {
            return exe.clone();
        }
        let stem = src.file_stem().expect("source name").to_string_lossy();
        let plain = build.compiler == "cc"
            && build.flags == ["-std=c11"]
            && build.libs.is_empty()
            && build.cudart;
        let suffix = if plain {
            String::new()
        } else {
            let mut hasher = DefaultHasher::new();
            key.1.hash(&mut hasher);
            format!("-{:016x}", hasher.finish())
        };
        let exe = self.scratch().join(format!("{stem}{suffix}"));
        let tmp = exe.with_extension(format!("tmp{}", std::process::id()));
        let mut cmd = Command::new(build.compiler);
        cmd.args(["-Wall", "-Wextra", "-Werror", "-O1"])
            .arg("-I")
            .arg(&self.include)
            .args(build.flags)
            .arg(src)
            .arg("-o")
            .arg(&tmp)
            .args(build.libs);
        if build.cudart {
            cmd.arg("-L")
                .arg(&self.simlib)
                .arg("-lcudart")
                .arg(format!("-Wl,-rpath,{}", self.simlib.display()));
        }
        let output = cmd.arg("-lpthread").output().expect("run the compiler");
        assert!(
            output.status.success(),
            "{} {} failed:\n{}",
            build.compiler,
            src.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::rename(&tmp, &exe).expect("rename compiled program");
        compiled.insert(key, exe.clone());
        exe
    }

    /// Runs `exe` with `args`, every inherited `CUDASIM_*` variable removed and `env` set.
    pub fn run(&self, exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(exe);
        cmd.args(args);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CUDASIM_") {
                cmd.env_remove(key);
            }
        }
        cmd.envs(env.iter().copied());
        cmd.output().expect("run test program")
    }

    /// Runs `exe` like [`Sim::run`], asserts that it exits with 0, and returns its stdout.
    pub fn run_ok(&self, exe: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
        let output = self.run(exe, args, env);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{} {args:?} with {env:?} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            exe.display(),
            output.status
        );
        stdout
    }
}
