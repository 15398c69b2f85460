//! Fitting a request: the exact-size bins of small blocks, the best-fit index of free blocks,
//! and the largest classic free block of the small pool.

use super::*;

impl DevicePool {
    /// The largest free block of the small index and the bins outside the ranges, whose free
    /// blocks may lack granules given back (`largest_served` tries the mapped bytes they start
    /// with): a walk over the small index.
    pub(super) fn largest_free_small_classic(&self) -> u64 {
        let classic = self
            .free_small
            .fits(ALIGN)
            .filter(|&(_, idx)| !self.in_range(idx))
            .map(|(size, _)| size)
            .max();
        self.largest_free_small_of(classic.unwrap_or(0))
    }

    /// The larger of `small` and the largest binned block (handed out before, so mapped), as
    /// the largest request they serve (`served_by`).
    fn largest_free_small_of(&self, small: u64) -> u64 {
        let binned = self
            .bins
            .iter()
            .rposition(|b| !b.is_empty())
            .map_or(0, |k| (k as u64 + 1) * ALIGN);
        served_by(Class::Small, small.max(binned))
    }

    /// The bin of blocks of exactly `rounded` bytes, for small sizes.
    pub(super) fn bin_of(rounded: u64) -> Option<usize> {
        (rounded <= SMALL_LIMIT).then(|| (rounded / ALIGN) as usize - 1)
    }

    /// A reusable block: into its exact-size bin while there is room, else merged and indexed.
    #[inline(always)]
    pub(super) fn recycle(&mut self, idx: u32) {
        let b = &self.blocks[idx as usize];
        let (size, small, held) = (b.size, b.class == Class::Small, b.held);
        if held {
            self.unhold(idx);
        }
        let room = BIN_BYTES.max(self.stats.reserved.current / 8);
        if small && size <= SMALL_LIMIT && self.binned_bytes + size <= room {
            let k = (size / ALIGN) as usize - 1;
            self.blocks[idx as usize].state = State::Binned;
            self.bins[k].push(idx);
            self.bin_mask[k / 64] |= 1 << (k % 64);
            self.binned_bytes += size;
        } else {
            self.make_free(idx);
        }
    }

    /// Merge every binned block back into the best-fit index.
    pub(super) fn flush_bins(&mut self) {
        if self.binned_bytes == 0 {
            return;
        }
        for w in 0..self.bin_mask.len() {
            let mut bits = std::mem::take(&mut self.bin_mask[w]);
            while bits != 0 {
                let k = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                while let Some(idx) = self.bins[k].pop() {
                    self.make_free(idx);
                }
            }
        }
        debug_assert!(self.bins.iter().all(Vec::is_empty));
        self.binned_bytes = 0;
    }

