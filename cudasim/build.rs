//! Gives `libcudasim.so` the ELF soname of the CUDA runtime, so programs linked against it
//! (through a `libcudart.so` link) record `libcudart.so.12` as their dependency.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcudart.so.12");
    println!("cargo:rerun-if-changed=build.rs");
}
