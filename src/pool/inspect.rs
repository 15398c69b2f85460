//! Reading the pool: statistics snapshots, live blocks, what `cudaMemGetInfo` reports, the
//! structural check.

use super::*;

/// `slot`'s thread caches for a report, waiting for their list as `patience` says.
fn caches_for_report(
    slot: &DeviceSlot,
    patience: LockWait,
) -> Option<Vec<Arc<tcache::ThreadCache>>> {
    match patience {
        LockWait::Unbounded => Some(slot.caches.caches()),
        LockWait::Brief => slot.caches.caches_for_report(),
    }
}

/// Cache `c`'s state for a report, waiting for its lock as `patience` says (`Pool::lock_for_report`).
/// `None` when it stays busy: the report then leaves the whole device unread, since without the
/// cache's figures and blocks it would not agree with itself.
fn cache_for_report(
    c: &tcache::ThreadCache,
    patience: LockWait,
) -> Option<impl std::ops::Deref<Target = tcache::CacheState> + '_> {
    match patience {
        LockWait::Unbounded => Some(c.state.lock()),
        LockWait::Brief => c.state.try_lock_for(std::time::Duration::from_millis(200)),
    }
}

/// A device's counters at one moment.
#[derive(Clone, Debug)]
pub struct DeviceSnapshot {
    pub device: u32,
    pub stats: DeviceStats,
    pub cached: u64,
    pub pending: u64,
    pub largest_free: u64,
    pub threshold: u64,
    /// The most bytes the pool reserves on the device (`u64::MAX`: no limit).
    pub limit: u64,
    pub memory: Option<MemorySample>,
    /// The device's first memory sample (`DevicePool::memory_first`).
    pub memory_first: Option<MemorySample>,
    pub last_oom: Option<OomEvent>,
    /// Whether blocks come from expandable segments, and if not, why.
    pub expandable: Expandable,
    /// Where the device's memory lies: address space, mapped, releasable and stranded bytes.
    pub figures: CacheFigures,
}

/// `Pool::memory_for_program` on figures: the driver's `free` and `total`, the pool's
/// `reserved` bytes, `releasable` of them it could give back now (`DevicePool::releasable`),
/// and its `limit`.
pub fn program_memory(
    free: u64,
    total: u64,
    reserved: u64,
    releasable: u64,
    limit: u64,
) -> (u64, u64) {
    let free = free.saturating_add(releasable).min(total);
    if limit == u64::MAX {
        return (free, total);
    }
    let within = limit.saturating_sub(reserved.saturating_sub(releasable));
    let total = total.min(limit);
    (free.min(within).min(total), total)
}

impl<B: Backend> Pool<B> {
    /// What `cudaMemGetInfo` tells the program of `device`, from the driver's `free` and
    /// `total`: the memory it could get, as without the pool. What the pool gives back before
    /// it reports out-of-memory counts as free: whole free segments, and mapped granules of
    /// expandable segments that no live block touches. So the thread caches first return
    /// their free blocks. Free pieces of segments and granules that hold live blocks do not
    /// count. Under a limit the device looks the limit's size.
    pub fn memory_for_program(&self, device: u32, free: u64, total: u64) -> (u64, u64) {
        let (reserved, releasable, limit) = match self.existing(device) {
            Some(slot) => {
                let mut p = Self::lock(slot);
                Self::take_back_cached_blocks(slot, &mut p);
                (p.stats.reserved.current, p.releasable(), p.limit)
            }
            None => (0, 0, usable_limit(self.settings.limit.resolve(total))),
        };
        program_memory(free, total, reserved, releasable, limit)
    }

    /// The bytes of `device` the pool would give back for another context's request that the
    /// driver refused (its whole free segments and free mapped granules, after the thread
    /// caches return theirs): what such a context may count as free beside the driver's own
    /// figure.
    pub fn releasable(&self, device: u32) -> u64 {
        self.existing(device).map_or(0, |slot| {
            let mut p = Self::lock(slot);
            Self::take_back_cached_blocks(slot, &mut p);
            p.releasable()
        })
    }

