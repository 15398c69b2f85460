//! A model of the CUDA driver, in plain Rust: the one `Backend` the unit tests, the model test,
//! the offline replay, generated traces and the policy comparison all run on.
//!
//! It hands out 2 MiB-aligned addresses in increasing order and never reuses one, holds each
//! device to a capacity, keeps the live segments and counts the calls. Optional: a gap after
//! each segment, so that a block running over its segment's end lands in no other; the next
//! call of a kind failing with a chosen code; and the segment outcomes a trace recorded, played
//! back until one does not match the request (the replay then diverges and the model takes
//! over). Tests that check more, such as work still in flight, wrap it (`model_wrapper.rs`).
//!
//! It also models CUDA's virtual memory calls: address space reserved without memory
//! (`reserve`), and memory mapped into it (`map`, counted against the capacity as segments are)
//! and unmapped again (`unmap`, whole mappings only). A mapping is a segment placed at the
//! caller's address, so `segment_containing` and `covers` see mapped memory as they see
//! segments (`vmm.rs`).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};

use super::backend::{Addr, Backend, CudaError, DeviceSet};

mod vmm;

/// Segments start on 2 MiB boundaries, as the driver's large allocations do.
pub const SEGMENT_ALIGNMENT: u64 = 2 << 20;

/// The granule `with_vmm` reports, a real GPU's (`cuMemGetAllocationGranularity`).
pub const VMM_GRANULE: u64 = 2 << 20;

/// The gap the tests and the policy comparison leave after each segment.
pub const GUARD_GAP: u64 = 2 << 20;

/// The first address handed out unless `starting_at` says otherwise: 1 TiB.
pub const FIRST_ADDRESS: Addr = 1 << 40;

/// A `Backend` call, to make one fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    Malloc,
    Free,
    Fence,
    Barrier,
    MemoryInfo,
    /// `vmm_reserve`, `vmm_map` and `vmm_grant` (with `with_vmm`).
    Reserve,
    Map,
    Grant,
    /// `vmm_access`, the device's own access to the memory just mapped (its
    /// `cuMemSetAccess`): refused, the pool undoes the mappings with unmaps.
    Access,
    /// `vmm_unmap`.
    Unmap,
}

/// A live segment: its device and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub device: u32,
    pub bytes: u64,
}

/// What the driver counted, over all devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// `alloc_segment` calls, refused ones included, and how many were refused.
    pub mallocs: u64,
    pub refused: u64,
    /// Segments given back.
    pub frees: u64,
    /// `fence` and `barrier` calls.
    pub fences: u64,
    pub barriers: u64,
    /// Bytes in live segments now, and the most there ever were.
    pub reserved: u64,
    pub peak_reserved: u64,
    /// `map` calls (refused ones included) and `unmap` calls.
    pub maps: u64,
    pub unmaps: u64,
    /// `vmm_access` calls, refused ones included.
    pub accesses: u64,
}

/// The outcome of one `alloc_segment` a trace recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordedSegment {
    Given { addr: Addr, bytes: u64 },
    Refused { bytes: u64, code: i32 },
}

struct State {
    /// Per device.
    capacity: u64,
    next: Addr,
    gap: u64,
    segments: BTreeMap<Addr, Segment>,
    /// Reserved address ranges (`reserve`): device and bytes, by base.
    ranges: BTreeMap<Addr, Segment>,
    reserved_on: HashMap<u32, u64>,
    counts: Counts,
    /// The next calls of each kind fail with this code, this many times.
    armed: HashMap<Call, (i32, u32)>,
    /// The failures delivered since `clear_delivered`.
    delivered: Vec<(Call, i32)>,
    /// `None` once the outcomes stopped matching, or when there were none.
    recorded: Option<VecDeque<RecordedSegment>>,
    diverged: bool,
    /// Calls a real driver would refuse, or that show a bug in the caller.
    misuses: Vec<String>,
    /// The `Backend`'s virtual memory calls answer (`with_vmm`).
    vmm: bool,
    /// The peers given access to each mapping (`vmm_grant`), by its address.
    access: HashMap<Addr, DeviceSet>,
    /// Mappings left without access for their own device: refused it, then refused the unmap
    /// that would have undone them.
    no_access: HashSet<Addr>,
    /// What the pool said of peers it dropped (`vmm_peer_dropped`): device, peer, error.
    peers_dropped: Vec<(u32, u32, CudaError)>,
}

