//! The CUDA entry points this library exports: the runtime's (`runtime.rs`) and the driver's
//! (`driver.rs`). Each is the panic boundary, then the one path in `dispatch`.

pub mod driver;
mod origin;
pub mod runtime;