    /// Entries in `device`'s fence and barrier queues (tests).
    #[cfg(test)]
    pub fn queue_lens(&self, device: u32) -> (usize, usize) {
        self.existing(device)
            .map_or((0, 0), |slot| Self::lock(slot).queue_lens())
    }

    /// The device whose pool memory contains `addr`, if any.
    pub fn owner_of(&self, addr: Addr) -> Option<u32> {
        (0..MAX_DEVICES as u32).find(|&d| {
            self.existing(d)
                .is_some_and(|s| Self::lock(s).segment_containing(addr).is_some())
        })
    }

    /// The live block starting at `addr`, and its device.
    pub fn live_block(&self, addr: Addr) -> Option<(u32, LiveBlock)> {
        (0..MAX_DEVICES as u32).find_map(|d| {
            let slot = self.existing(d)?;
            let p = Self::lock(slot);
            if let Some(b) = p.live_block_at(addr) {
                return Some((d, b));
            }
            if !slot.flags.any(Ordering::Relaxed) {
                return None;
            }
            slot.caches.caches().iter().find_map(|c| {
                let st = c.state.lock();
                let o = st.out.get(&addr)?;
                (st.generation == p.generation)
                    .then(|| p.lent_block(o.idx, o.requested, o.origin))
                    .flatten()
                    .map(|b| (d, b))
            })
        })
    }

    /// A copy of `device`'s counters, with its cached and pending figures (waiting for the
    /// device's lock).
    pub fn device_stats(&self, device: u32) -> Option<DeviceSnapshot> {
        self.device_stats_with(device, LockWait::Unbounded)
    }

    /// `device_stats`; with `LockWait::Brief`, `None` also when the lock stays busy.
    pub fn device_stats_with(&self, device: u32, patience: LockWait) -> Option<DeviceSnapshot> {
        self.read_device(device, patience, Detail::Figures)
            .map(|(snap, _)| snap)
    }

    /// The counters of `device`, the thread caches' merged in, without the walk over its
    /// segments that the figures of `device_stats` take: for what is read often (CUDA's memory
    /// pool attributes, which PyTorch reads at each `memory_allocated()`).
    pub fn device_counters(&self, device: u32) -> Option<DeviceStats> {
        self.read_device(device, LockWait::Unbounded, Detail::Counters)
            .map(|(snap, _)| snap.stats)
    }

    /// `device_stats_with` and `live_blocks` at one moment, for a report: under one hold of
    /// the device's lock, each thread cache read once, so that the live blocks add up to the
    /// counters' current figures while other threads allocate.
    pub fn device_report(
        &self,
        device: u32,
        patience: LockWait,
    ) -> Option<(DeviceSnapshot, Vec<LiveBlock>)> {
        self.read_device(device, patience, Detail::Live)
    }

    /// The device's snapshot and, if `live`, its live blocks (sorted by address).
    fn read_device(
        &self,
        device: u32,
        patience: LockWait,
        detail: Detail,
    ) -> Option<(DeviceSnapshot, Vec<LiveBlock>)> {
        let live = detail == Detail::Live;
        let slot = self.existing(device)?;
        let p = Self::lock_for_report(slot, patience)?;
        let mut stats = p.stats.clone();
        let mut pending = p.pending_bytes();
        let mut largest_free = 0;
        let mut held = Vec::new();
        let mut blocks = if live { p.live_blocks() } else { Vec::new() };
        for c in caches_for_report(slot, patience)? {
            let st = cache_for_report(&c, patience)?;
            if st.generation == p.generation {
                tcache::merge_into(&mut stats, &st);
                pending += st.waiting_bytes + st.transit.waiting_bytes;
                // Free blocks in thread caches count: else a cache of reusable 1 MB blocks reads
                // as 100% fragmented.
                largest_free = largest_free.max(st.largest_ready());
                held.extend(st.held_blocks().map(|h| h.idx));
                if live {
                    blocks.extend(
                        st.out
                            .values()
                            .filter_map(|o| p.lent_block(o.idx, o.requested, o.origin)),
                    );
                }
            } else {
                tcache::add_counts(&mut stats, &st.counts);
            }
        }
        held.sort_unstable();
        blocks.sort_unstable_by_key(|b| b.addr);
        let figures = match detail {
            Detail::Counters => CacheFigures::default(),
            Detail::Figures | Detail::Live => p.cache_figures(&held, &self.settings.policy),
        };
        largest_free = largest_free.max(figures.largest_free);
        let snap = DeviceSnapshot {
            device,
            cached: stats.reserved.current - stats.allocated.current,
            stats,
            pending,
            largest_free,
            threshold: p.threshold,
            limit: p.limit,
            memory: p.memory,
            memory_first: p.memory_first,
            last_oom: p.last_oom,
            expandable: p.expandable_use(),
            figures,
        };
        Some((snap, blocks))
    }

