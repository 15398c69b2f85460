//! Where a device's memory lies, for the reports and `cudaMemGetInfo`: the address space and
//! mapped bytes of expandable segments, what the pool could give back now, and what stays
//! stranded beside live blocks. Computed when asked, a walk over the expandable segments'
//! blocks; nothing here runs on the hit path.

use super::granules::Granules;
use super::*;

/// Where a device's memory lies, for the reports and `cudaMemGetInfo`: computed when asked
/// (`DevicePool::cache_figures`, a walk over the expandable segments' blocks), never on the
/// hit path. `releasable + stranded` is the device's cached bytes, less free blocks on their
/// way from a thread cache back to the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheFigures {
    /// Expandable segments, and the address space they reserve.
    pub ranges: u64,
    pub range_bytes: u64,
    /// Bytes mapped in them (part of the reserved bytes).
    pub mapped: u64,
    /// The granule they map in (0: none).
    pub granule: u64,
    /// Cached bytes the pool could give back now: mapped granules no live or lent block
    /// touches, and classic segments without one (after a fence for those awaiting in-flight
    /// work, as out-of-memory takes).
    pub releasable: u64,
    /// Cached bytes that cannot go back while the live blocks stay: free pieces of granules and
    /// segments that also hold live (or lent) blocks.
    pub stranded: u64,
    /// The part of `stranded` in expandable segments' granules.
    pub stranded_in_granules: u64,
    /// The largest request the cache serves without memory from the driver
    /// (`DevicePool::largest_served`): a free block of the small pool counts as
    /// `SMALL_LIMIT` at most (`served_by`), and in an expandable segment only the mapped
    /// piece a request is placed on counts, where the fit finds it.
    pub largest_free: u64,
    /// The largest free piece: a free block, in an expandable segment its longest mapped
    /// stretch. The out-of-memory report's stranded memory lies in such pieces; a request of
    /// its size may still take new memory (`largest_free`).
    pub largest_piece: u64,
}

/// What `DevicePool::walk_range` finds in one expandable segment.
#[derive(Default)]
struct RangeWalk {
    releasable: u64,
    busy: u64,
    largest_piece: u64,
}

/// Requests `DevicePool::largest_served` tries as the fit does before it settles for what
/// needs no trying: a bound on a report's cost where many free blocks are not their size's
/// fit.
const LARGEST_TRIES: usize = 64;

impl DevicePool {
    /// Cached bytes the pool could give back now (`CacheFigures::releasable`), once the
    /// thread caches returned their free blocks: what `cudaMemGetInfo` counts as free beside
    /// the driver's figure. A walk over the expandable segments' blocks.
    pub fn releasable(&self) -> u64 {
        let mut bytes = self.idle_bytes;
        for (si, granules) in &self.ranges {
            bytes += self.walk_range(*si, granules, &[], false).releasable;
        }
        bytes
    }

    /// Where the device's memory lies (`CacheFigures`), for the reports: a walk over the
    /// expandable segments' blocks and a look at the free blocks. `held`: the handles, sorted,
    /// of the lent blocks thread caches hold free (they count as free, as they come back at
    /// out-of-memory and to `cudaMemGetInfo`).
    pub fn cache_figures(&self, held: &[u32], policy: &Policy) -> CacheFigures {
        debug_assert!(held.is_sorted());
        let mut f = CacheFigures {
            granule: self.granule,
            releasable: self.idle_bytes + self.idle_but_held(held),
            ..CacheFigures::default()
        };
        for (si, granules) in &self.ranges {
            let walk = self.walk_range(*si, granules, held, true);
            f.largest_piece = f.largest_piece.max(walk.largest_piece);
            f.ranges += 1;
            f.range_bytes += self.seg(*si).size;
            f.mapped += granules.mapped;
            f.releasable += walk.releasable;
            f.stranded_in_granules += granules.mapped.saturating_sub(walk.busy + walk.releasable);
        }
        let held_bytes: u64 = held.iter().map(|&i| self.blocks[i as usize].size).sum();
        f.stranded = (self.cached() + held_bytes).saturating_sub(f.releasable);
        f.largest_free = self.largest_served(policy);
        // Classic free blocks are pieces whole (the ranges' may lack granules: the walks above
        // measured their mapped stretches).
        let classic = |&idx: &u32| !self.in_range(idx);
        let classic_small = self.free_small.fits(ALIGN).map(|(_, idx)| idx);
        let classic_large = self.free_large.values().copied();
        f.largest_piece = classic_small
            .chain(classic_large)
            .filter(classic)
            .map(|idx| self.blocks[idx as usize].size)
            .fold(f.largest_piece.max(f.largest_free), u64::max);
        f
    }

