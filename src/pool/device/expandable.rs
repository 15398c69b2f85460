//! Expandable segments (docs/design-notes.md, "Note: expandable segments"): blocks come from
//! reserved address ranges, one per device for small blocks and one for large ones, packed one
//! after another, with physical memory mapped in granules as blocks need it and free granules
//! unmapped again, once a fence proved the work that used them done.
//!
//! An expandable segment is a `Segment` with a bitmap of its mapped granules. Its blocks tile
//! the whole range: the free block at its end is address space not yet used, mapped only where a
//! request carves it. A block is mapped in the one place a free block goes to the program or a
//! thread cache (`serve`, through `map_or_recover`); bins and pending queues only ever hold
//! blocks that were handed out, so they are mapped, and the hit path does no work for this.

use super::granules::Granules;
use super::*;
use crate::pool::trace::{MAP_BEYOND_MEMORY, UNMAP_RESET, UNMAP_UNDONE};

/// Address space reserved per range when the device's size is not known. More than any GPU
/// holds today, and address space costs nothing until mapped.
const RANGE_UNKNOWN: u64 = 256 << 30;
/// Ranges are twice the device's memory (a packed range cannot run out before the device does,
/// whatever the holes between blocks), within these bounds.
const RANGE_MIN: u64 = 1 << 30;
const RANGE_MAX: u64 = 4 << 40;
/// From this many granules to map for one block, the device's free memory is asked first.
const ASK_FREE_FROM: u64 = 32;

/// Whether a device's blocks come from expandable segments, and if not, why (for the
/// reports).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Expandable {
    /// `GPUPOOL_EXPANDABLE` is off.
    #[default]
    Off,
    /// Asked for, but the driver offers no virtual memory management on this device.
    Unavailable,
    /// Asked for, but a visible device cannot reach this one's memory (`cuDeviceCanAccessPeer`),
    /// which a copy with it current needs of mapped memory.
    NoPeerAccess,
    /// On until the driver refused a mapping for another reason than memory (this code),
    /// before any worked: classic segments since.
    Refused(CudaError),
    /// On.
    On,
}

impl DevicePool {
    /// Serve large requests from expandable segments, if `backend` can map memory on this
    /// device. Called once, before the first request.
    pub fn enable_expandable(&mut self, backend: &dyn Backend) {
        let Some(granule) = backend
            .vmm_granularity(self.device)
            .filter(|g| g.is_power_of_two() && g.is_multiple_of(ALIGN))
        else {
            self.expandable_use = Expandable::Unavailable;
            return;
        };
        // Every device the program may make current must be able to reach the memory: a copy
        // with it current works on `cudaMalloc` memory and would fail on mapped memory.
        if backend.vmm_peers(self.device).is_none() {
            self.expandable_use = Expandable::NoPeerAccess;
            return;
        }
        let range = match backend.memory_info(self.device) {
            Ok((_, total)) => total.saturating_mul(2).clamp(RANGE_MIN, RANGE_MAX),
            Err(_) => RANGE_UNKNOWN,
        };
        self.set_expandable(granule, range);
    }

    /// Serve large requests from ranges of `range` bytes mapped in granules of `granule` bytes
    /// (a power of two, a multiple of `ALIGN`): what `enable_expandable` found, or what a trace
    /// recorded (`replay.rs`).
    pub fn set_expandable(&mut self, granule: u64, range: u64) {
        self.granule = granule;
        self.range_bytes = range.next_multiple_of(granule);
        self.record(Kind::Expandable, granule, self.range_bytes, 0, 0);
        self.expandable_use = Expandable::On;
    }

    /// Whether blocks come from expandable segments, and if not, why.
    pub fn expandable_use(&self) -> Expandable {
        match self.expandable_refused {
            Some(why) => Expandable::Refused(why),
            None => self.expandable_use,
        }
    }

    /// Whether blocks come from expandable segments.
    pub fn expandable(&self) -> bool {
        self.granule != 0
    }

    /// The granules `[addr, addr + bytes)` touches in segment `si`: first and end.
    pub(super) fn granules_of(&self, si: u32, addr: Addr, bytes: u64) -> (u64, u64) {
        let base = self.seg(si).addr;
        let g = self.granule;
        ((addr - base) / g, (addr + bytes - base).div_ceil(g))
    }

