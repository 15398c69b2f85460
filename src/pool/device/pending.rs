//! Reuse safety: freed blocks wait for the fence or barrier their mode needs, and the pool's
//! and the program's fences, barriers and synchronizations make them reusable.

use super::*;

impl DevicePool {
    /// The program freed `addr` (`how` it did, and what its reuse must wait for). Returns false
    /// when it is not a live block of this device. `stamp` gives the device's free sequence
    /// number, taken only for a live block.
    #[inline(always)]
    pub fn free(
        &mut self,
        addr: Addr,
        how: FreeKind,
        need: ReuseWait,
        stamp: impl FnOnce() -> u64,
    ) -> bool {
        let Some(idx) = self.live.remove(addr) else {
            return false;
        };
        let size = self.blocks[idx as usize].size;
        let stream = match how {
            FreeKind::Async { stream, .. } | FreeKind::Ordered { stream }
                if stream != NO_STREAM =>
            {
                Some(stream)
            }
            _ => None,
        };
        let id = stream.map_or(0, |k| self.stream_id(k));
        self.record(Kind::Free, addr, need as u64, size, how.code() | id << 2);
        self.free_block(idx, need, stamp());
        let ordered = matches!(how, FreeKind::Ordered { .. });
        let holds =
            (self.stream_reuse || ordered) && self.stream_requests && need != ReuseWait::Nothing;
        if let (Some(key), true) = (stream, holds) {
            self.hold_for_stream(idx, key);
        }
        true
    }

    /// Stream-ordered reuse leaves stale queue entries behind (a held block taken, merged or
    /// split), which only a barrier or fence would clear, and a stream served by the blocks it
    /// freed may never need one: once the queues have doubled since they were last compacted,
    /// keep only the entries of blocks still waiting (in order). The test inlined, the work
    /// apart: each stream-ordered allocation and free asks.
    #[inline(always)]
    pub(super) fn compact_queues(&mut self) {
        if self.pending_fence.len() + self.pending_barrier.len() >= self.compact_at {
            self.drop_stale_entries();
        }
    }

    #[inline(never)]
    fn drop_stale_entries(&mut self) {
        let blocks = &self.blocks;
        let waits = |fence: bool| {
            move |&(i, stamp): &(u32, u64)| {
                let b = &blocks[i as usize];
                b.state == State::Pending && b.stamp == stamp && b.wants_fence == fence
            }
        };
        self.pending_fence.retain(waits(true));
        self.pending_barrier.retain(waits(false));
        let left = self.pending_fence.len() + self.pending_barrier.len();
        self.compact_at = (2 * left).max(COMPACT_FROM);
    }

    /// Entries in the fence and barrier queues (tests).
    #[cfg(test)]
    pub fn queue_lens(&self) -> (usize, usize) {
        (self.pending_fence.len(), self.pending_barrier.len())
    }

    /// Pending block `idx` stops waiting (its queue entry goes stale).
    pub(super) fn unpend(&mut self, idx: u32) {
        let b = &mut self.blocks[idx as usize];
        debug_assert_eq!(b.state, State::Pending);
        b.state = State::Live;
        let (fence, size) = (b.wants_fence, b.size);
        *self.waiting_bytes_mut(fence) -= size;
    }

    #[cfg_attr(not(feature = "stats"), allow(unused_variables))]
    #[inline(always)]
    pub(super) fn free_block(&mut self, idx: u32, need: ReuseWait, stamp: u64) {
        let b = &mut self.blocks[idx as usize];
        debug_assert_eq!(b.state, State::Live);
        // `requested` stays: only live and lent blocks' is read, and every way to those sets it.
        let (size, requested, seg) = (b.size, b.requested, b.seg);
        self.seg_quiet(seg);
        let s = &mut self.stats;
        s.allocated.sub(size);
        counted! {
            s.frees += 1;
            s.requested.sub(requested);
            s.blocks.sub(1);
        }
        self.after_free(idx, need, stamp);
    }

    /// A block the program no longer uses: reusable now, or once `need` is met.
    #[inline(always)]
    pub(super) fn after_free(&mut self, idx: u32, need: ReuseWait, stamp: u64) {
        let size = self.blocks[idx as usize].size;
        match need {
            ReuseWait::Nothing => self.recycle(idx),
            ReuseWait::Barrier | ReuseWait::Fence => {
                let fence = need == ReuseWait::Fence;
                self.set_pending(idx, stamp, fence);
                self.queue_waiting(idx, stamp, fence, size);
            }
        }
    }

