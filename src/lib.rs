//! libgpupool: a GPU memory caching pool for CUDA programs.
//!
//! Module map, callers above what they call (the whole map with one line per file is
//! docs/architecture.md; `tests/layering.rs` keeps the files free of dependency cycles and the
//! pool free of CUDA):
//! - `interpose`: the exported `dlsym` and `dlclose`.
//! - `hooks`: the exported CUDA runtime and driver symbols (the panic boundary, then `dispatch`).
//! - `api`: the `gpupool_*` C API (`include/gpupool.h`) and the PyTorch allocator entry points.
//! - `mempool`: `cudaMallocAsync` and the default memory pool's calls, answered from the pool.
//! - `dispatch`: the one path from every entry point to the pool or CUDA.
//! - `lifecycle`: load, first allocation, exit; the live-dump thread.
//! - `global`: the process-wide state, made on the first CUDA call.
//! - `report`: the summary, the out-of-memory report, the trace file.
//! - `frameworks`: PyTorch's allocator chosen at load; caches of frameworks above the pool.
//! - `cuda`: finding the application's runtime and driver, their entry points, the pool backend
//!   on them.
//! - `guard`, `log`: panic boundary and reentrancy guard; stderr lines and descriptor writes.
//! - `plain_thread`: the library's own threads, started without `dlsym`.
//! - `pool`: the caching algorithm, free of FFI.
//! - `config`: every `GPUPOOL_*` variable.
//! - `passed_through`: the allocations left to CUDA (the program's own memory pool, graph
//!   capture), counted for the summary.
//! - `load_time`, `rng`: the load time, a seeded generator for tests and the lab.
//!
//! The offline lab (workloads, policies, `gpupool-trace`, benchmarks) is the `gpupool-lab`
//! crate (`crates/gpupool-lab`): it uses this library and does not ship in it.

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
pub mod frameworks;
/// cbindgen:ignore
pub mod global;
/// cbindgen:ignore
pub mod guard;
/// cbindgen:ignore
pub mod hooks;
/// cbindgen:ignore
pub mod interpose;
/// cbindgen:ignore
pub mod lifecycle;
/// cbindgen:ignore
pub mod load_time;
/// cbindgen:ignore
pub mod log;
/// cbindgen:ignore
pub mod mempool;
/// cbindgen:ignore
pub mod passed_through;
/// cbindgen:ignore
pub mod plain_thread;
/// cbindgen:ignore
pub mod pool;
/// cbindgen:ignore
pub mod report;
/// cbindgen:ignore
pub mod rng;
