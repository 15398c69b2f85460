//! Everything that touches the CUDA runtime: finding the application's own runtime, its typed
//! entry points, and the pool backend built on them.

pub mod backend;
pub mod capture_gate;
pub mod captures;
pub mod contexts;
pub mod dl;
pub mod driver;
pub mod hooked;
pub mod last_error;
pub mod loader;
pub mod others;
pub mod runtime;
pub mod symbols;
pub mod types;
