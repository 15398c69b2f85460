//! The offline lab of libgpupool: generated workloads and the allocation policies the pool is
//! compared with on them, replayed through the pool core (`gpupool::pool`) without a GPU. The
//! `gpupool-trace` tool and the multi-thread benchmark are built on it. None of it ships in the
//! preloaded library.

pub mod policies;
pub mod workloads;
