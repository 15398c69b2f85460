//! Who holds the memory: each block names the object that called the allocation, and the
//! summary groups the blocks still allocated at exit by library (`tests/c/holders.c` and its
//! libraries, one on the runtime, one on the driver). A library unloaded before the report keeps
//! its name; the program is named by its file, whatever its `argv[0]`.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use sim::{Build, Sim};
use support::{ok, pooled};

const ENV: &[(&str, &str)] = &[("CUDASIM_MEM", "1GiB"), ("CUDASIM_CONTEXT_BYTES", "0")];

/// `tests/c/holders.c` and its two libraries: who holds what, at exit, in text and JSON.
fn holders() -> (PathBuf, PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf, PathBuf)> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let sim = Sim::get();
            let simlib = sim.simlib.display().to_string();
            let rpath = format!("-Wl,-rpath,{simlib}");
            let driver = Build {
                compiler: "cc",
                flags: &["-std=c11", "-shared", "-fPIC"],
                libs: &["-L", &simlib, "-lcuda", &rpath],
                cudart: false,
            };
            (
                support::c_program("holders"),
                support::c_library("holder_runtime"),
                sim.build(&support::root().join("tests/c/holder_driver.c"), &driver),
            )
        })
        .clone()
}

/// The exit summary on stderr of `tests/c/holders.c` given its two libraries.
fn summary_of(args: &[&str]) -> String {
    let (exe, ..) = holders();
    let env = [("GPUPOOL_SUMMARY", "stderr")];
    let (out, stderr) = ok(&mut pooled(&exe, args, &[ENV, &env].concat()));
    assert!(out.contains("holders: all checks passed"), "{out}");
    stderr
}

/// `tests/c/holders.c`'s holders line, most bytes first: the driver library's 8 MiB, the
/// runtime library's 3, the program's 2.
fn held_by(driver_lib: &str, runtime_lib: &str) -> String {
    let (exe, ..) = holders();
    format!(
        " held by    {driver_lib} 8.00 MiB in 2 blocks, {runtime_lib} 3.00 MiB in 3 blocks, the \
         program ({}) 2.00 MiB in 1 block",
        exe.file_name().unwrap().to_string_lossy()
    )
}

#[test]
fn the_summary_says_which_library_holds_the_memory() {
    let (exe, runtime_lib, driver_lib) = holders();
    let file_name = |p: &PathBuf| p.file_name().unwrap().to_string_lossy().into_owned();
    let args = [runtime_lib.to_str().unwrap(), driver_lib.to_str().unwrap()];
    let stderr = summary_of(&args);
    let want = held_by(&file_name(&driver_lib), &file_name(&runtime_lib));
    assert!(stderr.contains(&want), "{want}\n{stderr}");

    let json = support::scratch("holders").join("summary.json");
    let env = [("GPUPOOL_SUMMARY", json.to_str().unwrap())];
    ok(&mut pooled(&exe, &args, &[ENV, &env].concat()));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the summary")).unwrap();
    let by_library = &v["devices"][0]["still_allocated"]["by_library"];
    assert_eq!(
        by_library[0]["library"],
        file_name(&driver_lib),
        "{by_library}"
    );
    assert_eq!(by_library[0]["blocks"], 2);
    assert_eq!(by_library[0]["requested_bytes"], 8 << 20);
    assert_eq!(by_library[1]["library"], file_name(&runtime_lib));
    assert_eq!(by_library[1]["requested_bytes"], 3 << 20);
    assert_eq!(by_library[2]["requested_bytes"], 2 << 20);
}

