//! Allocations the pool left to CUDA, counted for the summary: stream-ordered ones while the
//! program's own memory pool is current (`dispatch::current_pool`), and ones on a stream being
//! captured into a graph. CUDA serves them; the pool's counters never see them, so without
//! these a summary would not add up to what the program allocated.
//!
//! Counted when CUDA's answer is success, with relaxed atomics on the pass-through path only.
//! Once each: the runtime hooks pass a `cudaMallocAsync` to the shared runtime, whose own driver
//! calls never come back to the pool (docs/driver-api.md), and the driver hooks see the driver
//! calls of the static runtimes, which no runtime hook sees.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why an allocation went to CUDA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The device's current memory pool is one the program made (`cudaDeviceSetMemPool`).
    OwnMemoryPool,
    /// The stream is being captured into a graph: the graph owns the allocation.
    GraphCapture,
}

/// Allocations and their requested bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub allocations: u64,
    pub bytes: u64,
}

/// What went to CUDA so far, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub own_memory_pool: Tally,
    pub graph_capture: Tally,
}

impl Counts {
    /// Whether any allocation went to CUDA.
    pub fn any(&self) -> bool {
        self.own_memory_pool.allocations + self.graph_capture.allocations > 0
    }
}

/// (allocations, bytes) for each `Reason`, in its order.
static COUNTS: [[AtomicU64; 2]; 2] = [
    [AtomicU64::new(0), AtomicU64::new(0)],
    [AtomicU64::new(0), AtomicU64::new(0)],
];

fn count(reason: Reason, bytes: u64) {
    let [n, b] = &COUNTS[reason as usize];
    n.fetch_add(1, Ordering::Relaxed);
    b.fetch_add(bytes, Ordering::Relaxed);
}

/// `status`, CUDA's answer to an allocation of `bytes` that the pool left to it for `reason`
/// (the runtime's or the driver's: success is 0 for both), counted when it succeeded.
pub(crate) fn counted(reason: Reason, bytes: usize, status: i32) -> i32 {
    if status == 0 {
        count(reason, bytes as u64);
    }
    status
}

/// What went to CUDA so far.
pub fn counts() -> Counts {
    let tally = |reason: Reason| {
        let [n, b] = &COUNTS[reason as usize];
        Tally {
            allocations: n.load(Ordering::Relaxed),
            bytes: b.load(Ordering::Relaxed),
        }
    };
    Counts {
        own_memory_pool: tally(Reason::OwnMemoryPool),
        graph_capture: tally(Reason::GraphCapture),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the counts are the process's.
    #[test]
    fn counts_what_succeeded() {
        let before = counts();
        assert_eq!(counted(Reason::OwnMemoryPool, 4096, 0), 0);
        assert_eq!(counted(Reason::GraphCapture, 1 << 20, 2), 2);
        assert_eq!(counted(Reason::GraphCapture, 512, 0), 0);
        let after = counts();
        let grew = |a: Tally, b: Tally| (a.allocations - b.allocations, a.bytes - b.bytes);
        assert_eq!(
            grew(after.own_memory_pool, before.own_memory_pool),
            (1, 4096)
        );
        assert_eq!(grew(after.graph_capture, before.graph_capture), (1, 512));
    }
}
