//! The CUDA entry points this library exports: the runtime's (`runtime.rs`) and the driver's
//! (`driver.rs`). Each is the panic boundary, then the one path in `dispatch`.

pub mod driver;
mod origin;
pub mod runtime;

use crate::cuda::types::{Stream, STREAM_PER_THREAD};

/// Stream 0 of a `_ptsz` entry point (runtime or driver): the calling thread's per-thread
/// default stream, never the legacy one.
fn per_thread(stream: Stream) -> Stream {
    if stream.is_null() {
        STREAM_PER_THREAD as Stream
    } else {
        stream
    }
}
