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
    /// The largest free block that could be handed out without memory from the driver: in an
    /// expandable segment, the largest mapped piece of a free block; of the small pool, at
    /// most `SMALL_LIMIT`, the largest request it serves (`served_by`).
    pub largest_free: u64,
}

/// What `DevicePool::walk_range` finds in one expandable segment.
#[derive(Default)]
struct RangeWalk {
    releasable: u64,
    busy: u64,
    largest_free: u64,
}

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
    /// expandable segments' blocks and a look at the largest classic free blocks. `held`: the
    /// handles, sorted, of the lent blocks thread caches hold free (they count as free, as
    /// they come back at out-of-memory and to `cudaMemGetInfo`).
    pub fn cache_figures(&self, held: &[u32]) -> CacheFigures {
        debug_assert!(held.is_sorted());
        let mut f = CacheFigures {
            granule: self.granule,
            releasable: self.idle_bytes + self.idle_but_held(held),
            ..CacheFigures::default()
        };
        for (si, granules) in &self.ranges {
            let walk = self.walk_range(*si, granules, held, true);
            f.ranges += 1;
            f.range_bytes += self.seg(*si).size;
            f.mapped += granules.mapped;
            f.releasable += walk.releasable;
            f.stranded_in_granules += granules.mapped.saturating_sub(walk.busy + walk.releasable);
            f.largest_free = f.largest_free.max(walk.largest_free);
        }
        let held_bytes: u64 = held.iter().map(|&i| self.blocks[i as usize].size).sum();
        f.stranded = (self.cached() + held_bytes).saturating_sub(f.releasable);
        // Classic free blocks: the small index and bins, and the largest large free block
        // outside the expandable segments (the ranges' free blocks may lack granules: the walks
        // above measured their mapped pieces).
        let classic_large = self
            .free_large
            .iter()
            .rev()
            .find(|&(_, &idx)| !self.seg(self.blocks[idx as usize].seg).expandable)
            .map_or(0, |(&(size, _), _)| size);
        f.largest_free = f
            .largest_free
            .max(self.largest_free_small_classic())
            .max(classic_large);
        f
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
    /// (but those of `held`) touches, the bytes of those blocks, and (if `largest`) the
    /// largest mapped piece of a free block.
    fn walk_range(&self, si: u32, granules: &Granules, held: &[u32], largest: bool) -> RangeWalk {
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
                State::Free if largest => {
                    let piece = self.largest_mapped_piece(si, granules, b);
                    w.largest_free = w.largest_free.max(served_by(b.class, piece));
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
