//! Giving memory back: the release threshold, empty-cache, outgrown segments, out-of-memory
//! and device reset; the threshold and limit settings.

use super::*;

impl DevicePool {
    /// Give free granules of expandable segments back, then whole free segments, largest
    /// first, until the cache holds at most `keep` bytes. Returns the bytes released.
    pub fn release_segments(
        &mut self,
        backend: &dyn Backend,
        clock: &ReuseClock,
        keep: u64,
        why: Release,
    ) -> u64 {
        let granules_due = self.granule != 0
            && (self.unmap_due
                || self.binned_bytes > 0
                || (why != Release::Threshold && self.pending_bytes() > 0));
        if self.cached() <= keep || (self.idle_bytes == 0 && !granules_due) {
            return 0;
        }
        self.flush_bins();
        let unmapped = self.unmap_free_granules(backend, clock, keep, why);
        unmapped + self.release_idle(backend, keep, why, |_| true)
    }

    /// A request of `rounded` bytes, larger than every segment the device has had, is about to
    /// get a segment of its own: the idle segments of at least `OUTGROWN_FROM` it outgrew go back
    /// first. They cannot serve it, and a program whose largest buffer keeps growing (an inference
    /// server's logits as prompts get longer) would otherwise hold every earlier size at once:
    /// reserved memory follows the largest buffer instead of the sum of their sizes. Smaller
    /// segments, which later requests are likelier to reuse, stay. Whole segments only; large
    /// segments are never binned. Returns the bytes released.
    pub(super) fn release_outgrown(
        &mut self,
        rounded: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
    ) -> u64 {
        let outgrown = |s: &Segment| {
            s.class == Class::Large && !s.expandable && s.size >= OUTGROWN_FROM && s.size < rounded
        };
        // Nothing to outgrow: the thread caches are not emptied for nothing.
        if self.largest_segment < OUTGROWN_FROM || !self.segments.iter().flatten().any(outgrown) {
            return 0;
        }
        // Free blocks thread caches hold (medium blocks carved from a large segment's room)
        // would keep a segment busy: they come back first.
        if self.lent > 0 {
            if let Some(l) = self.borrowers.clone() {
                l.reclaim(self, clock);
            }
        }
        self.release_idle(backend, 0, Release::Outgrown, outgrown)
    }