    /// Devices the pool has been used on.
    pub fn used_devices(&self) -> Vec<u32> {
        (0..MAX_DEVICES as u32)
            .filter(|&d| self.existing(d).is_some())
            .collect()
    }

    /// Live blocks of `device` (none for a device not used; `None` when its lock stays busy,
    /// with `LockWait::Brief`).
    pub fn live_blocks(&self, device: u32, patience: LockWait) -> Option<Vec<LiveBlock>> {
        let Some(slot) = self.existing(device) else {
            return Some(Vec::new());
        };
        let p = Self::lock_for_report(slot, patience)?;
        let mut blocks = p.live_blocks();
        for c in caches_for_report(slot, patience)? {
            let st = cache_for_report(&c, patience)?;
            if st.generation == p.generation {
                blocks.extend(
                    st.out
                        .values()
                        .filter_map(|o| p.lent_block(o.idx, o.requested, o.origin)),
                );
            }
        }
        blocks.sort_unstable_by_key(|b| b.addr);
        Some(blocks)
    }

    /// Hand every device's buffered trace records to the sink (at exit and on dumps; gives up
    /// on a device whose lock stays busy).
    pub fn flush_trace(&self) {
        for d in self.used_devices() {
            if let Some(mut p) = self
                .existing(d)
                .and_then(|slot| Self::lock_for_report(slot, LockWait::Brief))
            {
                p.flush_trace();
            }
        }
    }

    /// Check every device's invariants. Safe while other threads use the pool: blocks on their
    /// way between a device and a thread cache are allowed for.
    pub fn check(&self) -> Result<(), String> {
        self.check_with(false)
    }

    /// `check`, for a pool no thread is using: every block the devices lent is in a cache.
    pub fn check_settled(&self) -> Result<(), String> {
        self.check_with(true)
    }

    pub(super) fn check_with(&self, settled: bool) -> Result<(), String> {
        for d in self.used_devices() {
            let slot = self.existing(d).expect("listed");
            let p = Self::lock(slot);
            p.check().map_err(|e| format!("device {d}: {e}"))?;
            let mut lent = 0;
            for c in slot.caches.caches() {
                let st = c.state.lock();
                if st.generation != p.generation {
                    if !st.out.is_empty() || st.held_bytes() > 0 {
                        return Err(format!("device {d}: a thread cache holds forgotten blocks"));
                    }
                    continue;
                }
                let held = st.held_blocks();
                let out = st.out.iter().map(|(&a, o)| (a, o.idx));
                for (addr, idx) in held.map(|h| (h.addr, h.idx)).chain(out) {
                    if !p.is_lent(idx, addr) {
                        return Err(format!("device {d}: cached block {addr:#x} is not lent"));
                    }
                    lent += 1;
                }
            }
            if lent > p.lent_count() || (settled && lent != p.lent_count()) {
                return Err(format!(
                    "device {d}: thread caches hold {lent} blocks, the device lent {}",
                    p.lent_count()
                ));
            }
        }
        Ok(())
    }
}

/// What `read_device` reads beside the counters.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Detail {
    /// Nothing more: the figures stay empty.
    Counters,
    /// Where the memory lies (`CacheFigures`), a walk over the segments.
    Figures,
    /// The figures and the live blocks.
    Live,
}