    /// The best reusable block for a large request is `idx`, but splitting it would carve a
    /// block more than twice the request's size while at least the request's size waits for a
    /// barrier or a fence: blocks freed moments ago are usually the right size (a gradient after
    /// its activation), and shredding big blocks instead is what makes a cache grow. Make the
    /// waiting blocks reusable first (a barrier costs no host wait; a fence is taken only here
    /// and in `refill`) and fit again. `None` when no cached block fits then: `idx` may have
    /// merged with a neighbour the barrier freed into a block that would map granules.
    pub(super) fn better_fit(
        &mut self,
        idx: u32,
        class: Class,
        rounded: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Result<Option<u32>, CudaError> {
        // Saturating: a replayed trace may ask for more than half of `u64::MAX`.
        if class == Class::Small || self.blocks[idx as usize].size <= rounded.saturating_mul(2) {
            return Ok(Some(idx));
        }
        // A failed barrier or fence leaves the waiting blocks waiting; `idx` still fits.
        let made_reusable = if self.pending_barrier_bytes >= rounded {
            self.barrier(backend, clock).is_ok()
        } else if self.pending_fence_bytes >= rounded.max(policy.fence_bytes) {
            self.fence(backend, clock).is_ok()
        } else {
            false
        };
        if !made_reusable {
            return Ok(Some(idx));
        }
        Ok(self.find_fit(class, rounded, policy))
    }

    /// A block for `rounded` bytes among those just made reusable (given back by thread caches,
    /// or by a barrier or fence, which put small ones in their bins): from its bin, or with the
    /// bins merged into the index.
    pub(super) fn fit_after_return(
        &mut self,
        class: Class,
        rounded: u64,
        policy: &Policy,
    ) -> Option<u32> {
        let binned = Self::bin_of(rounded).and_then(|k| self.bins[k].pop());
        let idx = match binned {
            Some(idx) => {
                self.binned_bytes -= rounded;
                idx
            }
            None => {
                self.flush_bins();
                self.find_fit(class, rounded, policy)?
            }
        };
        self.stats.hits += 1;
        Some(idx)
    }

    /// The best fit for `rounded` bytes among the cached blocks of its pool. `max_split_size`
    /// concerns large blocks only: small ones always split (`should_split`), and a small
    /// segment's remainder must serve small requests whatever the setting: with 4 MiB small
    /// segments and a 2–4 MiB setting, every small request would take a segment of its own.
    /// A best fit in a range that would map granules is no cached block: mapping is growth,
    /// which the ladder's cheaper steps come before (`refill`; `room_in_range`).
    pub(super) fn find_fit(&self, class: Class, rounded: u64, policy: &Policy) -> Option<u32> {
        match class {
            Class::Small if self.granule == 0 => {
                self.free_small.best_fit(rounded).map(|(_, idx)| idx)
            }
            Class::Small => self.best_fit_small_mapped(rounded, policy),
            Class::Large => self
                .best_fit_large(rounded, policy)
                .filter(|&idx| !self.needs_mapping(idx, rounded, policy)),
        }
    }

    /// The best fit for a small request where a small range may hold free blocks: the smallest
    /// hole up to a small segment's size that needs no mapping, or the block wider than that (a
    /// range's frontier, holes merged past a segment's size) whose mapped start is smaller and
    /// holds the request, as PyTorch counts its tail block by what is mapped.
    fn best_fit_small_mapped(&self, rounded: u64, policy: &Policy) -> Option<u32> {
        // Granules go back only wholly inside a free block, so one smaller than a granule lacks
        // none: the common case answers without looking at the granules.
        if let Some((size, idx)) = self.free_small.best_fit(rounded) {
            if size < self.granule {
                debug_assert!(!self.needs_mapping(idx, rounded, policy), "{size}");
                return Some(idx);
            }
        }
        // The best fit lacks a granule given back: the next larger holes may not.
        let hole = self
            .free_small
            .fits(rounded)
            .find(|&(_, idx)| !self.needs_mapping(idx, rounded, policy));
        let wide = self
            .free_small_wide
            .values()
            .map(|&idx| (self.mapped_from_start(idx), idx))
            .filter(|&(mapped, _)| mapped >= rounded)
            .min();
        match (hole, wide) {
            (Some(h), Some(w)) => Some(if w.0 < h.0 { w.1 } else { h.1 }),
            (h, w) => h.or(w).map(|(_, idx)| idx),
        }
    }

    /// The mapped bytes free block `idx` of a range starts with.
    pub(super) fn mapped_from_start(&self, idx: u32) -> u64 {
        let b = &self.blocks[idx as usize];
        let Some(granules) = self.range_granules(b.seg) else {
            return b.size;
        };
        self.mapped_pieces(b.seg, granules, b)
            .next()
            .filter(|&(lo, _)| lo == b.addr)
            .map_or(0, |(lo, hi)| hi - lo)
    }

    /// The best fit for a large request, mapped or not.
    fn best_fit_large(&self, rounded: u64, policy: &Policy) -> Option<u32> {
        let mut fits = self
            .free_large
            .range((rounded, 0)..)
            .map(|(k, &idx)| (k.0, idx));
        let (size, idx) = fits.next()?;
        if may_serve(size, rounded, self.split_cap(idx, policy)) {
            return Some(idx);
        }
        // Larger classic blocks the cap keeps whole waste more still; a range's block serves
        // past them (both kinds coexist only where a reservation was refused).
        if self.ranges.is_empty() {
            return None;
        }
        fits.map(|(_, idx)| idx).find(|&idx| self.in_range(idx))
    }

    /// Room for `rounded` bytes in a range: the best fit, with the granules it lacks, which
    /// `serve` maps (`map_or_recover`). The ladder's first way to grow.
    pub(super) fn room_in_range(&self, class: Class, rounded: u64, policy: &Policy) -> Option<u32> {
        if self.ranges.is_empty() {
            return None;
        }
        match class {
            // Any free block of a small range serves a small request: the best fit by size,
            // else the smallest wide one (only a range has them; its frontier is the widest).
            Class::Small => self
                .free_small
                .best_fit(rounded)
                .map(|(_, idx)| idx)
                .filter(|&idx| self.in_range(idx))
                .or_else(|| self.free_small_wide.values().next().copied()),
            Class::Large => self.best_fit_large(rounded, policy),
        }
    }

    /// Whether serving `rounded` bytes from free block `idx` maps granules: a range's address
    /// space never used, or granules given back.
    fn needs_mapping(&self, idx: u32, rounded: u64, policy: &Policy) -> bool {
        if !self.in_range(idx) {
            return false;
        }
        let (si, first, end) = self.granules_to_serve(idx, rounded, policy);
        self.range_granules(si)
            .is_some_and(|g| g.count_between(first, end) < end - first)
    }

    /// The bytes block `idx` hands out for `rounded`: all of it unless `take` splits it.
    pub(super) fn served_bytes(&self, idx: u32, rounded: u64, policy: &Policy) -> u64 {
        if self.splits(idx, rounded, policy) {
            rounded
        } else {
            self.blocks[idx as usize].size
        }
    }

    /// The split cap of block `idx` (`size::may_serve`, `size::should_split`).
    /// `max_split_size` keeps big cached blocks of classic segments whole: a split segment goes
    /// back to the driver only once all its pieces are free, and shredded big blocks make the
    /// pool grow for the next big request. A range's blocks have no cap: its unused address
    /// space costs nothing, a free block's whole granules are unmapped whatever its neighbours,
    /// and its last free block, larger than any cap, must serve every request.
    pub(super) fn split_cap(&self, idx: u32, policy: &Policy) -> u64 {
        // Small blocks have none (`size::should_split`): their class answers before their
        // segment is read.
        if self.blocks[idx as usize].class == Class::Small || self.in_range(idx) {
            u64::MAX
        } else {
            policy.max_split_size
        }
    }

    /// Whether serving `rounded` bytes from block `idx` splits off the remainder: what `take`
    /// hands out, and so what a range maps for it.
    pub(super) fn splits(&self, idx: u32, rounded: u64, policy: &Policy) -> bool {
        let b = &self.blocks[idx as usize];
        should_split(b.class, b.size, rounded, self.split_cap(idx, policy))
    }

    /// Whether block `idx` lies in an expandable segment.
    pub(super) fn in_range(&self, idx: u32) -> bool {
        self.seg(self.blocks[idx as usize].seg).expandable
    }

    pub(super) fn index(&mut self, idx: u32) {
        let b = &self.blocks[idx as usize];
        let (size, addr) = (b.size, b.addr);
        match b.class {
            Class::Small if size <= SMALL_SEGMENT => self.free_small.insert(idx, size),
            Class::Small => {
                self.free_small_wide.insert((size, addr), idx);
            }
            Class::Large => {
                self.free_large.insert((size, addr), idx);
            }
        }
    }

    /// Whether free block `idx` is in the index `index` puts it in (the structural check).
    pub(super) fn indexed(&self, idx: u32) -> bool {
        let b = &self.blocks[idx as usize];
        match b.class {
            Class::Small if b.size <= SMALL_SEGMENT => self.free_small.contains(idx, b.size),
            Class::Small => self.free_small_wide.get(&(b.size, b.addr)) == Some(&idx),
            Class::Large => self.free_large.get(&(b.size, b.addr)) == Some(&idx),
        }
    }

    pub(super) fn unindex(&mut self, idx: u32) {
        let b = &self.blocks[idx as usize];
        let (size, addr) = (b.size, b.addr);
        let removed = match b.class {
            Class::Small if size <= SMALL_SEGMENT => self.free_small.remove(idx, size),
            Class::Small => self.free_small_wide.remove(&(size, addr)) == Some(idx),
            Class::Large => self.free_large.remove(&(size, addr)) == Some(idx),
        };
        debug_assert!(removed, "free block {addr:#x} not indexed");
    }
}