    /// Release idle segments (no live or lent block) that `pick` accepts, largest first, until
    /// the cache holds at most `keep` bytes. Binned blocks must have been merged back.
    pub(super) fn release_idle(
        &mut self,
        backend: &dyn Backend,
        keep: u64,
        why: Release,
        pick: impl Fn(&Segment) -> bool,
    ) -> u64 {
        if self.idle_bytes == 0 {
            return 0;
        }
        let mut idle: Vec<(u64, u32)> = self
            .segments
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                s.as_ref()
                    .filter(|s| s.live == 0 && !s.expandable && pick(s))
                    .map(|s| (s.size, i as u32))
            })
            .collect();
        idle.sort_unstable_by(|a, b| b.cmp(a));
        let mut released = 0;
        for (size, si) in idle {
            if self.cached() <= keep {
                break;
            }
            if self.release_segment(si, backend, why).is_err() {
                break;
            }
            released += size;
            self.count_release(why, size);
        }
        if released > 0 {
            // Drop the queue entries of blocks that went with their segments.
            let blocks = &self.blocks;
            let valid = |&(i, st): &(u32, u64)| {
                let b = &blocks[i as usize];
                b.state == State::Pending && b.stamp == st
            };
            self.pending_fence.retain(valid);
            self.pending_barrier.retain(valid);
        }
        released
    }

    /// `n` granules of expandable segments unmapped for `why`, in the counters: their bytes
    /// among the released bytes, the granules apart from the segments.
    pub(super) fn count_unmapped(&mut self, why: Release, n: u64) {
        let bytes = n * self.granule;
        let s = &mut self.stats;
        match why {
            Release::Threshold => {
                s.threshold_released_granules += n;
                s.threshold_released_bytes += bytes;
            }
            Release::EmptyCache => {
                s.empty_cache_released_granules += n;
                s.empty_cache_released_bytes += bytes;
            }
            Release::OutOfMemory => s.oom_released_bytes += bytes,
            Release::Outgrown => s.outgrown_released_bytes += bytes,
        }
    }

    /// One release of a segment of `bytes` in the counters.
    pub(super) fn count_release(&mut self, why: Release, bytes: u64) {
        let s = &mut self.stats;
        match why {
            Release::Threshold => {
                s.threshold_releases += 1;
                s.threshold_released_bytes += bytes;
            }
            Release::EmptyCache => {
                s.empty_cache_releases += 1;
                s.empty_cache_released_bytes += bytes;
            }
            Release::OutOfMemory => s.oom_released_bytes += bytes,
            Release::Outgrown => {
                s.outgrown_releases += 1;
                s.outgrown_released_bytes += bytes;
            }
        }
    }

    /// The cached bytes the release threshold lets this pool keep now: the threshold, or for
    /// one that bounds the reserved bytes, what it leaves beside the bytes in use (none once
    /// they reach it). CUDA's pool releases until it reserves at most the threshold; a program
    /// that set one there and reads the reserved bytes back expects that.
    #[inline]
    pub fn cache_allowance(&self) -> u64 {
        match self.threshold_bounds_reserved {
            true => self.threshold.saturating_sub(self.stats.allocated.current),
            false => self.threshold,
        }
    }

    /// Release threshold check: the next pool operation or program synchronization calls it.
    #[inline]
    pub fn enforce_threshold(&mut self, backend: &dyn Backend, clock: &ReuseClock) {
        let keep = self.cache_allowance();
        if self.cached() > keep {
            self.release_segments(backend, clock, keep, Release::Threshold);
        }
    }

    /// `enforce_threshold` after an allocation, for `GPUPOOL_RELEASE_THRESHOLD`'s cached bytes. A
    /// threshold the program set on CUDA's pool waits for a synchronization, as CUDA's does: its
    /// allowance shrinks as the bytes in use grow, and enforced here it would give segments back
    /// (a `cudaFree` that waits for the device) inside the program's allocations.
    #[inline]
    pub fn enforce_threshold_after_alloc(&mut self, backend: &dyn Backend, clock: &ReuseClock) {
        if !self.threshold_bounds_reserved {
            self.enforce_threshold(backend, clock);
        }
    }

    /// A synchronization the program made: reuse what it covered, apply the threshold. Above
    /// it, granules that only blocks awaiting a fence keep mapped go too, after a fence: a
    /// classic segment of such blocks goes back here, its `cudaFree` waiting for the device.
    pub fn sync_point(&mut self, backend: &dyn Backend, clock: &ReuseClock) {
        self.promote(clock);
        self.record(Kind::SyncPoint, 0, 0, 0, 0);
        if self.cached() > self.cache_allowance() && self.pending_keep_granules() {
            // A failed fence leaves them pending; the threshold still takes what is free.
            let _ = self.fence(backend, clock);
        }
        self.enforce_threshold(backend, clock);
    }

    /// An explicit request to give every whole free segment back. Returns the bytes released.
    pub fn empty_cache(&mut self, backend: &dyn Backend, clock: &ReuseClock) -> u64 {
        self.trim_to(backend, clock, 0)
    }

    /// Release whole free segments until at most `keep` bytes stay reserved, or none is left
    /// free (`cudaMemPoolTrimTo`'s rule). Returns the bytes released.
    pub fn trim_to(&mut self, backend: &dyn Backend, clock: &ReuseClock, keep: u64) -> u64 {
        self.promote(clock);
        self.record(Kind::EmptyCache, keep, 0, 0, 0);
        let keep_cached = keep.saturating_sub(self.stats.reserved.current - self.cached());
        self.release_segments(backend, clock, keep_cached, Release::EmptyCache)
    }

    /// The whole cache given back because an allocation the pool does not serve (another
    /// allocator's, another context's) ran out of memory: released at out-of-memory, not by
    /// an empty-cache request. Its trace record is an empty cache marked so (`b` 1). Returns
    /// the bytes released.
    pub fn release_for_others(&mut self, backend: &dyn Backend, clock: &ReuseClock) -> u64 {
        self.promote(clock);
        self.record(Kind::EmptyCache, 0, 1, 0, 0);
        self.release_segments(backend, clock, 0, Release::OutOfMemory)
    }

    /// Set the most bytes this pool may reserve (applied to the next segment), in whole blocks.
    pub fn set_limit(&mut self, bytes: u64) {
        self.limit = usable_limit(bytes);
        self.record(Kind::Limit, bytes, 0, 0, 0);
    }

    /// Change the release threshold (applied at the next operation): cached bytes to keep, or
    /// with `bounds_reserved` reserved bytes (`cache_allowance`).
    pub fn set_threshold(&mut self, bytes: u64, bounds_reserved: bool) {
        self.threshold = bytes;
        self.threshold_bounds_reserved = bounds_reserved;
        self.record(Kind::Threshold, bytes, u64::from(bounds_reserved), 0, 0);
    }

    pub(super) fn release_segment(
        &mut self,
        si: u32,
        backend: &dyn Backend,
        why: Release,
    ) -> Result<(), CudaError> {
        let (addr, size, first) = {
            let s = self.seg(si);
            debug_assert_eq!(s.live, 0, "released a segment in use");
            (s.addr, s.size, s.first)
        };
        let t = Instant::now();
        let r = backend.free_segment(self.device, addr);
        self.stats.real_frees += 1;
        self.stats.real_free_ns += t.elapsed().as_nanos() as u64;
        r?;
        self.record(Kind::SegmentFree, addr, size, 0, why as u16);
        let mut idx = first;
        while idx != NONE {
            let next = self.blocks[idx as usize].next;
            match self.blocks[idx as usize].state {
                State::Free => self.unindex(idx),
                State::Pending => {
                    self.leave_stream(idx);
                    let b = &self.blocks[idx as usize];
                    let (fence, size) = (b.wants_fence, b.size);
                    *self.waiting_bytes_mut(fence) -= size;
                }
                State::Live | State::Lent | State::Vacant | State::Binned => {
                    debug_assert!(false, "released a segment in use or binned")
                }
            }
            self.drop_block(idx);
            idx = next;
        }
        self.by_addr.remove(&addr);
        self.segments[si as usize] = None;
        self.vacant_segments.push(si);
        self.idle_bytes -= size;
        self.stats.reserved.sub(size);
        self.stats.segments.sub(1);
        Ok(())
    }

    /// Where each segment lies: address and size.
    pub fn segment_spans(&self) -> Vec<(Addr, u64)> {
        self.segments
            .iter()
            .flatten()
            .map(|s| (s.addr, s.size))
            .collect()
    }

    /// `cudaDeviceReset` freed everything: forget it all (the driver already took it back).
    pub fn forget_all(&mut self) {
        self.record(Kind::Reset, 0, 0, 0, 0);
        // Blocks still lent once the caches are settled are on their way back from a thread's
        // cache: freed by the program (its cache counted that free already) or free blocks a
        // cache gives back. None is the program's any more, so none counts as freed here (a free
        // racing the reset would count twice in the totals). (A cache hands out
        // what it borrows before the device's lock goes: none is on its way there.)
        for b in self.blocks.iter().filter(|b| b.state == State::Lent) {
            let s = &mut self.stats;
            s.allocated.unlend(b.size);
            counted! {
                s.requested.unlend(b.requested);
                s.blocks.unlend(1);
            }
        }
        let s = &mut self.stats;
        s.resets += 1;
        s.requested.sub(s.requested.current);
        s.allocated.sub(s.allocated.current);
        s.blocks.sub(s.blocks.current);
        s.reserved.sub(s.reserved.current);
        s.segments.sub(s.segments.current);
        self.blocks.clear();
        self.vacant_blocks.clear();
        self.live.clear();
        self.bins.iter_mut().for_each(Vec::clear);
        self.bin_mask = [0; BINS / 64];
        self.binned_bytes = 0;
        self.segments.clear();
        self.vacant_segments.clear();
        self.by_addr.clear();
        self.free_small.clear();
        self.free_large.clear();
        self.free_small_wide.clear();
        self.pending_fence.clear();
        self.pending_barrier.clear();
        self.pending_fence_bytes = 0;
        self.pending_barrier_bytes = 0;
        self.held.clear();
        self.held_by.clear();
        self.held_blocks = 0;
        self.largest_segment = 0;
        self.idle_bytes = 0;
        self.ranges.clear();
        self.unmap_due = false;
        self.lent = 0;
        // The reset destroyed the context too: the next sample is the new baseline of what is
        // in use outside the pool.
        self.memory_first = None;
        self.generation += 1;
        self.take_back_kept_ranges();
    }
}
