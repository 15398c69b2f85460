//! cudasim: a CUDA runtime simulator. Built as `libcudasim.so` with the soname
//! `libcudart.so.12`, it exports the subset of the CUDA runtime API that libgpupool and its
//! tests use, backed by host memory, and models work still in flight on the device.
//! See `cudasim/README.md` for the specification.
//!
//! The same file is the driver, `libcuda.so.1` (a second name for it): one library, one state.
//! The runtime's exported functions live in `api`, the driver's in `driver`; every one goes
//! through the panic boundary of `ffi`. The runtime reaches the driver through `link`, as
//! NVIDIA's runtime does.

mod api;
mod config;
mod context;
mod current;
mod driver;
mod errors;
mod faults;
mod ffi;
mod handles;
mod link;
mod memory;
mod mempool;
mod pools;
mod state;
mod teardown;
mod timeline;
mod vmm;