/// The model driver. A lock inside, because `Backend` takes `&self`; it is taken only on driver
/// calls, which the pool makes seldom.
pub struct ModelDriver {
    state: Mutex<State>,
}

impl Default for ModelDriver {
    fn default() -> Self {
        ModelDriver::new()
    }
}

/// The model driver itself, where a test takes any backend that is or wraps it.
impl AsRef<ModelDriver> for ModelDriver {
    fn as_ref(&self) -> &ModelDriver {
        self
    }
}

impl ModelDriver {
    /// No capacity, addresses from `FIRST_ADDRESS`, each segment right after the last one.
    pub fn new() -> ModelDriver {
        ModelDriver {
            state: Mutex::new(State {
                capacity: u64::MAX,
                next: FIRST_ADDRESS,
                gap: 0,
                segments: BTreeMap::new(),
                ranges: BTreeMap::new(),
                reserved_on: HashMap::new(),
                counts: Counts::default(),
                armed: HashMap::new(),
                delivered: Vec::new(),
                recorded: None,
                diverged: false,
                misuses: Vec::new(),
                vmm: false,
                access: HashMap::new(),
                no_access: HashSet::new(),
                peers_dropped: Vec::new(),
            }),
        }
    }

    /// Each device holds at most `bytes` in segments.
    pub fn with_capacity(self, bytes: u64) -> ModelDriver {
        self.configured(|s| s.capacity = bytes)
    }

    /// The `Backend`'s virtual memory calls work (`reserve`, `map`, `unmap` in `VMM_GRANULE`s):
    /// a pool with expandable segments on uses them.
    pub fn with_vmm(self) -> ModelDriver {
        self.configured(|s| s.vmm = true)
    }

    /// Addresses from `addr` up.
    pub fn starting_at(self, addr: Addr) -> ModelDriver {
        self.configured(|s| s.next = addr)
    }

    /// `bytes` of address space left unused after each segment.
    pub fn with_gap(self, bytes: u64) -> ModelDriver {
        self.configured(|s| s.gap = bytes)
    }

    /// Answer segment requests with `outcomes` in order while each matches the request's size
    /// and a given address could be real; from the first that does not, the model's own answers.
    pub fn replaying(self, outcomes: impl IntoIterator<Item = RecordedSegment>) -> ModelDriver {
        self.configured(|s| s.recorded = Some(outcomes.into_iter().collect()))
    }

