//! Allocations the pool left to CUDA, counted for the summary: stream-ordered ones while the
//! program's own memory pool is current (`dispatch::current_pool`), ones on a stream being
//! captured into a graph, ones on a stream the pool could not place on the current device,
//! driver allocations in a context the program made, and requests the pool ran out of memory
//! for that CUDA's own try then served. CUDA serves them; the pool's counters never see them,
//! so without these a summary would not add up to what the program allocated.
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
    /// A stream-ordered allocation on a stream of another device than the current one, or on
    /// one CUDA could not place (a runtime without `cudaStreamGetDevice`).
    UnplacedStream,
    /// A driver allocation in a context the program made itself, not a device's primary one.
    OwnContext,
    /// The pool ran out of memory, and CUDA's own try found room (memory freed in between).
    AfterOutOfMemory,
}

impl Reason {
    /// Every reason, in the order the reports list them.
    pub const ALL: [Reason; 5] = [
        Reason::OwnMemoryPool,
        Reason::GraphCapture,
        Reason::UnplacedStream,
        Reason::OwnContext,
        Reason::AfterOutOfMemory,
    ];

    /// Its name in the JSON summary and the Prometheus label.
    pub fn name(self) -> &'static str {
        match self {
            Reason::OwnMemoryPool => "own_memory_pool",
            Reason::GraphCapture => "graph_capture",
            Reason::UnplacedStream => "unplaced_stream",
            Reason::OwnContext => "own_context",
            Reason::AfterOutOfMemory => "after_out_of_memory",
        }
    }

    /// What the text summary says of the allocations it sent to CUDA.
    pub fn text(self) -> &'static str {
        match self {
            Reason::OwnMemoryPool => "served by the program's own memory pool",
            Reason::GraphCapture => "captured into a CUDA graph",
            Reason::UnplacedStream => "on a stream the pool could not place on the current device",
            Reason::OwnContext => "in a CUDA context the program created",
            Reason::AfterOutOfMemory => "served by CUDA after the pool ran out of memory",
        }
    }
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
    by_reason: [Tally; Reason::ALL.len()],
}

impl Counts {
    /// These counts with `reason`'s tally set to `t`.
    pub fn with(mut self, reason: Reason, t: Tally) -> Counts {
        self.by_reason[reason as usize] = t;
        self
    }

    /// What went to CUDA for `reason`.
    pub fn get(&self, reason: Reason) -> Tally {
        self.by_reason[reason as usize]
    }

    /// Each reason with its tally, in the order of `Reason::ALL`.
    pub fn each(&self) -> impl Iterator<Item = (Reason, Tally)> + '_ {
        Reason::ALL.into_iter().map(|r| (r, self.get(r)))
    }

    /// Whether any allocation went to CUDA.
    pub fn any(&self) -> bool {
        self.by_reason.iter().any(|t| t.allocations > 0)
    }
}

/// (allocations, bytes) for each `Reason`, in its order.
static COUNTS: [[AtomicU64; 2]; Reason::ALL.len()] =
    [const { [AtomicU64::new(0), AtomicU64::new(0)] }; Reason::ALL.len()];

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
    Reason::ALL.into_iter().fold(Counts::default(), |c, r| {
        let [n, b] = &COUNTS[r as usize];
        let t = Tally {
            allocations: n.load(Ordering::Relaxed),
            bytes: b.load(Ordering::Relaxed),
        };
        c.with(r, t)
    })
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
        assert_eq!(counted(Reason::OwnContext, 64, 0), 0);
        let after = counts();
        let grew = |r: Reason| {
            let (a, b) = (after.get(r), before.get(r));
            (a.allocations - b.allocations, a.bytes - b.bytes)
        };
        assert_eq!(grew(Reason::OwnMemoryPool), (1, 4096));
        assert_eq!(grew(Reason::GraphCapture), (1, 512));
        assert_eq!(grew(Reason::OwnContext), (1, 64));
        assert_eq!(grew(Reason::UnplacedStream), (0, 0));
        for (i, r) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(r as usize, i, "{r:?} indexes the counts");
        }
    }
}