    /// The granules wholly inside `[addr, addr + bytes)` in segment `si`: first and end (no
    /// more than `first` when none is).
    pub(super) fn granules_within(&self, si: u32, addr: Addr, bytes: u64) -> (u64, u64) {
        let base = self.seg(si).addr;
        let g = self.granule;
        ((addr - base).div_ceil(g), (addr + bytes - base) / g)
    }

    /// A new expandable segment for `class` that holds at least `size` bytes: a reserved
    /// range and its single free block, nothing mapped. `None` when it is not for this class or
    /// size, or the reservation failed: the caller falls back to a classic segment.
    pub(super) fn new_range(
        &mut self,
        class: Class,
        size: u64,
        backend: &dyn Backend,
    ) -> Option<u32> {
        // Small blocks get a range of their own, apart from large ones, so that a long-lived
        // small block pins one granule, not the large blocks' holes around it. A request
        // larger than a range, twice the device's memory, gets the classic segment's refusal.
        if self.granule == 0 || size > self.range_bytes || self.range_refused[class as usize] {
            return None;
        }
        let bytes = self.range_bytes;
        let addr = match backend.vmm_reserve(self.device, bytes) {
            Ok(addr) => addr,
            Err(e) => {
                self.record(Kind::RangeRefused, bytes, e.0 as u64, 0, 0);
                self.stats.ranges_refused += 1;
                // Not for lack of memory: asking again at every segment would only repeat the
                // refusal. With no range yet the driver has no usable virtual memory; else this
                // class keeps classic segments beside the other's range.
                if e != CudaError::MEMORY_ALLOCATION {
                    if self.ranges.is_empty() {
                        self.stop_expandable(backend, e);
                    } else {
                        self.range_refused[class as usize] = true;
                    }
                }
                return None;
            }
        };
        self.record(Kind::RangeReserved, addr, bytes, 0, 0);
        self.stats.segments.add(1);
        self.sample_memory(backend);
        let granules = Granules::new(bytes / self.granule);
        Some(self.add_segment(addr, bytes, class, Some(granules)))
    }

