//! libgpupool: a GPU memory caching pool for CUDA programs.
//!
//! Module map (dependencies point down):
//! - `hooks`: the exported CUDA runtime symbols (thin: guard, boundary, then pool or runtime).
//! - `global`: the process-wide state, made on the first CUDA call.
//! - `report`: the summary.
//! - `cuda`: finding the application's runtime, its entry points, the pool backend on them.
//! - `pool`: the caching algorithm, free of FFI.
//! - `config`: every `GPUPOOL_*` variable.
//! - `guard`, `log`: panic boundary, reentrancy guard, stderr lines.

pub mod config;
pub mod cuda;
pub mod global;
pub mod guard;
pub mod hooks;
pub mod log;
pub mod pool;
pub mod report;
