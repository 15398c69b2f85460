//! Packaging: `scripts/install.sh` into a temporary prefix, a program built with
//! `pkg-config --cflags --libs gpupool`, the `gpupool-run` wrapper, and the GPU check's dry run.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use sim::Sim;
use support::{clean_command, library, number, ok, root, scratch, texts};

fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Installs into a fresh prefix with the library this test built; returns the prefix.
fn install(name: &str) -> PathBuf {
    library();
    let prefix = scratch(name);
    ok(clean_command(&root().join("scripts/install.sh"))
        .args(["--no-build", "--profile", profile(), "--prefix"])
        .arg(&prefix));
    prefix
}

fn pkg_config_available() -> bool {
    let found = Command::new("pkg-config").arg("--version").output().is_ok();
    if !found {
        eprintln!("SKIPPED: pkg-config is not installed (scripts/test.sh installs pkgconf)");
    }
    found
}

#[test]
fn install_lays_out_library_links_header_pc_and_wrapper() {
    let prefix = install("install-layout");
    let lib = prefix.join("lib");
    let version = env!("CARGO_PKG_VERSION");
    let real = format!("libgpupool.so.{version}");
    assert!(lib.join(&real).is_file());
    let link = |name: &str| std::fs::read_link(lib.join(name)).unwrap();
    assert_eq!(link("libgpupool.so.0"), Path::new(&real));
    assert_eq!(link("libgpupool.so"), Path::new("libgpupool.so.0"));
    assert_eq!(
        std::fs::read(prefix.join("include/gpupool.h")).unwrap(),
        std::fs::read(root().join("include/gpupool.h")).unwrap()
    );
    assert!(prefix.join("bin/gpupool-run").is_file());
    let pc = std::fs::read_to_string(lib.join("pkgconfig/gpupool.pc")).unwrap();
    assert!(pc.contains(&format!("Version: {version}")), "{pc}");
    assert!(!pc.contains('@'), "unfilled field in:\n{pc}");
    if let Ok(out) = Command::new("readelf")
        .arg("-d")
        .arg(lib.join(&real))
        .output()
    {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Library soname: [libgpupool.so.0]"), "{text}");
        assert!(
            !text.contains("libcudart"),
            "DT_NEEDED on the runtime:\n{text}"
        );
    }
}

#[test]
fn a_program_builds_with_pkg_config_against_the_installed_library() {
    if !pkg_config_available() {
        return;
    }
    let prefix = install("install-pkgconfig");
    let pcdir = prefix.join("lib/pkgconfig");
    let out = ok(Command::new("pkg-config")
        .args(["--cflags", "--libs", "gpupool"])
        .env("PKG_CONFIG_PATH", &pcdir));
    let flags: Vec<String> = out.0.split_whitespace().map(String::from).collect();
    assert!(flags.iter().any(|f| f == "-lgpupool"), "{flags:?}");
    let exe = prefix.join("api_demo");
    ok(Command::new("cc")
        .args(["-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror"])
        .arg(root().join("examples/api_demo.c"))
        .arg("-o")
        .arg(&exe)
        .args(&flags));
    // Runs without LD_LIBRARY_PATH (the .pc file's rpath) and finds the runtime by name.
    let runtime = Sim::get().simlib.join("libcudart.so.12");
    let (stdout, _) = ok(clean_command(&exe).env("GPUPOOL_CUDART", &runtime));
    assert!(
        stdout.contains("pool on") && stdout.contains("gpupool summary"),
        "{stdout}"
    );
    let maps_lib = std::fs::canonicalize(prefix.join("lib/libgpupool.so.0")).unwrap();
    assert!(maps_lib.starts_with(&prefix));
}

fn churn() -> PathBuf {
    Sim::get().compile(&root().join("tests/c/churn.c"), &[])
}

#[test]
fn gpupool_run_preloads_and_sets_variables_from_flags() {
    let (out, err) = ok(clean_command(&root().join("scripts/gpupool-run"))
        .args(["--lib"])
        .arg(library())
        .args([
            "--summary",
            "stderr",
            "--threshold",
            "0",
            "--reuse",
            "relaxed",
            "--limit",
            "5GiB",
            "--",
        ])
        .arg(churn())
        .args(["1", "2000", "1"]));
    let program: u64 = number(&out, "program mallocs");
    assert!(number::<u64>(&out, "real mallocs") * 10 < program, "{out}");
    assert!(
        err.contains("gpupool summary") && err.contains("reuse relaxed"),
        "{err}"
    );
    assert!(
        err.contains("release threshold 0 B   limit 5.00 GiB"),
        "{err}"
    );
}

