//! libgpupool: a GPU memory caching pool for CUDA programs.
//!
//! Module map (dependencies point down):
//! - `api`: the `gpupool_*` C API (`include/gpupool.h`) and the PyTorch allocator entry points.
//! - `hooks`: the exported CUDA runtime symbols (thin: guard, boundary, then pool or runtime).
//! - `global`: the process-wide state, made on the first CUDA call.
//! - `report`: the summary.
//! - `cuda`: finding the application's runtime, its entry points, the pool backend on them.
//! - `pool`: the caching algorithm, free of FFI.
//! - `workloads`, `policies`: generated request streams, and the allocation policies the pool is
//!   compared with on them (offline only; `gpupool-trace generate`, `compare`).
//! - `config`: every `GPUPOOL_*` variable.
//! - `guard`, `log`: panic boundary, reentrancy guard, stderr lines.

pub mod api;

// cbindgen reads only `api` (the header's content): every other module is marked ignored, so
// that the hooks' `cudaMalloc`... and internal constants stay out of `include/gpupool.h`.
/// cbindgen:ignore
pub mod config;
/// cbindgen:ignore
pub mod cuda;
/// cbindgen:ignore
pub mod dispatch;
/// cbindgen:ignore
pub mod global;
/// cbindgen:ignore
pub mod guard;
/// cbindgen:ignore
pub mod hooks;
/// cbindgen:ignore
pub mod lifecycle;
/// cbindgen:ignore
pub mod load_time;
/// cbindgen:ignore
pub mod log;
/// cbindgen:ignore
pub mod policies;
/// cbindgen:ignore
pub mod pool;
/// cbindgen:ignore
pub mod report;
/// cbindgen:ignore
pub mod workloads;
