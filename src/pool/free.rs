//! Frees across devices: the device named first, then the others and the thread caches.

use super::*;

impl<B: Backend> Pool<B> {
    /// Give a pointer back; `current` is where the block is looked for first, and for a free in
    /// stream order the device whose stream it names: a block of another device (or of any
    /// device, when `current` is unknown) then waits for a fence. For a `FreeKind::Sync` free
    /// it only orders the search (the outcome is the same on whichever device holds the block),
    /// so any likely device will do. Frees of pointers the pool does not own are reported, not
    /// handled.
    #[inline(always)]
    pub fn free(&self, addr: Addr, kind: FreeKind, current: Option<u32>) -> FreeOutcome {
        if let Some(d) = current {
            if let Some(slot) = self.existing(d) {
                if slot.flags.any(Ordering::Relaxed) {
                    let need = self.need_for(kind);
                    if self.free_cached(slot, d, addr, need) || self.free_in(slot, addr, kind, need)
                    {
                        return FreeOutcome::Freed;
                    }
                } else {
                    let mut p = Self::lock(slot);
                    let stamp = || slot.clock.stamp_under_lock();
                    // The rule read once the lock is taken, as `need_under_lock` would read it
                    // again: `beyond_barriers` is only ever set, so one read there gives the
                    // same answer. `strict`'s rule apart: the free made for it keeps it a
                    // constant, not a value tested twice more.
                    let freed = if self.settings.reuse == ReuseMode::Strict {
                        p.free(addr, kind, ReuseWait::Fence, stamp)
                    } else {
                        p.free(addr, kind, self.need_for(kind), stamp)
                    };
                    if freed {
                        // The hit path: no thread caches on this device.
                        return FreeOutcome::Freed;
                    }
                }
            }
        }
        self.free_elsewhere(addr, kind, self.need_for(kind), current)
    }

    /// A free of a live block of `slot`'s device (after taking back exited threads' caches).
    pub(super) fn free_in(
        &self,
        slot: &DeviceSlot,
        addr: Addr,
        kind: FreeKind,
        need: ReuseWait,
    ) -> bool {
        let mut p = Self::lock(slot);
        if slot.flags.any(Ordering::Relaxed) {
            slot.caches.sweep_orphans(&mut p, &slot.clock);
        }
        let need = self.need_under_lock(need);
        p.free(addr, kind, need, || slot.clock.stamp_under_lock())
    }

    /// `free` of a block not found on the current device: on the others, in any thread's cache,
    /// or not ours.
    #[inline(never)]
    pub(super) fn free_elsewhere(
        &self,
        addr: Addr,
        kind: FreeKind,
        need: ReuseWait,
        current: Option<u32>,
    ) -> FreeOutcome {
        // A free in stream order names a stream of the current device (or of the device the
        // caller named): for a block of another device, its order says nothing that device's
        // barriers or stream-ordered reuse could rely on. Such a block waits for a fence.
        let (kind_there, need_there) = match kind {
            FreeKind::Async { .. } | FreeKind::Ordered { .. } => {
                let k = FreeKind::Async {
                    blocking: false,
                    stream: NO_STREAM,
                };
                (k, self.need_for(k))
            }
            FreeKind::Sync => (kind, need),
        };
        let on = |d: u32| {
            if Some(d) == current {
                (kind, need)
            } else {
                (kind_there, need_there)
            }
        };
        let free_on = |d: u32| {
            let (kind, need) = on(d);
            self.existing(d)
                .is_some_and(|slot| self.free_in(slot, addr, kind, need))
        };
        if (0..MAX_DEVICES as u32).any(|d| Some(d) != current && free_on(d)) {
            return FreeOutcome::Freed;
        }
        // This thread's own caches on the other devices (a block freed with another device
        // current), then every thread's.
        let mine = |d: u32| {
            Some(d) != current
                && self.existing(d).is_some_and(|slot| {
                    slot.flags.any(Ordering::Relaxed) && self.free_cached(slot, d, addr, need_there)
                })
        };
        if (0..MAX_DEVICES as u32).any(mine) || self.free_from_any_cache(addr, |d| on(d).1) {
            return FreeOutcome::Freed;
        }
        // A block moves from an exited thread's cache to the live map (under the device lock)
        // and never back: if that happened since the first look, it is in the live map now.
        if (0..MAX_DEVICES as u32).any(free_on) {
            return FreeOutcome::Freed;
        }
        match self.owner_of(addr) {
            Some(device) => self.refused_in(device),
            None if self.reset_freed.contains(addr) => {
                // A reset took this memory back. The driver first, then the pool again: a
                // segment the pool got at this address since its first look is seen here (its
                // device's lock is taken after the driver gave it), and nothing the driver
                // holds there now goes to CUDA's free unless it is no segment of the pool.
                match self.backend.allocation_starts_at(addr) {
                    // Nothing starts there: CUDA's own free would refuse it as well.
                    Some(false) => FreeOutcome::Invalid,
                    _ if (0..MAX_DEVICES as u32).any(free_on) => FreeOutcome::Freed,
                    _ => match self.owner_of(addr) {
                        Some(device) => self.refused_in(device),
                        None => FreeOutcome::NotOurs,
                    },
                }
            }
            None => FreeOutcome::NotOurs,
        }
    }