    /// Pending block `idx` (stamped `stamp`) waits in the queue of a fence or of a barrier;
    /// `bytes` more wait there.
    #[inline(always)]
    pub(super) fn queue_waiting(&mut self, idx: u32, stamp: u64, fence: bool, bytes: u64) {
        *self.waiting_bytes_mut(fence) += bytes;
        if fence {
            self.pending_fence.push_back((idx, stamp));
        } else {
            self.pending_barrier.push_back((idx, stamp));
        }
    }

    /// The bytes waiting for a fence, or for a barrier.
    #[inline(always)]
    pub(super) fn waiting_bytes_mut(&mut self, fence: bool) -> &mut u64 {
        if fence {
            &mut self.pending_fence_bytes
        } else {
            &mut self.pending_barrier_bytes
        }
    }

    #[inline(always)]
    pub(super) fn set_pending(&mut self, idx: u32, stamp: u64, wants_fence: bool) {
        let b = &mut self.blocks[idx as usize];
        b.state = State::Pending;
        b.stamp = stamp;
        b.wants_fence = wants_fence;
    }

    /// Make pending blocks reusable that a fence or barrier (ours or the program's) has covered.
    /// Every operation calls it: the check that nothing moved is inlined, the work apart.
    #[inline(always)]
    pub fn promote(&mut self, clock: &ReuseClock) {
        let fenced = clock.fenced.load(Ordering::Acquire);
        let barriered = clock.barriered.load(Ordering::Acquire);
        if self.promote_due(fenced, barriered) {
            self.promote_to(fenced, barriered.max(fenced));
        }
    }

    /// Whether `promote_to(fenced, barriered.max(fenced))` would change anything, for the
    /// sequences `fenced` and `barriered` as read from the clock.
    ///
    /// A fence is a barrier too, so the barrier's sequence that counts is
    /// `barriered.max(fenced)`. Its test against `barriered_seen` needs no maximum: always
    /// `barriered_seen >= fenced_seen` (each place that moves them keeps it), so a `fenced`
    /// above `barriered_seen` is above `fenced_seen`, which the first test catches.
    #[inline(always)]
    pub(super) fn promote_due(&self, fenced: u64, barriered: u64) -> bool {
        debug_assert!(self.barriered_seen >= self.fenced_seen);
        fenced > self.fenced_seen
            || barriered > self.barriered_seen
            || self.pending_fence.front().is_some_and(|&(_, s)| s < fenced)
            || self
                .pending_barrier
                .front()
                .is_some_and(|&(_, s)| s < barriered.max(fenced))
    }

    /// `promote` once the sequences were read: `fenced`, and `barriered` (at least `fenced`).
    #[inline(never)]
    fn promote_to(&mut self, fenced: u64, barriered: u64) {
        if fenced > self.fenced_seen || barriered > self.barriered_seen {
            // The program synchronized since the last operation (the pool's own fences and
            // barriers update the seen values themselves).
            if fenced > self.fenced_seen
                && self.pending_fence.front().is_some_and(|&(_, s)| s < fenced)
            {
                self.stats.observed_fences += 1;
            }
            self.fenced_seen = fenced;
            self.barriered_seen = barriered;
            self.record(Kind::Observe, fenced, barriered, 0, 0);
        }
        self.promote_queue(true, fenced);
        self.promote_queue(false, barriered);
    }

