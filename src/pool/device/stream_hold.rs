//! Blocks held for the stream that freed them: `relaxed` mode's stream-ordered reuse.

use super::*;

impl DevicePool {
    /// The trace's number for `stream` (0 when not tracing: no stream is numbered 0). The test
    /// inlined, the numbering apart: every stream-ordered allocation and free asks.
    #[inline(always)]
    pub(super) fn stream_id(&mut self, stream: StreamKey) -> u16 {
        if self.trace.is_none() {
            return 0;
        }
        self.traced_stream_id(stream)
    }

    #[inline(never)]
    fn traced_stream_id(&mut self, stream: StreamKey) -> u16 {
        if let Some(&id) = self.stream_ids.get(&stream) {
            return id;
        }
        // Numbers 1..TRACE_STREAMS - 1 name one stream each; the map stops growing there.
        let id = self.stream_ids.len() as u64 + 1;
        if id >= TRACE_STREAMS as u64 {
            return TRACE_STREAMS;
        }
        self.stream_ids.insert(stream, id as u16);
        id as u16
    }

    /// Whether neighbour `n` joins a block being held for `stream` that waits for a fence
    /// (`fence`) or a barrier (`hold_for_stream` says when): `Some(its size)` when it is free,
    /// `Some(0)` when it is held for the same stream, `None` when it does not join.
    #[inline(always)]
    fn joins_held(&self, n: u32, stream: StreamKey, fence: bool) -> Option<u64> {
        if n == NONE {
            return None;
        }
        let b = &self.blocks[n as usize];
        match b.state {
            // Not in an expandable segment: a free neighbour may not be mapped, and a held
            // block must be, since `serve_held` hands it out as it is.
            State::Free
                if !fence
                    && b.class == Class::Large
                    && (self.granule == 0 || !self.seg(b.seg).expandable) =>
            {
                Some(b.size)
            }
            State::Pending
                if b.held && self.held_by[n as usize] == stream && b.wants_fence == fence =>
            {
                Some(0)
            }
            _ => None,
        }
    }

    /// Hold pending block `idx`, freed on `stream`, for reuse on that stream.
    pub(super) fn hold_for_stream(&mut self, mut idx: u32, stream: StreamKey) {
        let (fence, prev, next) = {
            let b = &self.blocks[idx as usize];
            debug_assert_eq!(b.state, State::Pending);
            (b.wants_fence, b.prev, b.next)
        };
        // A neighbour joins when it is held for the same stream, or free when the block waits
        // for a barrier: free memory next to it becomes the stream's until then (everyone's
        // again after a barrier, which another stream's request takes at no host wait before
        // the pool grows), so that the stream's larger requests find it whole, as in a pool
        // that reuses at once. Not for a fence, which the pool takes only at its budget: other
        // streams would grow the pool instead. Nor in small segments: a stream that frees and
        // allocates small tensors in turn would merge and split the segment's rest on every
        // pair, and small requests rarely need their neighbours (the H200 trace's figures are the
        // same either way).
        let (join_prev, join_next) = (
            self.joins_held(prev, stream, fence),
            self.joins_held(next, stream, fence),
        );
        if join_prev.is_some() || join_next.is_some() {
            idx = self.join_held(idx, (prev, join_prev), (next, join_next));
        }
        self.blocks[idx as usize].held = true;
        if self.held_by.len() <= idx as usize {
            self.held_by.resize(self.blocks.len(), NO_STREAM);
        }
        self.held_by[idx as usize] = stream;
        self.held_blocks += 1;
        let key = self.held_key(idx);
        self.held.insert(stream, key);
        self.compact_queues();
    }

    /// Pending block `idx`, being held, absorbs the neighbours that join it (`prev` and `next`,
    /// each with what `joins_held` said of it), and waits as one block: the merged block's
    /// handle. Apart from `hold_for_stream`, whose common case joins nothing.
    #[inline(never)]
    fn join_held(
        &mut self,
        mut idx: u32,
        (prev, join_prev): (u32, Option<u64>),
        (next, join_next): (u32, Option<u64>),
    ) -> u32 {
        let (stamp, fence) = {
            let b = &self.blocks[idx as usize];
            (b.stamp, b.wants_fence)
        };
        // The merged block waits for the latest free among its parts: a split's remainder
        // (`serve_held`) may sit next to a block freed on its stream after it.
        let later = [(prev, join_prev), (next, join_next)]
            .into_iter()
            .filter(|&(_, j)| j == Some(0))
            .map(|(n, _)| self.blocks[n as usize].stamp)
            .max()
            .unwrap_or(0);
        // One new queue entry for the merged block; the old ones go stale (their stamp or
        // their block no longer matches).
        if let Some(free) = join_prev {
            self.release_neighbour(prev, free);
            self.absorb_next(prev);
            idx = prev;
        }
        if let Some(free) = join_next {
            self.release_neighbour(next, free);
            self.absorb_next(idx);
        }
        let grown = join_prev.unwrap_or(0) + join_next.unwrap_or(0);
        let stamp = stamp.max(later);
        self.set_pending(idx, stamp, fence);
        self.queue_waiting(idx, stamp, fence, grown);
        idx
    }