    /// A free of pool memory on `device` that is no live block's start: counted, refused.
    fn refused_in(&self, device: u32) -> FreeOutcome {
        if let Some(slot) = self.existing(device) {
            Self::lock(slot).stats.invalid_frees += 1;
        }
        FreeOutcome::Invalid
    }

    /// A free of a block the calling thread's cache handed out: kept there when reusable at
    /// once, else (and when the cache outgrows its bound) given back to the device in a batch.
    pub(super) fn free_cached(
        &self,
        slot: &DeviceSlot,
        device: u32,
        addr: Addr,
        need: ReuseWait,
    ) -> bool {
        let bound = self.settings.thread_cache;
        let handled = slot
            .caches
            .with_mine(&slot.flags, self.id, device, false, |c| {
                let mut st = c.state.lock();
                let Some(o) = st.take_out(addr) else {
                    return false;
                };
                let need = self.need_under_lock(need);
                // Read under the cache's lock: a threshold set meanwhile reclaims after this.
                let enabled = slot.flags.enabled();
                let mut held = Vec::new();
                // Stamped now, after the program's free: a fence or barrier that starts later
                // covers it (`ReuseClock::before_sync`).
                let stamp = match need {
                    ReuseWait::Nothing => 0,
                    _ => slot.clock.cache_stamp(&st),
                };
                if !enabled || o.size > tcache::LIMIT || o.size > bound {
                    // Caches are off (everything goes back), or the block is larger than any
                    // request a cache serves (a large block the device did not split), or than
                    // the cache may hold.
                    held.push(tcache::CachedBlock {
                        idx: o.idx,
                        addr,
                        size: o.size,
                        need,
                        stamp,
                    });
                    if !enabled {
                        held.extend(st.spill_all());
                    }
                } else if need == ReuseWait::Nothing {
                    // Full: the sizes held most of make room (what is freed now is likelier to be
                    // asked for again than what waited longest).
                    // Down to half the bound, or lower when the block needs more room: the cache
                    // never holds more than its bound.
                    if st.ready_bytes + o.size > bound {
                        st.spill_ready((bound / 2).min(bound - o.size), &mut held);
                    }
                    st.push_ready(addr, o.idx, o.size);
                } else {
                    // Waits for a barrier or fence here, where it becomes reusable (the thread
                    // fences itself at its next miss once it holds a whole budget); past two,
                    // a thread that frees without missing gives its waiting blocks back to
                    // wait in the device.
                    st.push_waiting(addr, o.idx, o.size, need, stamp);
                    if st.waiting_bytes > self.settings.policy.fence_bytes.saturating_mul(2) {
                        held = st.take_waiting();
                    }
                }
                c.publish(&st);
                if !held.is_empty() {
                    let gen = st.generation;
                    st.send(&held);
                    drop(st);
                    Self::receive_from_cache(slot, c, gen, &held);
                }
                true
            });
        handled == Some(true)
    }

    /// Blocks cache `c` of generation `gen` sent back (`CacheState::send`) to `slot`'s device
    /// (dropped if the device was reset since: they went with it). Takes the device lock, then
    /// the cache's, to count them arrived; not to be called with a cache's lock held.
    pub(super) fn receive_from_cache(
        slot: &DeviceSlot,
        c: &tcache::ThreadCache,
        gen: u64,
        held: &[tcache::CachedBlock],
    ) {
        let mut p = Self::lock(slot);
        if gen == p.generation {
            tcache::return_blocks(&mut p, &slot.clock, held);
        }
        c.state.lock().arrived(gen, held);
    }

    /// A free of a block some thread's cache handed out (another thread's, or one whose thread
    /// exited): straight back to its device, to wait for `need_on` that device.
    pub(super) fn free_from_any_cache(
        &self,
        addr: Addr,
        need_on: impl Fn(u32) -> ReuseWait,
    ) -> bool {
        for d in 0..MAX_DEVICES as u32 {
            let need = need_on(d);
            let Some(slot) = self.existing(d) else {
                continue;
            };
            if !slot.flags.any(Ordering::Relaxed) {
                continue;
            }
            for c in slot.caches.caches() {
                let mut st = c.state.lock();
                let Some(o) = st.take_out(addr) else {
                    continue;
                };
                let need = self.need_under_lock(need);
                let gen = st.generation;
                // The device stamps it when it takes it back.
                let held = [tcache::CachedBlock {
                    idx: o.idx,
                    addr,
                    size: o.size,
                    need,
                    stamp: 0,
                }];
                st.send(&held);
                drop(st);
                Self::receive_from_cache(slot, &c, gen, &held);
                return true;
            }
        }
        false
    }

    /// `need`, read before the free took the device's or its cache's lock, as it is under
    /// that lock: a non-blocking stream noted meanwhile makes a barrier a fence. The note
    /// takes the same locks after it is made (`note_work_beyond_barriers`), so a free either
    /// sees it here or is seen there.
    #[inline(always)]
    pub(super) fn need_under_lock(&self, need: ReuseWait) -> ReuseWait {
        if need == ReuseWait::Barrier && self.beyond_barriers.load(Ordering::Relaxed) {
            ReuseWait::Fence
        } else {
            need
        }
    }

    pub(super) fn need_for(&self, kind: FreeKind) -> ReuseWait {
        // `strict` first, which needs nothing more read.
        if self.settings.reuse == ReuseMode::Strict {
            return ReuseWait::Fence;
        }
        need_for(
            self.settings.reuse,
            kind,
            self.beyond_barriers.load(Ordering::Relaxed),
        )
    }
}
