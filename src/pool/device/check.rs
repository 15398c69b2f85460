//! The structural check of a device pool, for tests and `Pool::check`.

use super::*;

impl DevicePool {
    /// Check every structural invariant; tests call it after each step.
    pub fn check(&self) -> Result<(), String> {
        let mut reserved = 0;
        let mut allocated = 0;
        let mut requested = 0;
        let mut pending = 0;
        let mut free_count = 0;
        let mut binned = 0;
        let mut lent = 0;
        let mut idle = 0;
        let mut held = 0;
        for (si, s) in self.segments.iter().enumerate() {
            let Some(s) = s else { continue };
            reserved += match self.range_granules(si as u32) {
                Some(g) if s.expandable => g.mapped,
                _ => s.size,
            };
            self.check_granules(si as u32)?;
            let mut at = s.addr;
            let mut idx = s.first;
            let mut prev = NONE;
            let mut live = 0;
            let mut prev_free = false;
            while idx != NONE {
                let b = &self.blocks[idx as usize];
                if b.addr != at || b.seg as usize != si || b.prev != prev || b.class != s.class {
                    return Err(format!("segment {si}: block chain broken at {:#x}", b.addr));
                }
                if !b.addr.is_multiple_of(512) || b.size == 0 || !b.size.is_multiple_of(512) {
                    return Err(format!("block {:#x}+{} misaligned", b.addr, b.size));
                }
                match b.state {
                    State::Live => {
                        live += 1;
                        allocated += b.size;
                        requested += b.requested;
                    }
                    State::Free => {
                        free_count += 1;
                        if prev_free {
                            return Err(format!("adjacent free blocks at {:#x}", b.addr));
                        }
                        if !self.indexed(idx) {
                            return Err(format!("free block {:#x} not indexed", b.addr));
                        }
                    }
                    State::Lent => {
                        live += 1;
                        lent += 1;
                        allocated += b.size;
                        requested += b.size;
                    }
                    State::Pending => {
                        pending += b.size;
                        if b.held {
                            held += 1;
                            let key = self.held_key(idx);
                            let indexed = self
                                .held_by
                                .get(idx as usize)
                                .is_some_and(|&s| self.held.contains(s, key));
                            if !indexed {
                                return Err(format!("held block {:#x} not indexed", b.addr));
                            }
                        }
                    }
                    State::Binned => binned += b.size,
                    State::Vacant => return Err("vacant block in a segment".into()),
                }
                prev_free = b.state == State::Free;
                at += b.size;
                prev = idx;
                idx = b.next;
            }
            if at != s.addr + s.size {
                return Err(format!(
                    "segment {si}: blocks cover {} of {}",
                    at - s.addr,
                    s.size
                ));
            }
            // An expandable segment's pin (`Segment::expandable`).
            let live = live + s.expandable as u32;
            if live != s.live {
                return Err(format!("segment {si}: live count {} != {live}", s.live));
            }
            if live == 0 {
                idle += s.size;
            }
        }
        if idle != self.idle_bytes {
            return Err(format!("idle segments {idle} != {}", self.idle_bytes));
        }
        let st = &self.stats;
        if free_count != self.free_small.len() + self.free_small_wide.len() + self.free_large.len()
        {
            return Err("index holds blocks that are not free".into());
        }
        if reserved != st.reserved.current
            || allocated != st.allocated.current
            || requested != st.requested.current
        {
            return Err(format!(
                "accounting: reserved {reserved}/{}, allocated {allocated}/{}, requested {requested}/{}",
                st.reserved.current, st.allocated.current, st.requested.current
            ));
        }
        if binned != self.binned_bytes
            || binned
                != self
                    .bins
                    .iter()
                    .flatten()
                    .map(|&i| self.blocks[i as usize].size)
                    .sum()
        {
            return Err(format!("binned {binned} != {}", self.binned_bytes));
        }
        if lent != self.lent {
            return Err(format!("lent {lent} != {}", self.lent));
        }
        if self.live.len() as u64 + lent != st.blocks.current
            || self
                .live
                .iter()
                .any(|(a, i)| self.blocks[i as usize].addr != a)
        {
            return Err("live map disagrees with the blocks".into());
        }
        if held != self.held.len() || held != self.held_blocks {
            return Err("blocks held for streams disagree with the blocks".into());
        }
        if pending != self.pending_bytes() {
            return Err(format!("pending {pending} != {}", self.pending_bytes()));
        }
        self.check_waiting()
    }

    /// An expandable segment: its mapped bytes are its granules marked mapped, and every granule
    /// a block touches that is not free (live, lent, pending, binned) is mapped.
    fn check_granules(&self, si: u32) -> Result<(), String> {
        let s = self.seg(si);
        if !s.expandable {
            return Ok(());
        }
        let Some(granules) = self.range_granules(si) else {
            return Err(format!("segment {si}: expandable, without granules"));
        };
        if granules.count() * self.granule != granules.mapped {
            return Err(format!(
                "segment {si}: mapped bytes disagree with its granules"
            ));
        }
        let mut idx = s.first;
        while idx != NONE {
            let b = &self.blocks[idx as usize];
            if b.state != State::Free {
                let (first, end) = self.granules_of(si, b.addr, b.size);
                if let Some(k) = (first..end).find(|&k| !granules.is_mapped(k)) {
                    return Err(format!(
                        "block {:#x} ({:?}) touches granule {k}, not mapped",
                        b.addr, b.state
                    ));
                }
                if let Some(k) = (first..end).find(|&k| granules.is_unready(k)) {
                    return Err(format!(
                        "block {:#x} ({:?}) touches granule {k}, left by a refused mapping",
                        b.addr, b.state
                    ));
                }
            }
            idx = b.next;
        }
        Ok(())
    }

    /// Pending blocks: the bytes waiting for a fence and for a barrier, and each block's entry in
    /// the queue of what it waits for (and none in the other). (The blocks held for streams are
    /// checked in `check`: every held block's key is in its stream's set, and the sets hold no
    /// more entries than there are held blocks, which `held_blocks` counts.)
    pub(super) fn check_waiting(&self) -> Result<(), String> {
        let entries = |q: &Fifo<(u32, u64)>| q.iter().collect::<HashSet<_>>();
        let (in_fence, in_barrier) = (entries(&self.pending_fence), entries(&self.pending_barrier));
        let (mut fence, mut barrier) = (0, 0);
        for (i, b) in self.blocks.iter().enumerate() {
            if b.state != State::Pending {
                continue;
            }
            let entry = (i as u32, b.stamp);
            let (own, other) = if b.wants_fence {
                fence += b.size;
                (&in_fence, &in_barrier)
            } else {
                barrier += b.size;
                (&in_barrier, &in_fence)
            };
            if !own.contains(&entry) || other.contains(&entry) {
                return Err(format!("pending block {:#x}: queue entries wrong", b.addr));
            }
        }
        if fence != self.pending_fence_bytes || barrier != self.pending_barrier_bytes {
            return Err(format!(
                "waiting for a fence {fence}/{}, for a barrier {barrier}/{}",
                self.pending_fence_bytes, self.pending_barrier_bytes
            ));
        }
        Ok(())
    }
}
