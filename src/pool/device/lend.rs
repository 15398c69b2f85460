//! Lending blocks to the device's thread caches (`tcache/`) and taking them back.

use super::*;

impl DevicePool {
    /// Serve `requested` bytes like `alloc` but lend the block to a thread cache, and lend up to
    /// `extra` more reusable blocks of the same size from its bin into `extras`. Returns the
    /// block's address, handle and size (a large block may be larger than the request's
    /// rounding). Never called while tracing.
    #[cfg_attr(not(feature = "stats"), allow(unused_variables))]
    pub fn alloc_lent(
        &mut self,
        requested: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
        extra: usize,
        extras: &mut Extras,
    ) -> Result<(Addr, u32, u64), CudaError> {
        // A trace whose file took no more records is dropped at its next record.
        debug_assert!(
            self.trace.as_ref().is_none_or(|t| !t.on()),
            "thread caches are off while tracing"
        );
        let r = self.serve(requested, backend, clock, policy, false);
        self.enforce_threshold_after_alloc(backend, clock);
        let (_, idx) = r?;
        let b = &mut self.blocks[idx as usize];
        let (addr, size, req) = (b.addr, b.size, b.requested);
        b.state = State::Lent;
        b.requested = size;
        self.lent += 1;
        self.stats.thread_cache_borrowed += 1;
        counted! { self.stats.requested.lend(size - req); }
        if let Some(k) = Self::bin_of(size) {
            for _ in 0..extra.min(EXTRAS) {
                let Some(i) = self.bins[k].pop() else { break };
                self.binned_bytes -= size;
                let b = &mut self.blocks[i as usize];
                b.state = State::Lent;
                b.requested = size;
                let (a, seg) = (b.addr, b.seg);
                self.seg_busy(seg);
                self.lent += 1;
                let s = &mut self.stats;
                s.thread_cache_borrowed += 1;
                s.allocated.lend(size);
                counted! {
                    s.requested.lend(size);
                    s.blocks.lend(1);
                }
                extras.push((a, i));
            }
        }
        Ok((addr, idx, size))
    }

    /// A thread cache gives lent block `idx` back, free: reusable once `need` is met. `stamp`
    /// gives the free sequence number (taken now, later than the program's free, which only
    /// makes the wait longer).
    pub fn take_back(&mut self, idx: u32, need: ReuseWait, stamp: impl FnOnce() -> u64) {
        let b = &mut self.blocks[idx as usize];
        debug_assert_eq!(b.state, State::Lent);
        let (size, seg) = (b.size, b.seg);
        b.requested = 0;
        self.lent -= 1;
        self.seg_quiet(seg);
        let s = &mut self.stats;
        s.thread_cache_returned += 1;
        s.allocated.unlend(size);
        counted! {
            s.requested.unlend(size);
            s.blocks.unlend(1);
        }
        // With expandable segments every free takes a number, also one reusable at once: an
        // unmap must know whether a fence came after it (`expandable.rs`).
        let stamp = if need == ReuseWait::Nothing && self.granule == 0 {
            0
        } else {
            stamp()
        };
        self.after_free(idx, need, stamp);
    }

    /// A lent block the program still holds comes back as an ordinary live block (its thread
    /// cache's thread exited), allocated by `origin`: the cache recorded who it handed the
    /// block to, the device did not.
    #[cfg_attr(not(feature = "stats"), allow(unused_variables))]
    pub fn adopt(&mut self, idx: u32, requested: u64, origin: Origin) {
        let b = &mut self.blocks[idx as usize];
        debug_assert_eq!(b.state, State::Lent);
        let (addr, size) = (b.addr, b.size);
        b.state = State::Live;
        b.requested = requested;
        b.origin = origin;
        self.lent -= 1;
        counted! { self.stats.requested.unlend(size - requested); }
        self.live.insert(addr, idx);
    }

    /// Lent block `idx`, as the live block the program holds with `requested` bytes, allocated
    /// by `origin`.
    pub fn lent_block(&self, idx: u32, requested: u64, origin: Origin) -> Option<LiveBlock> {
        let b = self.blocks.get(idx as usize)?;
        (b.state == State::Lent).then(|| LiveBlock {
            addr: b.addr,
            size: b.size,
            requested,
            segment_addr: self.seg(b.seg).addr,
            origin,
        })
    }

    /// Whether `idx` is a block lent at `addr` (for the thread caches' own checks).
    pub fn is_lent(&self, idx: u32, addr: Addr) -> bool {
        self.blocks
            .get(idx as usize)
            .is_some_and(|b| b.state == State::Lent && b.addr == addr)
    }

    /// Blocks lent to thread caches.
    pub fn lent_count(&self) -> u64 {
        self.lent
    }
}