    fn configured(mut self, f: impl FnOnce(&mut State)) -> ModelDriver {
        f(self.state.get_mut().unwrap_or_else(|e| e.into_inner()));
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding it leaves consistent state: every change is
        // made whole under the lock.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next `call` fails with `code`.
    pub fn fail_next(&self, call: Call, code: i32) {
        self.fail_next_times(call, code, 1);
    }

    /// The next `times` calls of `call` fail with `code`.
    pub fn fail_next_times(&self, call: Call, code: i32, times: u32) {
        if times > 0 {
            self.lock().armed.insert(call, (code, times));
        }
    }

    /// No call fails any more.
    pub fn clear_armed(&self) {
        self.lock().armed.clear();
    }

    /// The failures delivered since the last `clear_delivered`.
    pub fn delivered(&self) -> Vec<(Call, i32)> {
        self.lock().delivered.clone()
    }

    pub fn clear_delivered(&self) {
        self.lock().delivered.clear();
    }

    pub fn counts(&self) -> Counts {
        self.lock().counts
    }

    /// Bytes in live segments of `device`.
    pub fn reserved_on(&self, device: u32) -> u64 {
        self.lock().reserved(device)
    }

    /// The live segments, by address.
    pub fn segments(&self) -> BTreeMap<Addr, Segment> {
        self.lock().segments.clone()
    }

    /// The live segment holding `addr`, with its base.
    pub fn segment_containing(&self, addr: Addr) -> Option<(Addr, Segment)> {
        let s = self.lock();
        let (&base, &segment) = s.segments.range(..=addr).next_back()?;
        (addr - base < segment.bytes).then_some((base, segment))
    }

    /// Whether `[addr, end)` lies in live segments or mappings that follow one another without
    /// a hole (a block across two adjacent mappings of a reserved range).
    pub fn covers(&self, addr: Addr, end: Addr) -> bool {
        let s = self.lock();
        let mut at = addr;
        while at < end {
            match s.segments.range(..=at).next_back() {
                Some((&base, seg)) if at - base < seg.bytes => at = base + seg.bytes,
                _ => return false,
            }
        }
        true
    }

    /// A device reset: every segment of `device` is gone, without a free.
    pub fn forget_device(&self, device: u32) {
        let mut s = self.lock();
        s.segments.retain(|_, seg| seg.device != device);
        let State {
            access,
            no_access,
            segments,
            ..
        } = &mut *s;
        access.retain(|a, _| segments.contains_key(a));
        no_access.retain(|a| segments.contains_key(a));
        let bytes = s.reserved_on.remove(&device).unwrap_or(0);
        s.counts.reserved -= bytes;
    }

    /// Whether recorded outcomes stopped matching the requests, or some were never asked for.
    pub fn diverged(&self) -> bool {
        let s = self.lock();
        s.diverged || s.recorded.as_ref().is_some_and(|q| !q.is_empty())
    }

    /// Calls a real driver would have refused, or that show a bug in the caller: a free of no
    /// segment, a segment freed as another device's.
    pub fn misuses(&self) -> Vec<String> {
        self.lock().misuses.clone()
    }

    /// `free_segment`, saying which segment went back.
    pub fn release(&self, device: u32, addr: Addr) -> Result<Segment, CudaError> {
        let mut s = self.lock();
        s.fault(Call::Free)?;
        let Some(segment) = s.segments.remove(&addr) else {
            s.misuses
                .push(format!("released {addr:#x}, not a segment of the driver"));
            return Err(CudaError::INVALID_VALUE);
        };
        if segment.device != device {
            s.misuses.push(format!(
                "released segment {addr:#x} of device {} as device {device}'s",
                segment.device
            ));
        }
        *s.reserved_on.entry(segment.device).or_default() -= segment.bytes;
        s.counts.reserved -= segment.bytes;
        s.counts.frees += 1;
        Ok(segment)
    }
}

impl State {
    fn reserved(&self, device: u32) -> u64 {
        self.reserved_on.get(&device).copied().unwrap_or(0)
    }

    /// A failure armed for `call`, delivered now.
    fn fault(&mut self, call: Call) -> Result<(), CudaError> {
        let Some((code, times)) = self.armed.remove(&call) else {
            return Ok(());
        };
        if times > 1 {
            self.armed.insert(call, (code, times - 1));
        }
        self.delivered.push((call, code));
        Err(CudaError(code))
    }

    fn allocate(&mut self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        self.fault(Call::Malloc)?;
        let addr = match self.play_back(bytes) {
            Some(recorded) => recorded?,
            None => self.next_address(device, bytes)?,
        };
        self.segments.insert(addr, Segment { device, bytes });
        *self.reserved_on.entry(device).or_default() += bytes;
        self.counts.reserved += bytes;
        self.counts.peak_reserved = self.counts.peak_reserved.max(self.counts.reserved);
        Ok(addr)
    }

