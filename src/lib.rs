//! libgpupool: a GPU memory caching pool for CUDA programs.

pub mod config;
pub mod pool;
