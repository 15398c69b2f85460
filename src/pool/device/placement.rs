//! Where in a range a request goes (docs/design-notes.md, "Note: expandable segments"):
//! blocks are packed at their hole's start, except a long run of one size carved at the
//! range's frontier, whose blocks start on a granule; at out-of-memory the retry takes
//! whatever room maps the fewest granules, at a hole's start or its end.

use super::*;

/// Requests of one size carved in a row at a range's frontier before the next starts on a
/// granule. Longer than the runs a model's layers make (two tensors a layer: the lab's
/// inference carves 35 K and V caches of one size, its training 11 blocks), far shorter than
/// an array of buffers filling a device (3 000 blocks of 5.1 MiB in 16 GiB).
const ARRAY_RUN: u32 = 256;

/// A block in such a run starts on a granule only if it then fills at least this share of
/// the granules it touches, 5/6 (a 5.1 MiB block in 6 MiB; a 4.5 MiB one stays packed).
const ALIGNED_FILL: (u64, u64) = (5, 6);

impl DevicePool {
    /// Where free block `idx` places a request of `rounded` bytes: at its start, unless it
    /// starts on a granule there (`starts_on_granule`). `place` splits off what lies before.
    pub(super) fn placed_at(&self, idx: u32, rounded: u64, policy: &Policy) -> Addr {
        let b = &self.blocks[idx as usize];
        match self.granule_start(idx, rounded, policy) {
            Some(at) if self.starts_on_granule(rounded) => at,
            _ => b.addr,
        }
    }

    /// The granule boundary in free block `idx` where `rounded` bytes could start: for a
    /// range's last free block (its frontier, address space never used) that does not start
    /// on one, with room for the request and a split remainder after it.
    fn granule_start(&self, idx: u32, rounded: u64, policy: &Policy) -> Option<Addr> {
        if !self.is_frontier(idx) {
            return None;
        }
        let b = &self.blocks[idx as usize];
        let base = self.seg(b.seg).addr;
        let at = base + (b.addr - base).next_multiple_of(self.granule);
        let rest = (b.addr + b.size).checked_sub(at)?;
        let cap = self.split_cap(idx, policy);
        (at != b.addr && rest >= rounded && should_split(b.class, rest, rounded, cap)).then_some(at)
    }

    /// Whether a request of `rounded` bytes carved at a range's frontier starts on a granule:
    /// when it continues a run of at least `ARRAY_RUN` requests of its size carved there, and
    /// so placed fills at least `ALIGNED_FILL` of its granules. Packed blocks share granules
    /// with their neighbours, which saves memory while both live, but a block freed between
    /// live ones gives back only the granules wholly inside it: 0.61 of a 5.1 MiB block, so a
    /// device filled with them, every other one freed, holds 0.61 of the blocks twice their
    /// size it would hold without the pool; started on a granule, 0.87. Such a long run is an
    /// array of buffers (a fill, a program's own cache), freed in any order; a model's runs
    /// (its layers' tensors) are shorter and freed together, and stay packed: aligning every
    /// frontier block cost the lab's training and inference 0.5–3% of their peak.
    fn starts_on_granule(&self, rounded: u64) -> bool {
        let (size, run) = self.frontier_run;
        let padded = rounded.next_multiple_of(self.granule);
        size == rounded && run >= ARRAY_RUN && rounded * ALIGNED_FILL.1 >= padded * ALIGNED_FILL.0
    }

    /// Whether block `idx` is a range's frontier: its last block, free, address space never
    /// used past its start.
    fn is_frontier(&self, idx: u32) -> bool {
        let b = &self.blocks[idx as usize];
        b.next == NONE && b.state == State::Free && self.in_range(idx)
    }