#[test]
fn gpupool_run_keeps_an_existing_preload() {
    let marker = Sim::get().build(
        &root().join("tests/c/marker.c"),
        &sim::Build {
            compiler: "cc",
            flags: &["-std=c11", "-shared", "-fPIC"],
            libs: &[],
            cudart: false,
        },
    );
    let run = |preload: Option<&Path>| {
        let mut cmd = clean_command(&root().join("scripts/gpupool-run"));
        // Relaxed reuse: every free is reusable at once, so the cache's effect is plain to see.
        cmd.arg("--lib")
            .arg(library())
            .args(["--reuse", "relaxed", "--"])
            .arg(churn());
        cmd.args(["1", "500", "1"]);
        if let Some(p) = preload {
            cmd.env("LD_PRELOAD", p);
        }
        ok(&mut cmd)
    };
    let (out, err) = run(Some(&marker));
    assert!(err.contains("marker library loaded"), "{err}");
    assert!(number::<u64>(&out, "real mallocs") * 10 < number::<u64>(&out, "program mallocs"));
    let (out, err) = run(None);
    assert!(!err.contains("marker"), "{err}");
    assert!(number::<u64>(&out, "real mallocs") * 10 < number::<u64>(&out, "program mallocs"));

    // The resulting LD_PRELOAD: the old entry first, libgpupool once.
    let dry = |env: &str| {
        ok(clean_command(&root().join("scripts/gpupool-run"))
            .arg("--lib")
            .arg(library())
            .args(["--dry-run", "--", "true"])
            .env("LD_PRELOAD", env))
        .0
    };
    let lib = library().display().to_string();
    let line = |text: String| {
        text.lines()
            .find_map(|l| l.strip_prefix("LD_PRELOAD=").map(String::from))
            .unwrap()
    };
    let m = marker.display().to_string();
    assert_eq!(line(dry(&m)), format!("{m}:{lib}"));
    assert_eq!(line(dry(&lib)), lib, "added twice");
    assert_eq!(line(dry("")), lib);
}

#[test]
fn installed_gpupool_run_finds_the_library_beside_it() {
    let prefix = install("install-wrapper");
    let (out, _) = ok(clean_command(&prefix.join("bin/gpupool-run")).args([
        "--dry-run",
        "--disable",
        "--",
        "true",
    ]));
    let expected = format!(
        "LD_PRELOAD={}",
        prefix.join("lib/libgpupool.so.0").display()
    );
    assert!(out.lines().any(|l| l == expected), "{out}");
    assert!(out.lines().any(|l| l == "GPUPOOL_DISABLE=1"), "{out}");
}

