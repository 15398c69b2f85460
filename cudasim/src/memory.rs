//! Allocations: host mappings standing for device (and pinned host) memory.

use crate::errors::{CudaResult, MEMORY_ALLOCATION};
use crate::pools::PoolId;
use std::collections::BTreeMap;

/// Device capacity is accounted in requested bytes rounded up to this.
pub const GRANULE: u64 = 512;

/// `size` rounded up to the accounting granule; `None` on overflow.
pub fn accounted(size: u64) -> Option<u64> {
    size.checked_next_multiple_of(GRANULE)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `cudaMalloc`, `cudaMallocAsync`, `cudaMallocFromPoolAsync`, `cudaMallocPitch`.
    Device,
    /// `cudaMallocManaged`.
    Managed,
    /// `cudaMallocHost` (pinned host memory: not accounted on the device).
    Host,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Live,
    /// `cudaFree` is waiting for the device; the mapping stays until it is done.
    Freeing,
    /// `cudaFreeAsync` was called; the mapping goes when its stream reaches that point.
    PendingFree,
}

#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    pub base: usize,
    /// Requested bytes (the usable range is `[base, base + size)`).
    pub size: usize,
    /// Bytes taken from the device's capacity (`size` rounded up to 512; 0 for host memory).
    pub accounted: u64,
    pub device: usize,
    pub kind: Kind,
    pub state: State,
    /// The memory pool it was taken from (`cudaMallocAsync`, `cudaMallocFromPoolAsync`
    /// outside a capture).
    pub pool: Option<PoolId>,
    /// The created context (`cuCtxCreate_v2`) current when it was made: it dies with that
    /// context. `None` for the primary context's and for memory pools', which are the device's.
    pub context: Option<usize>,
}

impl Alloc {
    pub fn end(&self) -> usize {
        self.base + self.size
    }
}

/// Every mapping the simulator made, by base address.
#[derive(Default)]
pub struct Allocations {
    map: BTreeMap<usize, Alloc>,
}

impl Allocations {
    /// Maps `size` (> 0) bytes of lazily committed memory and records it as live.
    pub fn create(
        &mut self,
        size: usize,
        accounted: u64,
        device: usize,
        kind: Kind,
        pool: Option<PoolId>,
    ) -> CudaResult<usize> {
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches
        // no existing memory; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(MEMORY_ALLOCATION);
        }
        let base = p as usize;
        self.map.insert(
            base,
            Alloc {
                base,
                size,
                accounted,
                device,
                kind,
                state: State::Live,
                pool,
                context: None,
            },
        );
        Ok(base)
    }

    /// Unmaps the allocation at `base` (in any state) and returns it.
    pub fn destroy(&mut self, base: usize) -> Option<Alloc> {
        let a = self.map.remove(&base)?;
        // SAFETY: `[base, base + size)` is a mapping this module made and nothing else refers
        // to it any more (its record is gone); unmapping cannot fail for such a range.
        unsafe { libc::munmap(a.base as *mut libc::c_void, a.size) };
        Some(a)
    }

    /// The live allocation that starts exactly at `base`.
    pub fn live_at(&mut self, base: usize) -> Option<&mut Alloc> {
        self.map.get_mut(&base).filter(|a| a.state == State::Live)
    }

    /// The mapping (in any state) that contains `addr`.
    fn mapping_containing(&self, addr: usize) -> Option<&Alloc> {
        self.map
            .range(..=addr)
            .next_back()
            .map(|(_, a)| a)
            .filter(|a| addr < a.end())
    }

    /// The live allocation that contains `addr` (at its start or inside).
    pub fn live_containing(&self, addr: usize) -> Option<&Alloc> {
        self.mapping_containing(addr)
            .filter(|a| a.state == State::Live)
    }

    /// Whether `[addr, addr + len)` lies inside one live allocation.
    pub fn live_range(&self, addr: usize, len: usize) -> bool {
        self.live_containing(addr)
            .is_some_and(|a| addr.checked_add(len).is_some_and(|e| e <= a.end()))
    }

    /// Whether `[addr, addr + len)` lies inside one mapping, live or being freed (a kernel's
    /// write may land there; once unmapped it is dropped).
    pub fn mapped_range(&self, addr: usize, len: usize) -> bool {
        self.mapping_containing(addr)
            .is_some_and(|a| addr.checked_add(len).is_some_and(|e| e <= a.end()))
    }

    /// Whether the mapping at `base` waits for its `cudaFreeAsync` to be reached.
    pub fn pending_free_at(&self, base: usize) -> bool {
        self.map
            .get(&base)
            .is_some_and(|a| a.state == State::PendingFree)
    }

    /// Whether the mapping at `base` is being freed by `cudaFree`.
    pub fn freeing_at(&self, base: usize) -> bool {
        self.map
            .get(&base)
            .is_some_and(|a| a.state == State::Freeing)
    }

    /// The base addresses of device `d`'s allocations, in any state.
    /// The bases of the allocations made in created context `ctx`.
    pub fn of_context(&self, ctx: usize) -> Vec<usize> {
        self.map
            .values()
            .filter(|a| a.context == Some(ctx))
            .map(|a| a.base)
            .collect()
    }

    /// Records that the allocation at `base` belongs to created context `ctx`.
    pub fn set_context(&mut self, base: usize, ctx: usize) {
        if let Some(a) = self.map.get_mut(&base) {
            a.context = Some(ctx);
        }
    }

    pub fn of_device(&self, d: usize) -> Vec<usize> {
        self.map
            .values()
            .filter(|a| a.device == d)
            .map(|a| a.base)
            .collect()
    }
}