    /// Recycle the blocks of the fence's (or the barrier's) queue stamped below `upto`, in
    /// order, up to the first entry not covered. A fence makes its whole budget reusable here,
    /// block by block: the common case, a small block that goes to its bin, is one tight loop
    /// over the ring with the sums kept in registers; any other block stops it and goes
    /// through `recycle`.
    #[inline(always)]
    fn promote_queue(&mut self, fence: bool, upto: u64) {
        // `recycle`'s room in the bins: the reserved bytes do not change while blocks recycle.
        let room = BIN_BYTES.max(self.stats.reserved.current / 8);
        loop {
            let queue = if fence {
                &mut self.pending_fence
            } else {
                &mut self.pending_barrier
            };
            let (blocks, bins, bin_mask) =
                (&mut self.blocks[..], &mut self.bins, &mut self.bin_mask);
            let before = self.binned_bytes;
            let mut binned = before;
            let mut other = None;
            queue.pop_while(|(idx, stamp)| {
                if stamp >= upto {
                    return false;
                }
                let b = &mut blocks[idx as usize];
                if b.state != State::Pending || b.stamp != stamp {
                    // A stale entry: the block left the queue another way.
                    return true;
                }
                let size = b.size;
                // `size - 1 >= SMALL_LIMIT` for `size > SMALL_LIMIT` (no block is empty): the bin's
                // index below is then seen to be in bounds.
                if b.held
                    || b.class != Class::Small
                    || size.wrapping_sub(1) >= SMALL_LIMIT
                    || binned + size > room
                {
                    other = Some(idx);
                    return false;
                }
                b.state = State::Binned;
                let k = ((size - 1) / ALIGN) as usize;
                let bin = &mut bins[k];
                // A bin that holds blocks has its bit set already.
                if bin.is_empty() {
                    bin_mask[k / 64] |= 1 << (k % 64);
                }
                bin.push(idx);
                binned += size;
                true
            });
            self.binned_bytes = binned;
            *self.waiting_bytes_mut(fence) -= binned - before;
            let Some(idx) = other else {
                break;
            };
            if fence {
                self.pending_fence.pop_front();
            } else {
                self.pending_barrier.pop_front();
            }
            *self.waiting_bytes_mut(fence) -= self.blocks[idx as usize].size;
            self.recycle(idx);
        }
    }

    /// The program first made work no barrier orders (a non-blocking stream, a context of its
    /// own), in a mode that uses barriers, and frees no fence covered yet may hold blocks that
    /// work would not wait for
    /// (`Pool::note_work_beyond_barriers`): those waiting for a barrier wait for a fence, and one
    /// is taken for those a barrier made reusable already. A failed fence leaves the blocks
    /// pending; those reusable already stay so (docs/guarantees.md, limits).
    pub fn fence_for_work_beyond_barriers(&mut self, backend: &dyn Backend, clock: &ReuseClock) {
        self.barrier_waits_become_fences();
        let _ = self.fence(backend, clock);
    }

    /// The program created a non-blocking stream, whose work no barrier orders: every block
    /// waiting for a barrier waits for a fence instead. Appended behind the fence's queue with
    /// their stamps: `promote` stops at the first entry not covered, so an older entry behind
    /// newer ones becomes reusable late, never early.
    fn barrier_waits_become_fences(&mut self) {
        while let Some((idx, stamp)) = self.pending_barrier.pop_front() {
            let b = &mut self.blocks[idx as usize];
            if b.state != State::Pending || b.stamp != stamp || b.wants_fence {
                // A stale entry: the block left the queue another way.
                continue;
            }
            b.wants_fence = true;
            let size = b.size;
            self.pending_barrier_bytes -= size;
            self.pending_fence_bytes += size;
            self.pending_fence.push_back((idx, stamp));
        }
    }

    /// Out of memory, the fence that makes pending blocks reusable, if any wait: whether it was
    /// taken, and whether a graph capture refused it.
    pub(super) fn fence_at_oom(
        &mut self,
        backend: &dyn Backend,
        clock: &ReuseClock,
    ) -> (bool, bool) {
        if self.pending_bytes() == 0 {
            return (false, false);
        }
        match self.fence(backend, clock) {
            Ok(()) => (true, false),
            Err(e) => (false, e == CudaError::STREAM_CAPTURE_UNSUPPORTED),
        }
    }

    /// Wait for the whole device, then make every pending block reusable.
    pub fn fence(&mut self, backend: &dyn Backend, clock: &ReuseClock) -> Result<(), CudaError> {
        let at = clock.before_sync();
        let covered = at.freed;
        let t = Instant::now();
        backend.fence(self.device)?;
        let ns = t.elapsed().as_nanos() as u64;
        self.stats.fences += 1;
        self.stats.fence_ns += ns;
        self.record(Kind::Fence, ns, 0, 0, 0);
        let fenced = clock.fenced_at(at);
        if fenced == covered {
            self.fenced_seen = self.fenced_seen.max(covered);
            self.barriered_seen = self.barriered_seen.max(covered);
        }
        self.promote(clock);
        Ok(())
    }

    pub(super) fn barrier(
        &mut self,
        backend: &dyn Backend,
        clock: &ReuseClock,
    ) -> Result<(), CudaError> {
        let at = clock.before_sync();
        let covered = at.freed;
        backend.barrier(self.device)?;
        self.stats.barriers += 1;
        self.record(Kind::Barrier, 0, 0, 0, 0);
        let barriered = clock.barriered_at(at);
        if barriered == covered {
            self.barriered_seen = self.barriered_seen.max(covered);
        }
        self.promote(clock);
        Ok(())
    }
}