#[test]
fn gpupool_run_rejects_bad_usage() {
    let run = |args: &[&str]| {
        clean_command(&root().join("scripts/gpupool-run"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["--reuse", "sometimes", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(texts(&out).1.contains("strict, barrier or relaxed"));
    let out = run(&["--bogus", "true"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["--help"]);
    assert!(out.status.success() && texts(&out).0.contains("usage: gpupool-run"));
}

/// Relative paths are the caller's, `--libdir` reaches the installed `gpupool-run` (also run
/// through a symbolic link), and paths that the `.pc` file or `LD_PRELOAD` cannot hold are
/// refused before anything is installed (`&` would corrupt the `.pc` file, a space give a
/// prefix nothing can use, a relative prefix land in the source tree).
#[test]
fn install_paths_relative_libdir_and_refused_characters() {
    library();
    let base = scratch("install-paths");
    let run = |args: &[&str]| {
        clean_command(&root().join("scripts/install.sh"))
            .current_dir(&base)
            .args(["--no-build", "--profile", profile()])
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["--prefix", "rel", "--libdir", "rel/lib64"]);
    assert!(out.status.success(), "{:?}", texts(&out));
    let prefix = base.join("rel");
    assert!(prefix.join("lib64/libgpupool.so.0").exists());
    let pc = std::fs::read_to_string(prefix.join("lib64/pkgconfig/gpupool.pc")).unwrap();
    assert!(
        pc.contains(&format!("libdir={}/lib64\n", prefix.display())),
        "{pc}"
    );
    let link = base.join("gpupool-run-link");
    std::os::unix::fs::symlink(prefix.join("bin/gpupool-run"), &link).unwrap();
    for wrapper in [prefix.join("bin/gpupool-run"), link] {
        let (out, _) = ok(clean_command(&wrapper).args(["--dry-run", "--", "true"]));
        let expected = format!("LD_PRELOAD={}/lib64/libgpupool.so.0", prefix.display());
        assert!(out.lines().any(|l| l == expected), "{out}");
    }
    for bad in ["with space", "a&b", "a|b", "a\\b", "a:b", "a,b", "~/x"] {
        let out = run(&["--prefix", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {:?}", texts(&out));
        assert!(texts(&out).1.contains("install.sh: --prefix"), "{bad}");
        assert!(!base.join(bad).exists(), "{bad}: installed something");
    }
    let out = run(&["--prefix"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(texts(&out).1.contains("--prefix needs a value"));
    let _ = std::fs::remove_dir_all(&base);
}

/// Options without their value are usage errors (exit 2), and a command whose name holds `=`
/// is run as a command (it went to env(1) as one more variable).
#[test]
fn gpupool_run_needs_option_values_and_runs_any_command_name() {
    for option in [
        "--summary",
        "--threshold",
        "--reuse",
        "--max-split",
        "--limit",
        "--lib",
        "-s",
    ] {
        // Alone, or followed by the `--` that starts the command: the value was forgotten.
        for rest in [&[][..], &["--", "/bin/true"][..]] {
            let out = clean_command(&root().join("scripts/gpupool-run"))
                .arg(option)
                .args(rest)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(2), "{option} {rest:?}");
            assert!(
                texts(&out).1.contains(&format!("{option} needs a value")),
                "{option} {rest:?}"
            );
        }
    }
    let dir = scratch("gpupool-run-names");
    let odd = dir.join("run=1");
    std::fs::copy("/bin/echo", &odd).unwrap();
    let (out, _) = ok(clean_command(&root().join("scripts/gpupool-run"))
        .arg("--lib")
        .arg(library())
        .arg("--")
        .arg(&odd)
        .arg("said"));
    assert_eq!(out, "said\n");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `scripts/gpu-check.sh --dry-run`: everything that needs no GPU is checked (its own syntax, the
/// library, the Python programs' syntax), every GPU step is listed as skipped with the command a
/// real run would run, and the results file is written with each section, so the next GPU
/// session's run is not its first. With `$OUT` set (the GPU machine's folder whose files come
/// back, at most 8 of them), the report, the steps and one archive of the logs are copied there.
/// (tools/test_gpu_check.py checks each step's command line and a whole run with stand-ins.)
#[test]
fn gpu_check_dry_run_passes_without_a_gpu() {
    let out_dir = scratch("gpu-check-dry");
    let published = scratch("gpu-check-published");
    let out = clean_command(&root().join("scripts/gpu-check.sh"))
        .arg("--dry-run")
        .arg("--out")
        .arg(&out_dir)
        .env("OUT", &published)
        .env("GPU_CHECK_COMMIT", "abc1234")
        .env("GPUPOOL_LIB", library())
        .env("PYTHON", "python3")
        .output()
        .expect("run gpu-check.sh");
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let steps = std::fs::read_to_string(out_dir.join("steps.tsv")).unwrap();
    let status = |name: &str| {
        steps
            .lines()
            .map(|l| l.split('\t').collect::<Vec<_>>())
            .find(|f| f[0] == name)
            .map(|f| f[2].to_string())
            .unwrap_or_else(|| panic!("no step {name} in:\n{steps}"))
    };
    for name in [
        "self_syntax",
        "library",
        "clean_env",
        "pluggable_syntax",
        "torch_train_syntax",
        "torch_hit_syntax",
    ] {
        assert_eq!(status(name), "PASS", "{name}:\n{steps}");
    }
    // Every step of a real run, listed and skipped.
    let mut gpu_steps = vec![
        "churn_pool_relaxed_few".to_string(),
        "churn_pool_strict_few".to_string(),
    ];
    for program in [
        "churn",
        "hazard",
        "hazard_blocking",
        "stream_reuse",
        "overlap",
    ] {
        gpu_steps.push(format!("{program}_nopool"));
        for mode in ["strict", "barrier", "relaxed"] {
            gpu_steps.push(format!("{program}_pool_{mode}"));
        }
    }
    gpu_steps.extend(
        [
            "overlap_pool_barrier_api",
            "torch_native",
            "torch_nocache",
            "torch_nocache_pool",
            "torch_nocache_pool_barrier",
            "torch_pluggable",
            "torch_pluggable_barrier",
            "torch_pluggable_relaxed",
            "sanitizer_memcheck_pool",
            "hit_raw",
            "hit_pool",
            "hit_async",
            "hit_pool_relaxed",
            "torch_hit_native",
            "torch_hit_pluggable",
            "torch_hit_pluggable_relaxed",
        ]
        .map(String::from),
    );
    for name in &gpu_steps {
        assert_eq!(status(name), "SKIP", "{name}:\n{steps}");
    }
    assert!(
        stdout.contains(&format!(
            "[dry-run] would run churn_pool_strict (check, timeout 120s): env -u LD_PRELOAD \
             -u GPUPOOL_* -u PYTORCH_... LD_PRELOAD={} GPUPOOL_REUSE=strict \
             GPUPOOL_SUMMARY=stderr ",
            library().display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("/target/gpu-check/churn 8 1500 1\n"),
        "{stdout}"
    );
    let report = std::fs::read_to_string(out_dir.join("gpu-results.md")).unwrap();
    for heading in [
        "dry run (nothing ran on a GPU)",
        "## Steps",
        "## Environment",
        "## churn",
        "## hazard",
        "## stream_reuse",
        "## PyTorch",
        "## compute-sanitizer",
        "## overlap",
        "## hit_bench",
        "## torch_hit",
    ] {
        assert!(report.contains(heading), "{heading} missing:\n{report}");
    }
    assert!(report.contains("- commit: abc1234\n"), "{report}");
    let mut back: Vec<String> = std::fs::read_dir(&published)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    back.sort();
    assert_eq!(back, ["gpu-results.md", "logs.tgz", "steps.tsv"]);
    assert_eq!(
        std::fs::read_to_string(published.join("gpu-results.md")).unwrap(),
        report
    );
    let listing = Command::new("tar")
        .arg("tzf")
        .arg(published.join("logs.tgz"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&listing.stdout).contains("logs/self_syntax.log"),
        "{listing:?}"
    );
}
