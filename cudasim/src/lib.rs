//! cudasim: a CUDA runtime simulator. Built as `libcudasim.so` with the soname
//! `libcudart.so.12`, it exports the subset of the CUDA runtime API that libgpupool and its
//! tests use, backed by host memory, and models work still in flight on the device.
//! See `cudasim/README.md` for the specification.
//!
//! The exported functions live in `api`; every one goes through the panic boundary of
//! `ffi`.

mod api;
mod config;
mod current;
mod errors;
mod faults;
mod ffi;
mod handles;
mod memory;
mod mempool;
mod state;
mod timeline;
