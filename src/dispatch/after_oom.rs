//! What follows when the pool ran out of memory for a request: CUDA's own try, whose answer
//! the program gets, and the figures that say which of the two it was.

use crate::cuda::backend::CudaBackend;
use crate::lifecycle::note_passed_through;
use crate::passed_through::Reason;
use crate::pool::Pool;

/// Out of memory, as the runtime (`cudaErrorMemoryAllocation`) and the driver
/// (`CUDA_ERROR_OUT_OF_MEMORY`) both say it.
const OUT_OF_MEMORY: i32 = 2;

/// CUDA's answer `r` to a request of `size` bytes that the pool on `dev` ran out of memory
/// for (or the pool's own refusal under its limit). A success gave the program its memory: the
/// pool's out-of-memory was recovered, and the allocation is CUDA's. Out of memory, the program
/// saw it: `report` prints the report.
pub(crate) fn answer(
    pool: &Pool<CudaBackend>,
    dev: u32,
    size: usize,
    r: i32,
    report: impl FnOnce(u32, u64),
) -> i32 {
    match r {
        0 => {
            pool.recovered_by_cuda(dev);
            note_passed_through(Reason::AfterOutOfMemory, size, r)
        }
        OUT_OF_MEMORY => {
            report(dev, size as u64);
            r
        }
        _ => r,
    }
}
