//! Where in a range a request goes when mapping was refused (docs/design-notes.md, "Note:
//! expandable segments"): blocks are packed at their hole's start, but at out-of-memory the
//! retry takes whatever room maps the fewest granules, at a hole's start or its end.

use super::*;

impl DevicePool {
    /// The room in a range for `rounded` bytes that maps the fewest granules, for a request
    /// that mapping refused: the best fit by size may need more than another hole, and a
    /// hole's start more than its end, where a live neighbour maps the granule they share.
    /// The block placed at its hole's end is split off here. `None` without such room.
    pub(super) fn cheapest_room(&mut self, rounded: u64, policy: &Policy) -> Option<u32> {
        let mut best: Option<(u64, u32, bool)> = None;
        for (_, &idx) in self.free_large.range((rounded, 0)..) {
            let b = &self.blocks[idx as usize];
            if !self.in_range(idx) || !may_serve(b.size, rounded, u64::MAX) {
                continue;
            }
            let served = self.served_bytes(idx, rounded, policy);
            for at_end in [false, true] {
                let at = if at_end {
                    b.addr + b.size - served
                } else {
                    b.addr
                };
                let lacking = self.lacking(b.seg, at, served);
                if best.is_none_or(|(least, _, _)| lacking < least) {
                    best = Some((lacking, idx, at_end));
                }
            }
        }
        let (lacking, idx, at_end) = best?;
        if lacking > 0 {
            // Mapping is growth, as in `grow`.
            self.stats.misses += 1;
        }
        Some(if at_end && self.splits(idx, rounded, policy) {
            self.split_off_end(idx, rounded)
        } else {
            idx
        })
    }

    /// The granules of segment `si` that `[at, at + bytes)` touches and are not mapped.
    fn lacking(&self, si: u32, at: Addr, bytes: u64) -> u64 {
        let (first, end) = self.granules_of(si, at, bytes);
        (end - first) - self.granules(si).count_between(first, end)
    }

    /// Split free block `idx` so that its last `bytes` are a free block of their own, which is
    /// returned; both stay indexed. A block split here that is not handed out must join its
    /// neighbour again (`rejoin`): free blocks never lie side by side.
    fn split_off_end(&mut self, idx: u32, bytes: u64) -> u32 {
        self.unindex(idx);
        let b = self.blocks[idx as usize].clone();
        let tail = self.new_block(Block {
            addr: b.addr + b.size - bytes,
            size: bytes,
            prev: idx,
            ..b
        });
        if b.next != NONE {
            self.blocks[b.next as usize].prev = tail;
        }
        let head = &mut self.blocks[idx as usize];
        head.next = tail;
        head.size -= bytes;
        self.index(idx);
        self.index(tail);
        tail
    }

    /// Free block `idx`, not handed out after all, merges with a free neighbour it was split
    /// from.
    pub(super) fn rejoin(&mut self, idx: u32) {
        let b = &self.blocks[idx as usize];
        let free = |i: u32| i != NONE && self.blocks[i as usize].state == State::Free;
        if b.state == State::Free && (free(b.prev) || free(b.next)) {
            self.unindex(idx);
            self.make_free(idx);
        }
    }
}
