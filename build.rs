//! Link settings of `libgpupool.so`:
//!
//! - its ELF soname, `libgpupool.so.<major>`: programs linked with `-lgpupool` record that name,
//!   which `scripts/install.sh` installs as a link to the versioned file
//!   (`libgpupool.so.<major>.<minor>.<patch>`), and a preloaded copy satisfies it;
//! - `-Bsymbolic-functions`: the library's calls to its own exported functions (the C API calls
//!   the `cudaMalloc` hook) bind inside the library. Without it they bind through the global
//!   scope, where a CUDA runtime loaded before the library (PyTorch loading it as its pluggable
//!   allocator) would take them and bypass the pool. Other objects still bind to the hooks;
//! - `-z nodelete`: once loaded, the library stays. A plugin linked with it that a program
//!   unloads would otherwise take the pool along: its cached segments leaked (no one left to
//!   free them), the blocks the program still holds orphaned, an exit summary written early.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgpupool.so.{major}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
