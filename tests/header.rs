//! `include/gpupool.h` is generated from `src/api/` by cbindgen (`cbindgen.toml`) and checked
//! in. This test fails when the checked-in header differs from a fresh generation, and checks
//! that it compiles cleanly as C99, C11 and C++17, alone and next to the CUDA runtime's header.
//!
//! Regenerate: `cargo test --test header -- --ignored regenerate`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn checked_in() -> PathBuf {
    root().join("include/gpupool.h")
}

fn generate() -> String {
    let config = cbindgen::Config::from_file(root().join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(root())
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("header is UTF-8")
}

#[test]
fn header_is_fresh() {
    let fresh = generate();
    let current = std::fs::read_to_string(checked_in()).unwrap_or_default();
    if fresh != current {
        let first = fresh
            .lines()
            .zip(current.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| fresh.lines().count().min(current.lines().count()));
        panic!(
            "include/gpupool.h is stale (first difference at line {}):\n  fresh:      {:?}\n  checked in: {:?}\n\
             run `cargo test --test header -- --ignored regenerate` and commit the result",
            first + 1,
            fresh.lines().nth(first).unwrap_or("<end>"),
            current.lines().nth(first).unwrap_or("<end>"),
        );
    }
}

/// Writes a fresh `include/gpupool.h`.
#[test]
#[ignore = "writes include/gpupool.h; run on purpose"]
fn regenerate() {
    std::fs::write(checked_in(), generate()).expect("write include/gpupool.h");
}

#[test]
fn every_function_is_documented() {
    let header = std::fs::read_to_string(checked_in()).expect("read header");
    let lines: Vec<&str> = header.lines().collect();
    let mut functions = 0;
    for (i, line) in lines.iter().enumerate() {
        if line.contains("gpupool_") && line.contains('(') && !line.trim_start().starts_with('*') {
            functions += 1;
            let above = lines[..i].iter().rev().find(|l| !l.trim().is_empty());
            assert!(
                above.is_some_and(|l| l.trim_end().ends_with("*/")),
                "no documentation above `{line}`"
            );
        }
    }
    assert!(functions >= 14, "only {functions} functions in the header");
}

/// Compiles a translation unit that includes the header (in the given order with the CUDA
/// runtime header of the simulator) and checks every declaration is usable.
fn compile(compiler: &str, std: &str, extra: &[&str], with_cuda: Option<bool>) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("header-check");
    std::fs::create_dir_all(&dir).unwrap();
    let cpp = compiler.contains("++");
    let tag = format!("{}-{std}-{with_cuda:?}", if cpp { "cxx" } else { "c" });
    let src = dir.join(format!("{tag}.{}", if cpp { "cpp" } else { "c" }));
    let (before, after) = match with_cuda {
        Some(true) => ("#include <cuda_runtime.h>\n", ""),
        Some(false) => ("", "#include <cuda_runtime.h>\n"),
        None => ("", ""),
    };
    let body = format!(
        "{before}#include <gpupool.h>\n{after}\n\
         int use(void);\n\
         int use(void) {{\n\
             void *p = NULL; uint64_t n = 0; gpupool_stats st; cudaStream_t s = NULL;\n\
             st.struct_size = sizeof st;\n\
             int r = gpupool_malloc(&p, 16) + gpupool_free(p) + gpupool_malloc_async(&p, 16, s)\n\
                 + gpupool_free_async(p, s) + gpupool_empty_cache(GPUPOOL_ALL_DEVICES, &n)\n\
                 + gpupool_set_release_threshold(-1, GPUPOOL_KEEP_ALL)\n\
                 + gpupool_get_release_threshold(0, &n) + gpupool_get_stats(0, &st)\n\
                 + gpupool_write_summary(2) + gpupool_enabled()\n\
                 + (int)gpupool_version_number() + (gpupool_version() != NULL)\n\
                 + (GPUPOOL_VERSION_NUMBER > 0) + GPUPOOL_SUCCESS + GPUPOOL_ERROR_INVALID_DEVICE;\n\
             p = gpupool_torch_malloc((ssize_t)16, 0, s);\n\
             gpupool_torch_free(p, (ssize_t)16, 0, s);\n\
             gpupool_torch_empty_cache();\n\
             return r;\n\
         }}\n"
    );
    std::fs::write(&src, body).unwrap();
    let out = Command::new(compiler)
        .arg(format!("-std={std}"))
        .args(["-Wall", "-Wextra", "-Werror", "-fsyntax-only"])
        .args(extra)
        .arg("-I")
        .arg(root().join("include"))
        .arg("-I")
        .arg(root().join("cudasim/include"))
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} -std={std} {extra:?} with cuda_runtime.h {with_cuda:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn header_compiles_as_c99_c11_and_cxx17() {
    compile("cc", "c99", &["-pedantic"], None);
    compile("cc", "c99", &["-pedantic"], Some(true));
    compile("cc", "c11", &["-pedantic"], Some(false));
    compile("c++", "c++17", &[], None);
    compile("c++", "c++17", &["-pedantic"], Some(true));
    compile("c++", "c++17", &["-pedantic"], Some(false));
}
