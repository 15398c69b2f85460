//! The arena: a free block handed out with its remainder split off, a freed block merged with
//! its free neighbours, and the slots that hold blocks and segments.

use super::*;

impl DevicePool {
    /// Hand out the free block `idx` for a request, splitting off the remainder when allowed.
    #[inline(always)]
    pub(super) fn take(&mut self, idx: u32, rounded: u64, requested: u64, policy: &Policy) -> Addr {
        if self.blocks[idx as usize].state == State::Free {
            self.unindex(idx);
        }
        if self.splits(idx, rounded, policy) {
            let addr = self.blocks[idx as usize].addr;
            self.split_off_free(idx, addr + rounded);
        }
        self.hand_out(idx, requested)
    }

    /// Cut block `idx` at `at`, inside it: `[at, end)` becomes a free block of its own, after
    /// `idx` in its segment's list, indexed, and returned; `idx` keeps `[addr, at)`, and its
    /// indexing is the caller's.
    #[inline(always)]
    pub(super) fn split_off_free(&mut self, idx: u32, at: Addr) -> u32 {
        let rest = self.split_off(idx, at, State::Free, 0, false);
        self.index(rest);
        rest
    }

    /// Cut block `idx` at `at`, inside it: `[at, end)` becomes a block of its own in `state`
    /// (stamped `stamp`, waiting for a fence if `wants_fence`), after `idx` in its segment's
    /// list, and is returned; `idx` keeps `[addr, at)`. Neither is indexed here.
    #[inline(always)]
    pub(super) fn split_off(
        &mut self,
        idx: u32,
        at: Addr,
        state: State,
        stamp: u64,
        wants_fence: bool,
    ) -> u32 {
        let b = &self.blocks[idx as usize];
        let (addr, size, seg, class, next) = (b.addr, b.size, b.seg, b.class, b.next);
        let rest = self.new_block(Block {
            addr: at,
            size: addr + size - at,
            requested: 0,
            seg,
            prev: idx,
            next,
            state,
            class,
            stamp,
            wants_fence,
            held: false,
            origin: 0,
        });
        if next != NONE {
            self.blocks[next as usize].prev = rest;
        }
        self.blocks[idx as usize].next = rest;
        self.blocks[idx as usize].size = at - addr;
        rest
    }

    /// Block `idx`, out of every free structure and split, goes to the program.
    #[inline(always)]
    pub(super) fn hand_out(&mut self, idx: u32, requested: u64) -> Addr {
        let origin = self.origin;
        let b = &mut self.blocks[idx as usize];
        let (addr, seg) = (b.addr, b.seg);
        b.state = State::Live;
        b.requested = requested;
        b.origin = origin;
        let size = b.size;
        self.seg_busy(seg);
        let s = &mut self.stats;
        s.allocated.add(size);
        counted! {
            s.allocs += 1;
            s.requested.add(requested);
            s.blocks.add(1);
            s.histogram[crate::pool::stats::histogram_bucket(requested)] += 1;
        }
        addr
    }

    /// Put block `idx` in the best-fit index, merged with free neighbours.
    pub(super) fn make_free(&mut self, mut idx: u32) {
        let prev = self.blocks[idx as usize].prev;
        if prev != NONE && self.blocks[prev as usize].state == State::Free {
            self.unindex(prev);
            self.absorb_next(prev);
            idx = prev;
        }
        let next = self.blocks[idx as usize].next;
        if next != NONE && self.blocks[next as usize].state == State::Free {
            self.unindex(next);
            self.absorb_next(idx);
        }
        self.blocks[idx as usize].state = State::Free;
        self.index(idx);
        // Only expandable segments' large blocks matter here; one store is cheaper than a test.
        self.unmap_due = true;
    }

    /// Merge the block after `idx` into `idx`.
    pub(super) fn absorb_next(&mut self, idx: u32) {
        let next = self.blocks[idx as usize].next;
        let (size, after) = {
            let n = &self.blocks[next as usize];
            (n.size, n.next)
        };
        self.blocks[idx as usize].size += size;
        self.blocks[idx as usize].next = after;
        if after != NONE {
            self.blocks[after as usize].prev = idx;
        }
        self.drop_block(next);
    }

    pub(super) fn new_block(&mut self, b: Block) -> u32 {
        match self.vacant_blocks.pop() {
            Some(i) => {
                self.blocks[i as usize] = b;
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    pub(super) fn drop_block(&mut self, idx: u32) {
        let b = &mut self.blocks[idx as usize];
        b.state = State::Vacant;
        b.prev = NONE;
        b.next = NONE;
        self.vacant_blocks.push(idx);
    }

    /// Segment `i` gets a live (or lent) block.
    #[inline(always)]
    pub(super) fn seg_busy(&mut self, i: u32) {
        let s = self.seg_mut(i);
        s.live += 1;
        if s.live == 1 {
            let size = s.size;
            self.idle_bytes -= size;
        }
    }

    /// Segment `i` loses a live (or lent) block.
    #[inline(always)]
    pub(super) fn seg_quiet(&mut self, i: u32) {
        let s = self.seg_mut(i);
        s.live -= 1;
        if s.live == 0 {
            let size = s.size;
            self.idle_bytes += size;
        }
    }
}