    /// Neighbour `n` of a block being held leaves its index (`free`: its size, it was free) or
    /// its stream, to be absorbed.
    pub(super) fn release_neighbour(&mut self, n: u32, free: u64) {
        if free > 0 {
            self.unindex(n);
        } else {
            self.leave_stream(n);
        }
    }

    /// Block `idx` is no longer held for its stream (if it was). On every recycle: the check
    /// inlined, the work apart.
    #[inline(always)]
    pub(super) fn leave_stream(&mut self, idx: u32) {
        if self.blocks[idx as usize].held {
            self.unhold(idx);
        }
    }

    /// Where a held block stands in its stream's set: (in a large segment, size, handle).
    pub(super) fn held_key(&self, idx: u32) -> HeldKey {
        let b = &self.blocks[idx as usize];
        (b.class == Class::Large, b.size, idx)
    }

    #[inline(never)]
    pub(super) fn unhold(&mut self, idx: u32) {
        self.unhold_inline(idx);
    }

    /// `unhold`, inlined where a held block is taken (`serve_held`).
    #[inline(always)]
    fn unhold_inline(&mut self, idx: u32) {
        debug_assert!(self.blocks[idx as usize].held);
        self.blocks[idx as usize].held = false;
        self.held_blocks -= 1;
        let key = self.held_key(idx);
        let stream = std::mem::replace(&mut self.held_by[idx as usize], NO_STREAM);
        self.held.remove(stream, key);
    }

    /// Serve `requested` bytes on `stream` from the smallest block held for it that may serve
    /// it (the rules of `find_fit`), if any: live, with its address in the live map. Returns
    /// the address and the block's handle.
    #[inline(always)]
    pub(super) fn serve_held(
        &mut self,
        requested: u64,
        stream: StreamKey,
        policy: &Policy,
    ) -> Option<(Addr, u32)> {
        let rounded = round_request(requested)?;
        let class = class_of(rounded);
        let large = class == Class::Large;
        let (_, size, idx) =
            self.held
                .first_in(stream, (large, rounded, 0), (large, u64::MAX, u32::MAX))?;
        if large && !may_serve(size, rounded, self.split_cap(idx, policy)) {
            return None;
        }
        // The best fit of all: a reusable block that fits better serves instead. None fits
        // better than a held block of the rounded size itself (a fit is never smaller): the
        // index is not searched then.
        let exact = Self::bin_of(rounded).is_some_and(|k| !self.bins[k].is_empty());
        if exact
            || (size != rounded
                && self
                    .find_fit(class, rounded, policy)
                    .is_some_and(|i| self.blocks[i as usize].size < size))
        {
            return None;
        }
        // Held: its stream's set named it.
        self.unhold_inline(idx);
        self.unpend(idx);
        if self.splits(idx, rounded, policy) {
            self.hold_remainder(idx, rounded, stream);
        }
        counted! {
            self.stats.hits += 1;
            self.stats.stream_hits += 1;
        }
        let addr = self.hand_out(idx, requested);
        self.live.insert(addr, idx);
        self.compact_queues();
        Some((addr, idx))
    }

    /// Held block `idx`, being served `rounded` of its bytes on `stream`: the
    /// remainder is split off and held for the stream. Out of line: a stream's requests of the
    /// sizes it freed need no split.
    #[inline(never)]
    fn hold_remainder(&mut self, idx: u32, rounded: u64, stream: StreamKey) {
        let (addr, stamp, fence) = {
            let b = &self.blocks[idx as usize];
            (b.addr, b.stamp, b.wants_fence)
        };
        // The remainder was freed with the block: still pending, still held. Its queue
        // entry goes behind later ones: `promote` stops at the first entry not covered, so
        // an older entry behind newer ones is made reusable late, never early.
        let rest = self.split_off(idx, addr + rounded, State::Live, stamp, fence);
        self.after_free(
            rest,
            if fence {
                ReuseWait::Fence
            } else {
                ReuseWait::Barrier
            },
            stamp,
        );
        self.hold_for_stream(rest, stream);
    }
}
