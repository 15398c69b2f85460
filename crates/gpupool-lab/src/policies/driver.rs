//! The simulated driver every policy allocates from: the pool core's model driver on device 0,
//! with an optional capacity, and the counts the comparison reports (calls, reserved bytes and
//! their peak).

use gpupool::pool::backend::{Addr, Backend};
use gpupool::pool::model_driver::{ModelDriver, GUARD_GAP};
use gpupool::pool::model_wrapper::ModelWrapper;

/// What the driver saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Bytes held by the policy now, and the most it held.
    pub reserved: u64,
    pub peak_reserved: u64,
    /// Calls that take memory from the driver, refused ones included (`cudaMalloc`, or a page
    /// mapped for the virtual-memory policies), and how many were refused.
    pub mallocs: u64,
    pub refused: u64,
    /// Calls that give memory back (`cudaFree`, or a page unmapped).
    pub frees: u64,
    /// Of those, the pages mapped and unmapped.
    pub maps: u64,
    pub unmaps: u64,
}

/// The policies' face of the model driver: `malloc` and `free` on device 0, and its counts.
pub struct Driver(ModelDriver);

impl Driver {
    pub fn new(capacity: Option<u64>) -> Driver {
        // The gap keeps segments apart, so a block that ran over its segment would be caught
        // by the overlap check rather than land in the next one.
        Driver(
            ModelDriver::new()
                .with_capacity(capacity.unwrap_or(u64::MAX))
                .with_gap(GUARD_GAP),
        )
    }

    /// `new`, with the driver's virtual memory calls (`Backend::vmm_*`) answering: our pool
    /// then serves large requests from expandable segments.
    pub fn with_vmm(capacity: Option<u64>) -> Driver {
        let Driver(d) = Driver::new(capacity);
        Driver(d.with_vmm())
    }

    /// A `cudaMalloc` of `bytes`: `None` beyond the capacity.
    pub fn malloc(&self, bytes: u64) -> Option<Addr> {
        self.0.alloc_segment(0, bytes).ok()
    }

    /// A `cudaFree` of a segment: false when `addr` is not one.
    pub fn free(&self, addr: Addr) -> bool {
        self.0.free_segment(0, addr).is_ok()
    }

    pub fn counters(&self) -> Counters {
        let c = self.0.counts();
        Counters {
            reserved: c.reserved,
            peak_reserved: c.peak_reserved,
            mallocs: c.mallocs + c.maps,
            refused: c.refused,
            frees: c.frees + c.unmaps,
            maps: c.maps,
            unmaps: c.unmaps,
        }
    }

    /// Reserve `bytes` of address space (no memory).
    pub fn reserve(&self, bytes: u64) -> Option<Addr> {
        self.0.reserve(0, bytes).ok()
    }

    /// Map `bytes` of memory at `addr` in a reserved range: false beyond the capacity.
    pub fn map(&self, addr: Addr, bytes: u64) -> bool {
        self.0.map(0, addr, bytes).is_ok()
    }

    /// Unmap the mapping at `addr`: false when it is not one.
    pub fn unmap(&self, addr: Addr) -> bool {
        self.0.unmap(0, addr).is_ok()
    }

    /// Whether `[addr, end)` lies in segments or mappings without a hole.
    pub fn covers(&self, addr: Addr, end: Addr) -> bool {
        self.0.covers(addr, end)
    }

    /// The segment holding `addr`, as (base, size).
    pub fn segment_containing(&self, addr: Addr) -> Option<(Addr, u64)> {
        self.0
            .segment_containing(addr)
            .map(|(base, segment)| (base, segment.bytes))
    }
}

impl AsRef<ModelDriver> for Driver {
    fn as_ref(&self) -> &ModelDriver {
        &self.0
    }
}

/// Our pool's policy allocates through the `Backend` trait: the model driver's answers.
impl ModelWrapper for Driver {}