    /// Map what free block `idx` still lacks for the request of `rounded` bytes it is about to
    /// serve (all of it, if `take` will not split it). Out of memory: the last step of the
    /// ladder, for mapped memory, which may serve the request from another block. The block's
    /// handle. `hit`: the request was counted as a hit, which a failure takes back.
    pub(super) fn map_or_recover(
        &mut self,
        idx: u32,
        rounded: u64,
        hit: bool,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Result<u32, CudaError> {
        if !self.seg(self.blocks[idx as usize].seg).expandable {
            return Ok(idx);
        }
        // The slack moves large blocks' granules: a small request maps a granule at most.
        let idx = match class_of(rounded) {
            Class::Large => self.stay_within_slack(idx, rounded, backend, clock, policy),
            Class::Small => idx,
        };
        if !self.seg(self.blocks[idx as usize].seg).expandable {
            return Ok(idx);
        }
        let Err(refused) = self.map_block(idx, rounded, backend, policy) else {
            return Ok(idx);
        };
        // The request is one hit or one miss, whatever the steps below count: a miss if it is
        // served and they grew a range or segment for it, else a hit. Counted so far: a hit
        // if `hit`, else the miss of `grow`.
        let hits = self.stats.hits - u64::from(hit && cfg!(feature = "stats"));
        let misses = self.stats.misses;
        let served = self.after_refused_map(refused, rounded, backend, clock, policy);
        let grown = self.stats.misses > misses;
        self.stats.hits = hits + u64::from(served.is_ok() && !grown);
        self.stats.misses =
            misses.saturating_sub(u64::from(!hit)) + u64::from(served.is_ok() && grown);
        served
    }

    fn after_refused_map(
        &mut self,
        refused: CudaError,
        rounded: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Result<u32, CudaError> {
        match refused {
            e if e != CudaError::MEMORY_ALLOCATION
                && !self.mapping_worked
                && self.unmap_every_unready(backend) =>
            {
                self.stop_expandable(backend, e);
                let seg_size = segment_size(rounded, self.grow_above(policy))
                    .ok_or(CudaError::MEMORY_ALLOCATION)?;
                self.refill(class_of(rounded), rounded, seg_size, backend, clock, policy)
            }
            // Mapping worked before: the refusal is taken as the driver's lack of memory.
            _ => self.recover_mapping(rounded, backend, clock, policy),
        }
    }

    /// Unmap the granules refused mappings left unready, before expandable segments stop:
    /// whether none is left (an unmap refused again keeps them, and the ranges with them).
    fn unmap_every_unready(&mut self, backend: &dyn Backend) -> bool {
        let unready: Vec<(u32, u64)> = self
            .ranges
            .iter()
            .flat_map(|(si, granules)| granules.unready().iter().map(move |&k| (*si, k)))
            .collect();
        unready
            .into_iter()
            .all(|(si, k)| self.unmap_unready(si, k, backend).is_ok())
    }

    /// The driver refused a mapping for another reason than memory before any block's
    /// mapping worked: virtual memory is missing or broken on this device. Expandable segments stop
    /// here; the ranges, which hold nothing, go back, and classic segments serve from now on.
    fn stop_expandable(&mut self, backend: &dyn Backend, why: CudaError) {
        for (si, _) in std::mem::take(&mut self.ranges) {
            let s = self.seg(si);
            let (addr, size, idx) = (s.addr, s.size, s.first);
            // Nothing mapped: nothing was handed out, so the range is its one free block.
            debug_assert_eq!(self.blocks[idx as usize].next, NONE);
            self.unindex(idx);
            self.drop_block(idx);
            self.by_addr.remove(&addr);
            self.segments[si as usize] = None;
            self.vacant_segments.push(si);
            self.stats.segments.sub(1);
            let _ = backend.vmm_free_reservation(self.device, addr, size);
        }
        self.granule = 0;
        self.unmap_due = false;
        self.expandable_refused = Some(why);
        backend.vmm_stopped(self.device, why);
    }

    /// After the program reset the device. A context's destruction frees what `cuMemAlloc`
    /// gave but not virtual memory (`cuCtxDestroy`'s documentation: memory from `cuMemCreate`
    /// stays), so every granule is unmapped and every range freed here. The reset waited for
    /// the context's work, and destroyed it: nothing runs on the granules any more. Returns
    /// whether there was a range: the pool's figures then no longer match the driver, and the
    /// caller forgets the device. A range with a granule whose unmap the driver refused stays
    /// reserved, kept for `forget_all` to take back with that granule (`kept_after_reset`).
    pub fn unmap_all_after_reset(&mut self, backend: &dyn Backend) -> bool {
        if self.ranges.is_empty() {
            return false;
        }
        let g = self.granule;
        for (si, granules) in std::mem::take(&mut self.ranges) {
            let (addr, size) = (self.seg(si).addr, self.seg(si).size);
            let mut left = Granules::new(size / g);
            for k in (0..size / g).filter(|&k| granules.is_mapped(k)) {
                if backend.vmm_unmap(self.device, addr + k * g, g).is_err() {
                    left.left_mapped(k, g);
                } else {
                    // Driver calls like any unmap: counted, so that the granules mapped less
                    // those unmapped stay what is mapped, and recorded for the replay.
                    self.record(Kind::Unmap, addr + k * g, g, 0, UNMAP_RESET);
                    self.stats.granules_unmapped += 1;
                }
            }
            if left.mapped == 0 {
                let _ = backend.vmm_free_reservation(self.device, addr, size);
            } else {
                let class = self.seg(si).class;
                self.kept_after_reset.push((addr, size, class, left));
            }
        }
        true
    }

    /// `forget_all`: the ranges `unmap_all_after_reset` kept come back, each one free block
    /// over granules left mapped and unready (the driver holds them: counted, unmapped at the
    /// next release, mapped afresh before a block uses one).
    pub(super) fn take_back_kept_ranges(&mut self) {
        for (addr, size, class, granules) in std::mem::take(&mut self.kept_after_reset) {
            let mapped = granules.mapped;
            self.add_segment(addr, size, class, Some(granules));
            self.stats.reserved.add(mapped);
            self.stats.segments.add(1);
            self.unmap_due = true;
        }
    }

    /// Map the granules block `idx` would hand out for `rounded` bytes and lacks, one mapping
    /// per granule (so that each can be unmapped alone), give the device access to each run of
    /// them at once, and the device's peers too. All or nothing: on a refusal (a map or an
    /// access) the granules mapped here are unmapped again, which is safe at once (nothing used
    /// them). A granule whose unmap is refused too stays mapped and counted but unready,
    /// perhaps without access: it is unmapped and mapped afresh here before a block uses it.
    pub(super) fn map_block(
        &mut self,
        idx: u32,
        rounded: u64,
        backend: &dyn Backend,
        policy: &Policy,
    ) -> Result<(), CudaError> {
        let (si, first, end) = self.granules_to_serve(idx, rounded, policy);
        let (base, g) = (self.seg(si).addr, self.granule);
        if let Some(refused) = self.beyond_memory(si, first, end, backend) {
            return Err(refused);
        }
        let mut mapped_here = Vec::new();
        let mut refused = None;
        for k in first..end {
            if self.granules(si).is_unready(k) {
                if let Err(e) = self.unmap_unready(si, k, backend) {
                    refused = Some(e);
                    break;
                }
            }
            if self.granules(si).is_mapped(k) {
                continue;
            }
            if self.stats.reserved.current + g > self.limit {
                self.limit_refused = true;
                self.stats.limit_refusals += 1;
                refused = Some(CudaError::MEMORY_ALLOCATION);
                break;
            }
            if let Err(e) = backend.vmm_map(self.device, base + k * g, g) {
                self.record(Kind::MapRefused, base + k * g, g, e.0 as u64, 0);
                refused = Some(e);
                break;
            }
            self.record(Kind::Map, base + k * g, g, 0, 0);
            self.granules_mut(si).set(k, true);
            self.stats.granules_mapped += 1;
            // Counted as the driver maps it, not once the block is whole: the driver holds it
            // from now, so the peak reserved includes what a mapping refused later held, as
            // the trace's records (a `Map` each) count it.
            self.stats.reserved.add(g);
            mapped_here.push(k);
        }
        if refused.is_none() {
            refused = self.give_access(si, &mapped_here, backend).err();
        }
        if refused.is_none() && !mapped_here.is_empty() {
            self.grant_peers(si, first, end, backend);
        }
        if let Some(e) = refused {
            for k in mapped_here {
                if backend.vmm_unmap(self.device, base + k * g, g).is_ok() {
                    self.record(Kind::Unmap, base + k * g, g, 0, UNMAP_UNDONE);
                    self.granules_mut(si).set(k, false);
                    self.stats.reserved.sub(g);
                    self.stats.granules_unmapped += 1;
                } else {
                    self.keep_left_mapped(si, k);
                }
            }
            return Err(e);
        }
        self.mapping_worked = true;
        let added = mapped_here.len() as u64 * g;
        self.granules_mut(si).mapped += added;
        Ok(())
    }

    /// Give the device access to granules `mapped` of segment `si` (ascending, just mapped):
    /// one `cuMemSetAccess` per run of adjacent ones, not one per granule.
    fn give_access(&self, si: u32, mapped: &[u64], backend: &dyn Backend) -> Result<(), CudaError> {
        let (base, g) = (self.seg(si).addr, self.granule);
        for run in mapped.chunk_by(|a, b| b == &(a + 1)) {
            backend.vmm_access(self.device, base + run[0] * g, run.len() as u64 * g)?;
        }
        Ok(())
    }

    /// Whether what granules `[first, end)` of segment `si` lack is more than the pool may map
    /// (its limit) or the device has free: then the mapping is refused before it starts. The
    /// driver would refuse it part-way, after a call a granule, all undone again, and other
    /// allocations, this process's and others', would find the device full meanwhile. A
    /// refusal for the device's memory is recorded: a replay cannot know the free memory.
    /// Where the driver cannot say what is free, the mapping is tried.
    fn beyond_memory(
        &mut self,
        si: u32,
        first: u64,
        end: u64,
        backend: &dyn Backend,
    ) -> Option<CudaError> {
        let lacking = end - first - self.granules(si).count_between(first, end);
        if lacking == 0 {
            return None;
        }
        let bytes = lacking * self.granule;
        if self.stats.reserved.current.saturating_add(bytes) > self.limit {
            self.limit_refused = true;
            self.stats.limit_refusals += 1;
            return Some(CudaError::MEMORY_ALLOCATION);
        }
        if lacking < ASK_FREE_FROM {
            return None;
        }
        // Only a sample taken now: an older one may be from when the device was full.
        if self.sample_memory(backend).is_none_or(|m| bytes <= m.free) {
            return None;
        }
        let refused = CudaError::MEMORY_ALLOCATION;
        let k = self.granules(si).next_with(first, end, false);
        let (base, g) = (self.seg(si).addr, self.granule);
        self.record(
            Kind::MapRefused,
            base + k * g,
            g,
            refused.0 as u64,
            MAP_BEYOND_MEMORY,
        );
        Some(refused)
    }

    /// Granule `k` of segment `si` stays mapped, not ready for a block: still counted, since
    /// the driver holds its memory, and given back by a release like any free granule (a free
    /// block now holds it, which no free made: the release must look). Its map and its bytes
    /// were counted when it was made.
    fn keep_left_mapped(&mut self, si: u32, k: u64) {
        let g = self.granule;
        self.granules_mut(si).left_mapped(k, g);
        self.unmap_due = true;
    }

    /// Unmap unready granule `k` of segment `si`, which no block used, so that it can be mapped
    /// afresh.
    fn unmap_unready(&mut self, si: u32, k: u64, backend: &dyn Backend) -> Result<(), CudaError> {
        let g = self.granule;
        let at = self.seg(si).addr + k * g;
        backend.vmm_unmap(self.device, at, g)?;
        self.record(Kind::Unmap, at, g, 0, UNMAP_UNDONE);
        self.granules_mut(si).unmapped(k, g);
        self.stats.reserved.sub(g);
        self.stats.granules_unmapped += 1;
        Ok(())
    }

    /// The segment and granules `[first, end)` free block `idx` hands out for a request of
    /// `rounded` bytes (all of it, if `take` will not split it), where `place` puts it.
    pub(super) fn granules_to_serve(
        &self,
        idx: u32,
        rounded: u64,
        policy: &Policy,
    ) -> (u32, u64, u64) {
        let b = &self.blocks[idx as usize];
        let at = self.placed_at(idx, rounded, policy);
        let served = if at == b.addr {
            self.served_bytes(idx, rounded, policy)
        } else {
            rounded
        };
        let (first, end) = self.granules_of(b.seg, at, served);
        (b.seg, first, end)
    }

    /// The granules of segment `si`, if it is expandable.
    pub(super) fn range_granules(&self, si: u32) -> Option<&Granules> {
        self.ranges.iter().find(|r| r.0 == si).map(|r| &r.1)
    }

    pub(super) fn granules(&self, si: u32) -> &Granules {
        self.range_granules(si).expect("an expandable segment")
    }

    pub(super) fn granules_mut(&mut self, si: u32) -> &mut Granules {
        let r = self.ranges.iter_mut().find(|r| r.0 == si);
        &mut r.expect("an expandable segment").1
    }

    /// Whether a fence that completed started after every free so far: then no work the
    /// program issued before a free still runs, and any free memory may be unmapped.
    pub(super) fn fenced_since_frees(clock: &ReuseClock) -> bool {
        clock.fenced.load(Ordering::Acquire) >= clock.freed.load(Ordering::Acquire)
    }

    /// Unmap mapped granules no block but a free one touches, the highest first, until the cache
    /// holds at most `keep` bytes, after a fence unless one already covers every free (`cuMemUnmap` waits
    /// for nothing, and an unmap under a running kernel is a fault, in every reuse mode).
    /// Empty-cache and out-of-memory fence first when blocks are pending, as a classic segment's
    /// `cudaFree` waits for them. Binned blocks must have been merged back. Returns the bytes
    /// unmapped.
    pub(super) fn unmap_free_granules(
        &mut self,
        backend: &dyn Backend,
        clock: &ReuseClock,
        keep: u64,
        why: Release,
    ) -> u64 {
        if self.cached() <= keep {
            return 0;
        }
        if why != Release::Threshold && self.pending_bytes() > 0 {
            // A failed fence leaves them pending: what is free already still goes.
            let _ = self.fence(backend, clock);
            self.flush_bins();
        }
        if !self.unmap_due {
            return 0;
        }
        let Some(mut candidates) = self.fenced_free_granules(backend, clock) else {
            return 0;
        };
        // The highest first, when some are kept: a free block then keeps its mapped part at its
        // start, where the next request it fits is placed, and the range's top goes back.
        // Lowest first, under a threshold the lab's inference mapped 3 to 16 times as many.
        candidates.reverse();
        let want = self.cached().saturating_sub(keep);
        let (released, all) = self.unmap_listed(candidates, want, backend, why as u16);
        self.count_unmapped(why, released / self.granule);
        self.unmap_due = !all;
        released
    }

    /// The free granules (`free_granules`), once a fence covers every free so far: taking
    /// one if none did. `None` if the fence failed, or nothing is free to unmap (which clears
    /// `unmap_due`).
    pub(super) fn fenced_free_granules(
        &mut self,
        backend: &dyn Backend,
        clock: &ReuseClock,
    ) -> Option<Vec<(u32, u64)>> {
        let candidates = self.free_granules();
        if candidates.is_empty() {
            self.unmap_due = false;
            return None;
        }
        if Self::fenced_since_frees(clock) {
            return Some(candidates);
        }
        if self.fence(backend, clock).is_err() || !Self::fenced_since_frees(clock) {
            return None;
        }
        // What the fence made reusable can go too.
        self.flush_bins();
        Some(self.free_granules())
    }

    /// Unmap the granules of `list` in its order until `want` bytes went back, or the driver
    /// refuses one. Returns the bytes unmapped, and whether the whole list went.
    pub(super) fn unmap_listed(
        &mut self,
        list: Vec<(u32, u64)>,
        want: u64,
        backend: &dyn Backend,
        why: u16,
    ) -> (u64, bool) {
        let g = self.granule;
        let mut released = 0;
        let total = list.len() as u64 * g;
        for (si, k) in list {
            if released >= want {
                break;
            }
            let at = self.seg(si).addr + k * g;
            if backend.vmm_unmap(self.device, at, g).is_err() {
                return (released, false);
            }
            self.record(Kind::Unmap, at, g, 0, why);
            self.granules_mut(si).unmapped(k, g);
            self.stats.reserved.sub(g);
            self.stats.granules_unmapped += 1;
            released += g;
        }
        (released, released == total)
    }

    /// Whether a fence would let mapped granules go that pending blocks keep: a run of
    /// neighbours, each free or pending, one of them pending, holds one wholly (the fence makes
    /// the run one free block).
    pub(super) fn pending_keep_granules(&self) -> bool {
        if self.pending_bytes() == 0 {
            return false;
        }
        self.ranges.iter().any(|(si, granules)| {
            let holds = |from: Addr, to: Addr| {
                let (first, end) = self.granules_within(*si, from, to - from);
                granules.count_between(first, end) > 0
            };
            // The run so far: its start, and whether a pending block is in it.
            let mut run: Option<(Addr, bool)> = None;
            let mut idx = self.seg(*si).first;
            while idx != NONE {
                let b = &self.blocks[idx as usize];
                if matches!(b.state, State::Free | State::Pending) {
                    let (_, pending) = run.get_or_insert((b.addr, false));
                    *pending |= b.state == State::Pending;
                } else if let Some((from, true)) = run.take() {
                    if holds(from, b.addr) {
                        return true;
                    }
                }
                idx = b.next;
            }
            let s = self.seg(*si);
            matches!(run, Some((from, true)) if holds(from, s.addr + s.size))
        })
    }

    /// (segment, granule) of every mapped granule that lies wholly inside a free block: its
    /// neighbours are not free (free blocks merge), so no other block touches it.
    pub(super) fn free_granules(&self) -> Vec<(u32, u64)> {
        let mut found = Vec::new();
        for (si, granules) in &self.ranges {
            let mut idx = self.seg(*si).first;
            while idx != NONE {
                let b = &self.blocks[idx as usize];
                if b.state == State::Free {
                    let (first, end) = self.granules_within(*si, b.addr, b.size);
                    found.extend(granules.mapped_between(first, end).map(|k| (*si, k)));
                }
                idx = b.next;
            }
        }
        found
    }
}