    /// Free block `idx` is about to serve `rounded` bytes: where `placed_at` says, with the
    /// part before split off (and left free), and counted in the frontier's run. Returns the
    /// block that serves.
    pub(super) fn place(&mut self, idx: u32, rounded: u64, policy: &Policy) -> u32 {
        if !self.is_frontier(idx) {
            return idx;
        }
        let (addr, at) = (
            self.blocks[idx as usize].addr,
            self.placed_at(idx, rounded, policy),
        );
        let (size, run) = self.frontier_run;
        self.frontier_run = (
            rounded,
            if size == rounded {
                run.saturating_add(1)
            } else {
                1
            },
        );
        if at == addr {
            idx
        } else {
            self.split_at(idx, at)
        }
    }

    /// The room in a range for `rounded` bytes of `class` that maps the fewest granules, for a
    /// request that mapping refused: the best fit by size may need more than another hole, and
    /// a hole's start more than its end, where a live neighbour maps the granule they share
    /// (small holes too: a hole whose first granule went back keeps mapped memory only at its
    /// end); a frontier's packed start may need less than its granule start (`placed_at`, large
    /// blocks only: `serve` places no small one). The block placed elsewhere than at its start
    /// or where `place` would put it is split off here. `None` without such room.
    pub(super) fn cheapest_room(
        &mut self,
        class: Class,
        rounded: u64,
        policy: &Policy,
    ) -> Option<u32> {
        let mut best: Option<(u64, u32, Addr)> = None;
        let candidates: Box<dyn Iterator<Item = u32> + '_> = match class {
            Class::Large => Box::new(self.free_large.range((rounded, 0)..).map(|(_, &i)| i)),
            Class::Small => Box::new(
                self.free_small
                    .fits(rounded)
                    .map(|(_, i)| i)
                    .chain(self.free_small_wide.values().copied()),
            ),
        };
        for idx in candidates {
            let b = &self.blocks[idx as usize];
            if !self.in_range(idx) || !may_serve(b.size, rounded, u64::MAX) {
                continue;
            }
            let served = self.served_bytes(idx, rounded, policy);
            let packed = b.addr;
            let placed = match class {
                Class::Large => self.placed_at(idx, rounded, policy),
                Class::Small => packed,
            };
            for at in [placed, packed, b.addr + b.size - served] {
                let bytes = if at == placed && at != packed {
                    rounded
                } else {
                    served
                };
                let lacking = self.lacking(b.seg, at, bytes);
                if best.is_none_or(|(least, _, _)| lacking < least) {
                    best = Some((lacking, idx, at));
                }
            }
        }
        let (lacking, idx, at) = best?;
        if lacking > 0 {
            // Mapping is growth, as in `grow`.
            self.stats.misses += 1;
        }
        let b = &self.blocks[idx as usize];
        let (start, size) = (b.addr, b.size);
        let placed = match class {
            Class::Large => self.placed_at(idx, rounded, policy),
            Class::Small => start,
        };
        if at == placed || !self.splits(idx, rounded, policy) {
            // Where `serve` puts it (`place`; a small block at its start).
            Some(idx)
        } else if at == start {
            // Packed at the frontier, where `place` would start it on a granule: its own block.
            self.split_at(idx, start + rounded);
            Some(idx)
        } else {
            Some(self.split_at(idx, start + size - rounded))
        }
    }

    /// The granules of segment `si` that `[at, at + bytes)` touches and are not mapped.
    fn lacking(&self, si: u32, at: Addr, bytes: u64) -> u64 {
        let (first, end) = self.granules_of(si, at, bytes);
        (end - first) - self.granules(si).count_between(first, end)
    }

    /// Split free block `idx` at `at`, inside it, so that `[at, end)` is a free block of its
    /// own, which is returned; both stay indexed. A block split here that is not handed out
    /// must join its neighbour again (`rejoin`): free blocks never lie side by side.
    fn split_at(&mut self, idx: u32, at: Addr) -> u32 {
        self.unindex(idx);
        let tail = self.split_off_free(idx, at);
        self.index(idx);
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