    /// The recorded answer to a request of `bytes`, while the recording still matches.
    fn play_back(&mut self, bytes: u64) -> Option<Result<Addr, CudaError>> {
        let queue = self.recorded.as_mut()?;
        match queue.pop_front() {
            // A corrupt trace can name any address and size: take only what a driver could
            // have returned.
            Some(RecordedSegment::Given { addr, bytes: b })
                if b == bytes && plausible(&self.segments, addr, bytes) =>
            {
                Some(Ok(addr))
            }
            Some(RecordedSegment::Refused { bytes: b, code }) if b == bytes => {
                Some(Err(CudaError(code)))
            }
            _ => {
                self.recorded = None;
                self.diverged = true;
                None
            }
        }
    }

    /// The model's own answer: within the capacity, the next aligned address.
    fn next_address(&mut self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        let fits = self
            .reserved(device)
            .checked_add(bytes)
            .is_some_and(|total| total <= self.capacity);
        let next = bytes
            .checked_next_multiple_of(SEGMENT_ALIGNMENT)
            .and_then(|span| span.checked_add(self.gap))
            .and_then(|span| self.next.checked_add(span));
        match next {
            Some(next) if fits && bytes > 0 => {
                let addr = self.next;
                self.next = next;
                Ok(addr)
            }
            _ => Err(CudaError::MEMORY_ALLOCATION),
        }
    }
}

/// Whether a recorded segment could be real: 512-byte aligned, non-null, ending below 2^63, and
/// overlapping no live segment.
fn plausible(live: &BTreeMap<Addr, Segment>, addr: Addr, bytes: u64) -> bool {
    // Live segments never overlap one another: only the last one starting before the end can
    // reach into [addr, end).
    addr != 0
        && addr.is_multiple_of(512)
        && addr.checked_add(bytes).is_some_and(|end| {
            end < 1 << 63
                && live
                    .range(..end)
                    .next_back()
                    .is_none_or(|(&a, s)| a.saturating_add(s.bytes) <= addr)
        })
}

impl Backend for ModelDriver {
    fn alloc_segment(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        let mut s = self.lock();
        s.counts.mallocs += 1;
        let outcome = s.allocate(device, bytes);
        if outcome.is_err() {
            s.counts.refused += 1;
        }
        outcome
    }

    fn free_segment(&self, device: u32, addr: Addr) -> Result<(), CudaError> {
        self.release(device, addr).map(drop)
    }

    fn fence(&self, _device: u32) -> Result<(), CudaError> {
        let mut s = self.lock();
        s.counts.fences += 1;
        s.fault(Call::Fence)
    }

    fn barrier(&self, _device: u32) -> Result<(), CudaError> {
        let mut s = self.lock();
        s.counts.barriers += 1;
        s.fault(Call::Barrier)
    }

    fn memory_info(&self, device: u32) -> Result<(u64, u64), CudaError> {
        let mut s = self.lock();
        s.fault(Call::MemoryInfo)?;
        Ok((s.capacity.saturating_sub(s.reserved(device)), s.capacity))
    }

    fn allocation_starts_at(&self, addr: Addr) -> Option<bool> {
        Some(self.lock().segments.contains_key(&addr))
    }

    fn vmm_granularity(&self, _device: u32) -> Option<u64> {
        self.lock().vmm.then_some(VMM_GRANULE)
    }

    fn vmm_reserve(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        {
            let mut s = self.lock();
            if !s.vmm {
                return Err(CudaError::NOT_SUPPORTED);
            }
            s.fault(Call::Reserve)?;
        }
        self.reserve(device, bytes)
    }