    /// The largest request the cache serves now without memory from the driver: what the
    /// reports call the largest free block. A request goes to its class's pool (a small block
    /// serves `SMALL_LIMIT` at most: `served_by`), to the best fit by size, and at that block's
    /// start; in an expandable segment the fit passes over a block that would map granules.
    /// So a range's free block offers the mapped bytes it starts with, and a size counts only
    /// if `find_fit` then finds a block: a larger block's mapped piece, or one behind a
    /// smaller block that lacks granules, maps new memory. A classic block of the small pool
    /// and the bins need no trying: `find_fit` always finds them.
    fn largest_served(&self, policy: &Policy) -> u64 {
        let mut sure = self.largest_free_small_classic();
        let mut offers = Vec::new();
        let free_small = self.free_small.fits(ALIGN).map(|(_, idx)| idx);
        let wide = self.free_small_wide.values().copied();
        let large = self.free_large.values().copied();
        for idx in free_small.chain(wide).chain(large) {
            let b = &self.blocks[idx as usize];
            if b.class == Class::Small && !self.in_range(idx) {
                continue;
            }
            let mapped = match self.range_granules(b.seg) {
                Some(_) => self.mapped_from_start(idx),
                None => b.size,
            };
            let whole = served_by(b.class, b.size);
            if mapped >= b.size && b.class == Class::Small {
                // All of it mapped: the small fit finds it for any size it serves.
                sure = sure.max(whole);
                continue;
            }
            // A request that leaves the block unsplit takes all of it: one that splits
            // takes its mapped start.
            let split = match b.class {
                Class::Small => b.size.saturating_sub(ALIGN),
                Class::Large => b.size.saturating_sub(LARGE_SPLIT_REMAINDER + ALIGN),
            };
            offers.push(if mapped >= b.size {
                whole
            } else {
                served_by(b.class, mapped.min(split))
            });
        }
        offers.retain(|&n| n > sure);
        offers.sort_unstable_by(|a, b| b.cmp(a));
        offers.dedup();
        offers
            .into_iter()
            .take(LARGEST_TRIES)
            .find(|&n| self.find_fit(class_of(n), n, policy).is_some())
            .map_or(sure, |n| n.max(sure))
    }

    /// Bytes of the classic segments whose every live or lent block is one of `held` (lent
    /// blocks thread caches hold free): idle once the caches give them back.
    fn idle_but_held(&self, held: &[u32]) -> u64 {
        let mut by_segment: Vec<u32> = held
            .iter()
            .map(|&i| self.blocks[i as usize].seg)
            .filter(|&si| !self.seg(si).expandable)
            .collect();
        by_segment.sort_unstable();
        by_segment
            .chunk_by(|a, b| a == b)
            .filter(|run| self.seg(run[0]).live == run.len() as u32)
            .map(|run| self.seg(run[0]).size)
            .sum()
    }

    /// One expandable segment's blocks: the mapped bytes of granules no live or lent block
    /// (but those of `held`) touches, the bytes of those blocks, and (if `pieces`) the
    /// longest mapped stretch of a free block.
    fn walk_range(&self, si: u32, granules: &Granules, held: &[u32], pieces: bool) -> RangeWalk {
        let s = self.seg(si);
        let g = self.granule;
        let mut w = RangeWalk::default();
        // The start of the run of blocks no live or lent block interrupts.
        let mut quiet_from = s.addr;
        let close = |w: &mut RangeWalk, from: Addr, to: Addr| {
            let (first, end) = self.granules_within(si, from, to - from);
            if first < end {
                w.releasable += granules.count_between(first, end) * g;
            }
        };
        let mut idx = s.first;
        while idx != NONE {
            let b = &self.blocks[idx as usize];
            match b.state {
                State::Lent if held.binary_search(&idx).is_ok() => {}
                State::Live | State::Lent => {
                    close(&mut w, quiet_from, b.addr);
                    quiet_from = b.addr + b.size;
                    w.busy += b.size;
                }
                State::Free if pieces => {
                    w.largest_piece = w
                        .largest_piece
                        .max(self.largest_mapped_piece(si, granules, b));
                }
                _ => {}
            }
            idx = b.next;
        }
        close(&mut w, quiet_from, s.addr + s.size);
        w
    }

    /// The longest mapped stretch of free block `b` of expandable segment `si`.
    fn largest_mapped_piece(&self, si: u32, granules: &Granules, b: &Block) -> u64 {
        self.mapped_pieces(si, granules, b)
            .map(|(lo, hi)| hi - lo)
            .max()
            .unwrap_or(0)
    }

    /// The mapped pieces of free block `b` of expandable segment `si`, lowest first, as (start,
    /// end): its runs of mapped granules, cut to the block.
    pub(super) fn mapped_pieces<'a>(
        &self,
        si: u32,
        granules: &'a Granules,
        b: &Block,
    ) -> impl Iterator<Item = (Addr, Addr)> + 'a {
        let (base, g) = (self.seg(si).addr, self.granule);
        let (first, end) = self.granules_of(si, b.addr, b.size);
        let (start, stop) = (b.addr, b.addr + b.size);
        let mut k = first;
        std::iter::from_fn(move || {
            let from = granules.next_with(k, end, true);
            if from == end {
                return None;
            }
            k = granules.next_with(from, end, false);
            Some(((base + from * g).max(start), (base + k * g).min(stop)))
        })
    }
}