#[test]
fn the_program_is_named_as_the_program_whatever_its_argv0() {
    // A shell that found the program on PATH passes a bare name; a launcher may pass any
    // name. The program's own blocks are still the program's, named by its file.
    use std::os::unix::process::CommandExt;
    let (exe, runtime_lib, driver_lib) = holders();
    let args = [runtime_lib.to_str().unwrap(), driver_lib.to_str().unwrap()];
    let env = [("GPUPOOL_SUMMARY", "stderr")];
    let elsewhere = support::scratch("holders-argv0");
    let mut cmd = pooled(&exe, &args, &[ENV, &env].concat());
    cmd.arg0("renamed-by-its-launcher").current_dir(&elsewhere);
    let (out, stderr) = ok(&mut cmd);
    assert!(out.contains("holders: all checks passed"), "{out}");
    let want = format!(
        "the program ({}) 2.00 MiB in 1 block",
        exe.file_name().unwrap().to_string_lossy()
    );
    assert!(stderr.contains(&want), "{want}\n{stderr}");
    assert!(!stderr.contains("renamed-by-its-launcher"), "{stderr}");
}

#[test]
#[cfg(target_arch = "x86_64")]
fn a_library_unloaded_before_the_report_still_holds_its_blocks() {
    // `tests/c/holders_unloaded.c`: a library makes three live blocks and is unloaded; a copy
    // of it under another name is loaded after, most often at the same address. The report
    // names the library that allocated, not "unknown", nor the copy.
    let (_, runtime_lib, _) = holders();
    let stderr = unloaded_summary(&runtime_lib, "holders-unloaded");
    assert!(!stderr.contains("libholder_copy.so"), "{stderr}");
}

#[test]
#[cfg(target_arch = "x86_64")]
fn a_library_unloaded_as_a_dependency_still_holds_its_blocks() {
    // `tests/c/holders_unloaded.c` on a library that only links the one that allocates: its
    // `dlclose` unloads both, and the blocks are the dependency's, named as unloaded, not
    // "unknown" nor the copy loaded after.
    let (_, runtime_lib, _) = holders();
    let wrapper = Sim::get().build(
        &support::root().join("tests/c/holder_wrapper.c"),
        &Build {
            compiler: "cc",
            flags: &["-std=c11", "-shared", "-fPIC"],
            libs: &[runtime_lib.to_str().unwrap()],
            cudart: false,
        },
    );
    unloaded_summary(&wrapper, "holders-unloaded-dependency");
}

/// `tests/c/holders_unloaded.c` on `first`, which makes three live blocks of
/// `libholder_runtime.so` and is unloaded, then on a copy of that library loaded after, most
/// often at the same address. Checks that the summary names the unloaded library as their
/// holder; returns the summary.
#[cfg(target_arch = "x86_64")]
fn unloaded_summary(first: &std::path::Path, scratch: &str) -> String {
    let (_, runtime_lib, _) = holders();
    let exe = support::c_program("holders_unloaded");
    let copy = support::scratch(scratch).join("libholder_copy.so");
    std::fs::copy(&runtime_lib, &copy).unwrap();
    let args = [first.to_str().unwrap(), copy.to_str().unwrap()];
    let env = [("GPUPOOL_SUMMARY", "stderr")];
    let (out, stderr) = ok(&mut pooled(&exe, &args, &[ENV, &env].concat()));
    assert!(out.contains("holders_unloaded: all checks passed"), "{out}");
    let want = format!(
        " held by    {} (unloaded) 3.00 MiB in 3 blocks\n",
        runtime_lib.file_name().unwrap().to_string_lossy()
    );
    assert!(stderr.contains(&want), "{want}\n{out}\n{stderr}");
    stderr
}

#[test]
fn two_libraries_of_one_file_name_are_told_apart_by_their_paths() {
    // Two copies of a library in two directories, both loaded (two Python packages that
    // bundle their own build of one library): each is named by its path, not merged into
    // one line under their shared file name.
    let (_, runtime_lib, driver_lib) = holders();
    let dir = support::scratch("holders-one-file-name");
    let (first, second) = (dir.join("a/libshared.so"), dir.join("b/libshared.so"));
    for (from, to) in [(&runtime_lib, &first), (&driver_lib, &second)] {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
    }
    let stderr = summary_of(&[first.to_str().unwrap(), second.to_str().unwrap()]);
    let want = held_by(&second.display().to_string(), &first.display().to_string()) + "\n";
    assert!(stderr.contains(&want), "{want}\n{stderr}");
    assert!(
        stderr.contains(" still allocated at exit: 6 blocks, 13.0 MiB requested"),
        "{stderr}"
    );
}