    fn vmm_map(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        {
            let mut s = self.lock();
            if !s.vmm {
                return Err(CudaError::NOT_SUPPORTED);
            }
            if let Err(e) = s.fault(Call::Map) {
                s.counts.maps += 1;
                return Err(e);
            }
            if !addr.is_multiple_of(VMM_GRANULE) || !bytes.is_multiple_of(VMM_GRANULE) {
                s.misuses
                    .push(format!("mapped {addr:#x}+{bytes}, not whole granules"));
                return Err(CudaError::INVALID_VALUE);
            }
        }
        self.map(device, addr, bytes)?;
        // No access until `vmm_access` gives it.
        self.lock().no_access.insert(addr);
        Ok(())
    }

    fn vmm_access(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        let mut s = self.lock();
        s.counts.accesses += 1;
        s.fault(Call::Access)?;
        let bases = s.whole_mappings(device, addr, bytes);
        if bases.is_empty() {
            s.misuses.push(format!(
                "gave access to {addr:#x}+{bytes}, not whole mappings of device {device}"
            ));
            return Err(CudaError::INVALID_VALUE);
        }
        for b in bases {
            s.no_access.remove(&b);
        }
        Ok(())
    }

    fn vmm_unmap(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        {
            let mut s = self.lock();
            if let Err(e) = s.fault(Call::Unmap) {
                s.counts.unmaps += 1;
                return Err(e);
            }
        }
        let unmapped = self.unmap(device, addr)?;
        if unmapped != bytes {
            self.lock().misuses.push(format!(
                "unmapped {addr:#x} as {bytes} bytes, mapped as {unmapped}"
            ));
        }
        Ok(())
    }

    fn vmm_grant(
        &self,
        device: u32,
        addr: Addr,
        bytes: u64,
        peers: DeviceSet,
    ) -> Result<(), CudaError> {
        let mut s = self.lock();
        s.fault(Call::Grant)?;
        let bases = s.whole_mappings(device, addr, bytes);
        if bases.is_empty() || peers.contains(device) {
            s.misuses.push(format!(
                "granted {addr:#x}+{bytes}, not whole mappings of peers"
            ));
            return Err(CudaError::INVALID_VALUE);
        }
        for b in bases {
            let given = s.access.entry(b).or_default();
            *given = DeviceSet(given.0 | peers.0);
        }
        Ok(())
    }

    fn vmm_free_reservation(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        let mut s = self.lock();
        let end = addr.saturating_add(bytes);
        let still_mapped = s
            .segments
            .range(addr..end)
            .next()
            .is_some_and(|(_, seg)| seg.device == device);
        match s.ranges.get(&addr) {
            Some(r) if r.device == device && r.bytes == bytes && !still_mapped => {
                s.ranges.remove(&addr);
                Ok(())
            }
            _ => {
                s.misuses
                    .push(format!("freed reservation {addr:#x}+{bytes} wrongly"));
                Err(CudaError::INVALID_VALUE)
            }
        }
    }

    fn vmm_peer_dropped(&self, device: u32, peer: u32, why: CudaError) {
        self.lock().peers_dropped.push((device, peer, why));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_segment_is_plausible_only_where_no_live_one_is() {
        let on_0 = |bytes| Segment { device: 0, bytes };
        let live: BTreeMap<Addr, Segment> =
            [(0x10000, on_0(0x1000)), (0x20000, on_0(0x8000))].into();
        let ok = |a, n| plausible(&live, a, n);
        // Between, touching either side.
        assert!(ok(0x11000, 0xf000));
        assert!(ok(0x28000, 0x100));
        assert!(ok(0x200, 0x10000 - 0x200));
        // Overlapping the start, the end, or inside one; covering one whole.
        assert!(!ok(0x1fe00, 0x400));
        assert!(!ok(0x27e00, 0x400));
        assert!(!ok(0x10200, 0x200));
        assert!(!ok(0x0fe00, 0x20000));
        // Null, unaligned, wrapping or beyond 2^63.
        assert!(!ok(0, 512));
        assert!(!ok(0x30100, 512));
        assert!(!ok(u64::MAX - 511, 1024));
        assert!(!ok(1 << 63, 512));
    }
}
