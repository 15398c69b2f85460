//! What follows when the pool ran out of memory for a request: CUDA's own try, whose answer
//! the program gets, and the figures that say which of the two it was.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::cuda::backend::CudaBackend;
use crate::lifecycle::note_passed_through;
use crate::passed_through::Reason;
use crate::pool::{Pool, MAX_DEVICES};

/// Out of memory, as the runtime (`cudaErrorMemoryAllocation`) and the driver
/// (`CUDA_ERROR_OUT_OF_MEMORY`) both say it.
const OUT_OF_MEMORY: i32 = 2;

/// The free bytes of each device that `cudaMemGetInfo` or `cuMemGetInfo` last told the program.
static FREE_TOLD: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// The program was told `free` bytes of `dev` are free.
pub(crate) fn told_free(dev: u32, free: u64) {
    if let Some(told) = FREE_TOLD.get(dev as usize) {
        told.store(free, Ordering::Relaxed);
    }
}

/// Whether a request of `size` bytes on `dev` asks for exactly the free memory the program was
/// last told of: a probe for the largest allocation that fits, whose refusal the program expects
/// and answers with a smaller request. PyTorch sizes cuDNN's workspace so (`cacheInfo`: from
/// the free bytes down by halves), as frameworks size a preallocation. One figure told makes
/// one probe: a later request of the same size is reported.
fn probe(dev: u32, size: usize) -> bool {
    FREE_TOLD.get(dev as usize).is_some_and(|told| {
        size != 0
            && told
                .compare_exchange(size as u64, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    })
}

/// CUDA's answer `r` to a request of `size` bytes that the pool on `dev` ran out of memory
/// for (or the pool's own refusal under its limit). A success gave the program its memory: the
/// pool's out-of-memory was recovered, and the allocation is CUDA's. Out of memory, the program
/// saw it: `report` prints the report, unless the request was a probe of all the free memory
/// (`probe`), which the program is ready to see refused, and which is silent without the pool.
/// The summary counts it all the same, and is written at exit as after an allocation.
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
            // The request reached the pool, which counts it: the exit summary is due.
            crate::lifecycle::note_allocation();
            if probe(dev, size) {
                pool.refused_probe(dev);
            } else {
                report(dev, size as u64);
            }
            r
        }
        _ => r,
    }
}
