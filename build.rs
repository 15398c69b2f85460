//! Gives `libgpupool.so` its ELF soname, `libgpupool.so.<major>`: programs linked with
//! `-lgpupool` record that name, which `scripts/install.sh` installs as a link to the versioned
//! file (`libgpupool.so.<major>.<minor>.<patch>`), and a preloaded copy satisfies it.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgpupool.so.{major}");
    println!("cargo:rerun-if-changed=build.rs");
}
