//! Gives `libcudasim.so` the ELF soname of the CUDA runtime, so programs linked against it
//! (through a `libcudart.so` link) record `libcudart.so.12` as their dependency, and binds its
//! references to its own functions inside itself (`-Bsymbolic-functions`), as NVIDIA's libraries
//! do: the addresses `cuGetProcAddress` gives are the simulator's own even when a preloaded
//! library (libgpupool) exports functions of the same names.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcudart.so.12");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    println!("cargo:rerun-if-changed=build.rs");
}
