//! The simulated driver every policy allocates from: segments at distinct addresses, an optional
//! capacity, and the counts the comparison reports (calls, reserved bytes and their peak).

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::pool::backend::{Addr, Backend, CudaError};

/// What the driver saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Bytes held by the policy now, and the most it held.
    pub reserved: u64,
    pub peak_reserved: u64,
    /// `cudaMalloc` calls, refused ones included, and how many were refused.
    pub mallocs: u64,
    pub refused: u64,
    /// `cudaFree` calls.
    pub frees: u64,
}

#[derive(Default)]
struct State {
    capacity: u64,
    next: Addr,
    segments: BTreeMap<Addr, u64>,
    c: Counters,
}

/// A lock inside, because our pool's `Backend` takes `&self`; uncontended, and taken only on
/// real allocations and frees.
pub struct Driver {
    s: Mutex<State>,
}

impl Driver {
    pub fn new(capacity: Option<u64>) -> Driver {
        Driver {
            s: Mutex::new(State {
                capacity: capacity.unwrap_or(u64::MAX),
                next: 1 << 40,
                ..State::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.s.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A `cudaMalloc` of `bytes`: `None` beyond the capacity.
    pub fn malloc(&self, bytes: u64) -> Option<Addr> {
        let mut s = self.state();
        s.c.mallocs += 1;
        let step = bytes.checked_next_multiple_of(2 << 20);
        match step {
            Some(step)
                if bytes > 0
                    && s.c
                        .reserved
                        .checked_add(bytes)
                        .is_some_and(|r| r <= s.capacity) =>
            {
                let addr = s.next;
                // A 2 MiB gap keeps segments apart, so a block that ran over its segment would
                // be caught by the overlap check rather than land in the next one.
                s.next = s.next.saturating_add(step.saturating_add(2 << 20));
                s.segments.insert(addr, bytes);
                s.c.reserved += bytes;
                s.c.peak_reserved = s.c.peak_reserved.max(s.c.reserved);
                Some(addr)
            }
            _ => {
                s.c.refused += 1;
                None
            }
        }
    }

    /// A `cudaFree` of a segment: false when `addr` is not one.
    pub fn free(&self, addr: Addr) -> bool {
        let mut s = self.state();
        match s.segments.remove(&addr) {
            Some(bytes) => {
                s.c.reserved -= bytes;
                s.c.frees += 1;
                true
            }
            None => false,
        }
    }

    pub fn counters(&self) -> Counters {
        self.state().c
    }

    /// The segment holding `addr`, as (base, size).
    pub fn segment_containing(&self, addr: Addr) -> Option<(Addr, u64)> {
        let s = self.state();
        let (&base, &size) = s.segments.range(..=addr).next_back()?;
        (addr < base + size).then_some((base, size))
    }
}

impl Backend for Driver {
    fn alloc_segment(&self, _device: u32, bytes: u64) -> Result<Addr, CudaError> {
        self.malloc(bytes).ok_or(CudaError::MEMORY_ALLOCATION)
    }
    fn free_segment(&self, _device: u32, addr: Addr) -> Result<(), CudaError> {
        if self.free(addr) {
            Ok(())
        } else {
            Err(CudaError::INVALID_VALUE)
        }
    }
    fn fence(&self, _device: u32) -> Result<(), CudaError> {
        Ok(())
    }
    fn barrier(&self, _device: u32) -> Result<(), CudaError> {
        Ok(())
    }
    fn memory_info(&self, _device: u32) -> Result<(u64, u64), CudaError> {
        let s = self.state();
        Ok((s.capacity.saturating_sub(s.c.reserved), s.capacity))
    }
}
