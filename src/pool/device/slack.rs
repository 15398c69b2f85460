//! Mapped memory kept within a slack of the peak allocated (`GPUPOOL_EXPANDABLE_SLACK`;
//! docs/design-notes.md, "Note: the mapped slack").
//!
//! A packed range strands memory in its holes: at a training step's peak, a 1.5 GiB request
//! finds no hole that large and maps new granules while 784 MiB of freed blocks stay mapped
//! below it. With the slack on, a block that needs mapping first unmaps free granules elsewhere
//! when mapping would take the pool above its peak allocated plus the slack: the memory moves
//! to where it is needed. Each move costs an unmap now and a map when the hole is used again,
//! and a fence unless one already covers every free: the reason it is not the default.

use super::*;
use crate::pool::trace::UNMAP_SLACK;

/// The slack never asks for less than this many bytes above the peak allocated: a small
/// program would otherwise move granules at every request for a few MiB.
const SLACK_FLOOR: u64 = 32 << 20;

/// The bound on the cost: the bytes moved stay within this share of the bytes allocated
/// (1/32). The lab's training and inference reach the same peaks with 1/16 and with no bound;
/// random sizes up to 1 GiB moved 107 granules a request with no bound, 13 with 1/16, 7 here.
const MOVED_SHARE: u64 = 32;

impl DevicePool {
    /// The most bytes the pool may hold with a slack of `permille` thousandths while it serves
    /// `serving` more bytes.
    fn slack_budget(&self, permille: u32, serving: u64) -> u64 {
        let allocated = &self.stats.allocated;
        // Saturating: a replayed trace may hold sizes near `u64::MAX`.
        let peak = allocated
            .peak_ever()
            .max(allocated.current.saturating_add(serving));
        peak.saturating_add(
            (peak / 1000)
                .saturating_mul(u64::from(permille))
                .max(SLACK_FLOOR),
        )
    }

    /// Before free block `idx` maps what it lacks for `rounded` bytes: if that would take the
    /// pool above its slack, unmap free granules elsewhere, the highest first, until it would
    /// not. Returns the block to serve: a fence the move needed may have merged `idx` into a
    /// neighbour or made a mapped block free that fits better, so the request is fitted again
    /// after one. Nothing moves if no fence can prove the granules' work done; the mapping then
    /// grows the pool, as without the slack.
    pub(super) fn stay_within_slack(
        &mut self,
        idx: u32,
        rounded: u64,
        backend: &dyn Backend,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> u32 {
        let Some(permille) = policy.mapped_slack_permille else {
            return idx;
        };
        let Some(over) = self.over_slack(idx, rounded, permille, policy) else {
            return idx;
        };
        // `cuMemUnmap` waits for nothing: a fence must cover every free first. It also makes
        // pending blocks free, which may hold granules to move; worth it when they could.
        let idx = if Self::fenced_since_frees(clock) {
            idx
        } else {
            let movable =
                self.free_granules_from_top(over, self.granules_to_serve(idx, rounded, policy));
            if movable.is_empty() && self.pending_bytes() < over {
                return idx;
            }
            let (seg, addr) = (
                self.blocks[idx as usize].seg,
                self.blocks[idx as usize].addr,
            );
            if self.fence(backend, clock).is_err() || !Self::fenced_since_frees(clock) {
                return idx;
            }
            // The fence's merges may have dropped `idx`; the block that took it in covers its
            // address.
            self.find_fit(Class::Large, rounded, policy)
                .unwrap_or_else(|| self.free_block_covering(seg, addr))
        };
        let Some(over) = self.over_slack(idx, rounded, permille, policy) else {
            return idx;
        };
        let candidates =
            self.free_granules_from_top(over, self.granules_to_serve(idx, rounded, policy));
        let (moved, _) = self.unmap_listed(candidates, over, backend, UNMAP_SLACK);
        if moved > 0 {
            self.stats.slack_moves += 1;
            self.stats.slack_unmapped_granules += moved / self.granule;
        }
        idx
    }

    /// How many bytes serving `rounded` from free block `idx` would map beyond the slack of
    /// `permille`, within what the moves may still spend (whole granules); `None` if none.
    fn over_slack(&self, idx: u32, rounded: u64, permille: u32, policy: &Policy) -> Option<u64> {
        let g = self.granule;
        let (si, first, end) = self.granules_to_serve(idx, rounded, policy);
        if !self.seg(si).expandable {
            return None;
        }
        let lacking = (end - first - self.granules(si).count_between(first, end)) * g;
        if lacking == 0 {
            return None;
        }
        let serving = rounded.min(self.blocks[idx as usize].size);
        let over = self
            .stats
            .reserved
            .current
            .saturating_add(lacking)
            .saturating_sub(self.slack_budget(permille, serving));
        let moved_so_far = self.stats.slack_unmapped_granules * g;
        let credit = (self.stats.allocated.total_in / MOVED_SHARE).saturating_sub(moved_so_far);
        Some(over.min(credit / g * g)).filter(|&b| b > 0)
    }

    /// The free block of segment `si` that covers `addr`.
    fn free_block_covering(&self, si: u32, addr: Addr) -> u32 {
        let mut idx = self.seg(si).first;
        loop {
            let b = &self.blocks[idx as usize];
            if addr < b.addr + b.size {
                debug_assert!(b.state == State::Free && b.addr <= addr);
                return idx;
            }
            idx = b.next;
        }
    }

    /// Mapped granules wholly inside free blocks of expandable segments, the highest first,
    /// until they hold `want` bytes; none of segment `keep.0`'s granules `[keep.1, keep.2)`.
    /// The highest first: on the lab's training and inference workloads that moves a third as
    /// many granules as the lowest first, for the same peak.
    fn free_granules_from_top(&self, want: u64, keep: (u32, u64, u64)) -> Vec<(u32, u64)> {
        let mut free: Vec<(Addr, u32)> = self
            .free_large
            .iter()
            .filter(|&(_, &idx)| self.seg(self.blocks[idx as usize].seg).expandable)
            .map(|(&(_, addr), &idx)| (addr, idx))
            .collect();
        free.sort_unstable_by_key(|b| std::cmp::Reverse(b.0));
        let g = self.granule;
        let mut found = Vec::new();
        let mut inside = Vec::new();
        for (_, idx) in free {
            let b = &self.blocks[idx as usize];
            let si = b.seg;
            let (first, end) = self.granules_within(si, b.addr, b.size);
            let kept = |k: u64| si == keep.0 && (keep.1..keep.2).contains(&k);
            inside.clear();
            inside.extend(
                self.granules(si)
                    .mapped_between(first, end)
                    .filter(|&k| !kept(k)),
            );
            for &k in inside.iter().rev() {
                found.push((si, k));
                if found.len() as u64 * g >= want {
                    return found;
                }
            }
        }
        found
    }
}
