//! Serving a request: from the cache, else a new segment, else the out-of-memory ladder.

use super::*;

impl DevicePool {
    /// Serve a request of `requested` bytes. Returns the address and the block's handle.
    pub fn alloc(
        &mut self,
        requested: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Result<Addr, CudaError> {
        self.alloc_on(requested, None, backend, clock, policy)
    }

    /// `alloc` for use on `stream` when there is one: a block freed on that stream that waits
    /// for a barrier or fence serves it first (`stream_reuse`).
    pub fn alloc_on(
        &mut self,
        requested: u64,
        stream: Option<StreamKey>,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Result<Addr, CudaError> {
        self.stream_requests |= stream.is_some();
        let held = match stream {
            Some(key) if self.held_blocks > 0 => {
                self.promote(clock);
                self.serve_held(requested, key, policy)
            }
            _ => None,
        };
        let r = match held {
            Some(served) => Ok(served),
            None => self.serve(requested, backend, clock, policy, true),
        };
        match r {
            Ok((addr, idx)) => {
                let size = self.blocks[idx as usize].size;
                let id = stream.map_or(0, |k| self.stream_id(k));
                self.record(Kind::Alloc, requested, addr, size, id);
            }
            Err(e) => self.record(Kind::AllocFailed, requested, e.0 as u64, 0, 0),
        }
        self.enforce_threshold_after_alloc(backend, clock);
        r.map(|(addr, _)| addr)
    }

    /// Requests larger than this, the largest segment so far, release the idle segments they
    /// outgrew (`release_outgrown`), and the first above `GROW_FROM` gets room to grow
    /// (`size::segment_size`); none while a release threshold is set (its releases would give
    /// the room back, and the rounding would raise the peak) or a `max_split_size` (which would
    /// hand the whole rounded block to the request).
    pub(super) fn grow_above(&self, policy: &Policy) -> u64 {
        if self.threshold == u64::MAX && policy.max_split_size == u64::MAX {
            self.largest_segment
        } else {
            u64::MAX
        }
    }

    /// `alloc` without the trace and the threshold: the block's address and handle, entered in
    /// the live map if `live`.
    #[inline(always)]
    pub(super) fn serve(
        &mut self,
        requested: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
        live: bool,
    ) -> Result<(Addr, u32), CudaError> {
        // A size whose rounding overflows is out of memory, as the runtime answers it, and
        // counted with the others the program gets back.
        let sizes = round_request(requested)
            .and_then(|r| Some((r, segment_size(r, self.grow_above(policy))?)));
        let Some((rounded, seg_size)) = sizes else {
            self.stats.ooms += 1;
            return Err(CudaError::MEMORY_ALLOCATION);
        };
        let class = class_of(rounded);
        self.promote(clock);
        let cached = match Self::bin_of(rounded).and_then(|k| self.bins[k].pop()) {
            Some(idx) => {
                self.binned_bytes -= rounded;
                Some(idx)
            }
            None => match self.find_fit(class, rounded, policy) {
                Some(idx) => self.better_fit(idx, class, rounded, backend, clock, policy)?,
                None => None,
            },
        };
        let (idx, hit) = match cached {
            Some(idx) => {
                counted! { self.stats.hits += 1; }
                (idx, true)
            }
            None => (
                self.refill(class, rounded, seg_size, backend, clock, policy)?,
                false,
            ),
        };
        let idx = match class {
            _ if self.granule == 0 => idx,
            Class::Large => {
                let idx = self.map_or_recover(idx, rounded, hit, backend, clock, policy)?;
                self.place(idx, rounded, policy)
            }
            // Granules go back only wholly inside a free block: a small block narrower than a
            // granule lacks none (those of the bins, and most from the index). Small blocks are
            // packed, never placed on a granule: none fills one.
            Class::Small if self.blocks[idx as usize].size < self.granule => idx,
            Class::Small => self.map_or_recover(idx, rounded, hit, backend, clock, policy)?,
        };
        let addr = self.take(idx, rounded, requested, policy);
        if live {
            self.live.insert(addr, idx);
        }
        Ok((addr, idx))
    }

    /// No cached block fits: the ladder below, cheapest step first. Each step that makes blocks
    /// reusable fits the request again before the next one is tried.
    #[inline(never)]
    pub(super) fn refill(
        &mut self,
        class: Class,
        rounded: u64,
        seg_size: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Result<u32, CudaError> {
        if let Some(idx) = self.fit_from_bins(class, rounded, policy) {
            return Ok(idx);
        }
        // Blocks thread caches hold until a barrier or fence covers them count with the
        // device's own: the same barriers and fences cover them (they become reusable where they
        // are, and come back below).
        let borrowers = if self.lent > 0 {
            self.borrowers.clone()
        } else {
            None
        };
        if let Some(idx) =
            self.fit_from_caches_of_size(borrowers.as_deref(), class, rounded, clock, policy)
        {
            return Ok(idx);
        }
        let (cache_barrier, cache_fence) = borrowers.as_ref().map_or((0, 0), |l| l.waiting(self));
        if let Some(idx) =
            self.fit_after_barrier(cache_barrier, class, rounded, backend, clock, policy)
        {
            return Ok(idx);
        }
        if let Some(idx) = self.fit_after_fence(cache_fence, class, rounded, backend, clock, policy)
        {
            return Ok(idx);
        }
        if let Some(idx) =
            self.fit_from_caches_ready(borrowers.as_deref(), class, rounded, clock, policy)
        {
            return Ok(idx);
        }
        // A segment rounded up for growth that the driver refuses is asked for again at the
        // request's own size before anything cached is given back.
        let exact = segment_size(rounded, u64::MAX).ok_or(CudaError::MEMORY_ALLOCATION)?;
        let outgrown = self.release_outgrown_by(rounded, backend, clock, policy);
        let sizes: &[u64] = if exact < seg_size {
            &[seg_size, exact]
        } else {
            &[seg_size]
        };
        if let Some(grown) = self.grow(class, rounded, sizes, backend, policy) {
            return grown;
        }
        self.recover_from_oom(class, rounded, outgrown, backend, clock, policy)
    }

    /// Step 1: free blocks waiting in the bins, merged back into the index. Bins hold small
    /// blocks only: a large request leaves them to the hits (with expandable segments every
    /// mapping comes through this ladder).
    fn fit_from_bins(&mut self, class: Class, rounded: u64, policy: &Policy) -> Option<u32> {
        if self.binned_bytes == 0 || class == Class::Large {
            return None;
        }
        self.flush_bins();
        let idx = self.find_fit(class, rounded, policy)?;
        self.stats.hits += 1;
        Some(idx)
    }

    /// Step 2: another thread's cache may keep blocks of this very size: some of them serve at
    /// no cost (no synchronization, no growth, the other caches keep the rest).
    fn fit_from_caches_of_size(
        &mut self,
        borrowers: Option<&dyn Borrowers>,
        class: Class,
        rounded: u64,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Option<u32> {
        let l = borrowers.filter(|_| rounded <= THREAD_CACHED_LIMIT)?;
        if !l.reclaim_size(self, clock, rounded) {
            return None;
        }
        self.fit_after_return(class, rounded, policy)
    }

    /// Step 3: a barrier, which costs the host no wait, for the blocks that wait on one (the
    /// device's and, `in_caches` bytes, the thread caches'). A failed barrier or fence (the
    /// runtime's error is not the program's: the backend cleared it) leaves the waiting blocks
    /// waiting; the pool grows instead. A sticky error fails the segment's allocation later
    /// with the runtime's own code. What a barrier or fence makes reusable goes to the bins
    /// first: the fit looks there too.
    fn fit_after_barrier(
        &mut self,
        in_caches: u64,
        class: Class,
        rounded: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Option<u32> {
        if self.pending_barrier_bytes + in_caches == 0 || self.barrier(backend, clock).is_err() {
            return None;
        }
        self.fit_after_return(class, rounded, policy)
    }

    /// Step 4: a fence blocks the host until the device is idle, so it is taken only once the
    /// fence budget waits on it (the device's blocks and `in_caches` bytes of the thread
    /// caches'); until then the pool grows instead.
    fn fit_after_fence(
        &mut self,
        in_caches: u64,
        class: Class,
        rounded: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Option<u32> {
        let waiting = self.pending_fence_bytes + in_caches;
        if waiting == 0 || waiting < policy.fence_bytes || self.fence(backend, clock).is_err() {
            return None;
        }
        self.fit_after_return(class, rounded, policy)
    }

    /// Step 5: before the pool grows, the reusable blocks thread caches hold come back (half of
    /// each), and those still waiting: what one thread keeps must not make the device grow for
    /// another.
    fn fit_from_caches_ready(
        &mut self,
        borrowers: Option<&dyn Borrowers>,
        class: Class,
        rounded: u64,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Option<u32> {
        if !borrowers?.reclaim_ready(self, clock) {
            return None;
        }
        self.fit_after_return(class, rounded, policy)
    }

    /// Step 6, first half: a request larger than every segment so far gives back the idle
    /// segments it outgrew. Only a request above `GROW_FROM` can outgrow a segment that large
    /// (and a scan of every segment on each new small segment would cost the replay half its
    /// speed). Returns the bytes released.
    fn release_outgrown_by(
        &mut self,
        rounded: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> u64 {
        if rounded > GROW_FROM && rounded > self.grow_above(policy) {
            self.release_outgrown(rounded, backend, clock)
        } else {
            0
        }
    }

    /// Step 6: room for `rounded` bytes in a range, whose granules `serve` maps, else a new
    /// segment of the first of `sizes` the driver (and the limit) grants. `None` when each was
    /// refused as out of memory; another error is the request's.
    pub(super) fn grow(
        &mut self,
        class: Class,
        rounded: u64,
        sizes: &[u64],
        backend: &dyn Backend,
        policy: &Policy,
    ) -> Option<Result<u32, CudaError>> {
        if let Some(idx) = self.room_in_range(class, rounded, policy) {
            self.stats.misses += 1;
            return Some(Ok(idx));
        }
        for &size in sizes {
            match self.new_segment(class, size, backend) {
                Ok(idx) => {
                    self.stats.misses += 1;
                    return Some(Ok(idx));
                }
                Err(e) if e != CudaError::MEMORY_ALLOCATION => return Some(Err(e)),
                Err(_) => {}
            }
        }
        None
    }

    /// Step 7, out of memory: take back what thread caches hold, make every cached block safe,
    /// give whole free segments back, and ask again for the request's own segment, then for
    /// the request alone (a segment larger than the request may not fit where it would).
    /// `outgrown`: bytes step 6 released already.
    fn recover_from_oom(
        &mut self,
        class: Class,
        rounded: u64,
        outgrown: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Result<u32, CudaError> {
        let exact = segment_size(rounded, u64::MAX).ok_or(CudaError::MEMORY_ALLOCATION)?;
        self.stats.oom_retries += 1;
        self.limit_refused = false;
        let (fit, fenced, capture) =
            self.fit_after_reclaim_and_fence(class, rounded, backend, clock, policy);
        if let Some(idx) = fit {
            self.stats.oom_recovered += 1;
            return Ok(idx);
        }
        let released = outgrown + self.release_segments(backend, clock, 0, Release::OutOfMemory);
        let sizes: &[u64] = if rounded != exact {
            &[exact, rounded]
        } else {
            &[exact]
        };
        match self.grow(class, rounded, sizes, backend, policy) {
            Some(Ok(idx)) => {
                self.stats.oom_recovered += 1;
                return Ok(idx);
            }
            Some(Err(e)) => return Err(e),
            None => {}
        }
        self.stats.ooms += 1;
        self.sample_memory(backend);
        self.last_oom = Some(OomEvent {
            requested: rounded,
            segment: exact,
            released,
            fenced,
            capture,
            mapping: false,
            segment_asked: false,
            limited: self.limit_refused,
            memory: self.memory,
        });
        Err(CudaError::MEMORY_ALLOCATION)
    }

    /// Out of memory, the steps that cost no memory: take back what thread caches hold, and
    /// fence so that pending blocks become reusable, fitting after each (a block that fits is
    /// mapped already). The fit, and whether the fence was taken and whether a graph capture
    /// refused it.
    pub(super) fn fit_after_reclaim_and_fence(
        &mut self,
        class: Class,
        rounded: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> (Option<u32>, bool, bool) {
        if self.lent > 0 {
            if let Some(l) = self.borrowers.clone() {
                l.reclaim(self, clock);
                if let Some(idx) = self.fit_after_return(class, rounded, policy) {
                    return (Some(idx), false, false);
                }
            }
        }
        let (fenced, capture) = self.fence_at_oom(backend, clock);
        let fit = if fenced {
            self.fit_after_return(class, rounded, policy)
        } else {
            None
        };
        (fit, fenced, capture)
    }

    /// What the driver says of the device's memory now (during normal operation only); `None`,
    /// and the last sample kept for the reports, when it cannot say.
    pub(super) fn sample_memory(&mut self, backend: &dyn Backend) -> Option<MemorySample> {
        let (free, total) = backend.memory_info(self.device).ok()?;
        let sample = MemorySample {
            free,
            total,
            reserved: self.stats.reserved.current,
        };
        self.memory = Some(sample);
        self.memory_first.get_or_insert(sample);
        Some(sample)
    }

    /// Ask the driver for a segment, an expandable one where they are on; returns its single
    /// free block, already indexed.
    pub(super) fn new_segment(
        &mut self,
        class: Class,
        size: u64,
        backend: &dyn Backend,
    ) -> Result<u32, CudaError> {
        if let Some(idx) = self.new_range(class, size, backend) {
            return Ok(idx);
        }
        self.new_classic_segment(class, size, backend)
    }

    /// `new_segment` without a range: a segment of `size` bytes from the driver's `cudaMalloc`.
    pub(super) fn new_classic_segment(
        &mut self,
        class: Class,
        size: u64,
        backend: &dyn Backend,
    ) -> Result<u32, CudaError> {
        if self.stats.reserved.current.saturating_add(size) > self.limit {
            self.limit_refused = true;
            self.stats.limit_refusals += 1;
            return Err(CudaError::MEMORY_ALLOCATION);
        }
        let t = Instant::now();
        let r = backend.alloc_segment(self.device, size);
        self.stats.real_mallocs += 1;
        self.stats.real_malloc_ns += t.elapsed().as_nanos() as u64;
        let addr = match r {
            Ok(addr) => addr,
            Err(e) => {
                self.stats.real_mallocs_refused += 1;
                self.record(Kind::SegmentRefused, size, e.0 as u64, 0, 0);
                return Err(e);
            }
        };
        self.record(Kind::SegmentAlloc, addr, size, 0, 0);
        if class == Class::Large {
            self.largest_segment = self.largest_segment.max(size);
        }
        self.stats.reserved.add(size);
        self.stats.segments.add(1);
        self.sample_memory(backend);
        Ok(self.add_segment(addr, size, class, None))
    }

    /// A segment the backend gave, as one free block, indexed: its handle. An expandable one
    /// comes with its granules.
    pub(super) fn add_segment(
        &mut self,
        addr: Addr,
        size: u64,
        class: Class,
        granules: Option<granules::Granules>,
    ) -> u32 {
        let expandable = granules.is_some();
        if !expandable {
            self.idle_bytes += size;
        }
        let seg = Segment {
            addr,
            size,
            class,
            live: expandable as u32,
            first: NONE,
            expandable,
        };
        let si = match self.vacant_segments.pop() {
            Some(i) => {
                self.segments[i as usize] = Some(seg);
                i
            }
            None => {
                self.segments.push(Some(seg));
                (self.segments.len() - 1) as u32
            }
        };
        let idx = self.new_block(Block {
            addr,
            size,
            requested: 0,
            seg: si,
            prev: NONE,
            next: NONE,
            state: State::Free,
            class,
            stamp: 0,
            wants_fence: false,
            held: false,
            origin: 0,
        });
        self.seg_mut(si).first = idx;
        self.by_addr.insert(addr, si);
        if let Some(g) = granules {
            self.ranges.push((si, g));
        }
        self.index(idx);
        idx
    }
}
