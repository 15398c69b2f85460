//! The device's caches: each thread's own, found without a lock, and what the device asks of
//! them (give blocks back, settle, forget).

use super::*;

/// The calling thread's caches: (pool, device, cache).
struct ThisThreadsCaches(Vec<(u64, u32, Arc<ThreadCache>)>);

impl Drop for ThisThreadsCaches {
    fn drop(&mut self) {
        for (_, _, c) in &self.0 {
            // Counted first: a sweep that sees the count but not yet the flag keeps it for the
            // next sweep.
            c.orphans.fetch_add(1, Ordering::Release);
            c.orphaned.store(true, Ordering::Release);
        }
    }
}

thread_local! {
    static THIS_THREADS_CACHES: RefCell<ThisThreadsCaches> = const { RefCell::new(ThisThreadsCaches(Vec::new())) };
}

impl ThreadCache {
    /// Publish what `st` (this cache's state) holds waiting for a fence.
    pub fn publish(&self, st: &CacheState) {
        if self.published.load(Ordering::Relaxed) != st.waiting_fence_bytes {
            self.published
                .store(st.waiting_fence_bytes, Ordering::Relaxed);
        }
    }
}

impl Registry {
    /// Bytes every cache holds waiting for a fence, as they last published them.
    pub fn waiting_fence(&self) -> u64 {
        self.caches
            .lock()
            .iter()
            .map(|c| c.published.load(Ordering::Relaxed))
            .sum()
    }

    /// Run `f` on the calling thread's cache for (`pool`, `device`), made if `create`. `None`
    /// when there is none, or the thread is exiting.
    pub fn with_mine<R>(
        &self,
        flags: &CacheSwitches,
        pool: u64,
        device: u32,
        create: bool,
        f: impl FnOnce(&ThreadCache) -> R,
    ) -> Option<R> {
        THIS_THREADS_CACHES
            .try_with(|m| {
                if let Ok(m) = m.try_borrow() {
                    if let Some((_, _, c)) = m.0.iter().find(|(p, d, _)| *p == pool && *d == device)
                    {
                        return Some(f(c));
                    }
                }
                if !create {
                    return None;
                }
                let c = Arc::new(ThreadCache {
                    state: SpinMutex::new(CacheState::default()),
                    published: AtomicU64::new(0),
                    orphaned: AtomicBool::new(false),
                    orphans: Arc::clone(&self.orphans),
                });
                m.try_borrow_mut()
                    .ok()?
                    .0
                    .push((pool, device, Arc::clone(&c)));
                let mut list = self.caches.lock();
                list.push(Arc::clone(&c));
                self.count.store(list.len(), Ordering::Relaxed);
                drop(list);
                flags.set_any();
                Some(f(&c))
            })
            .ok()?
    }

    /// Every cache, for reports and checks (not to be called with a cache's lock held).
    pub fn caches(&self) -> Vec<Arc<ThreadCache>> {
        self.caches.lock().clone()
    }

    /// Under the device lock: take back every free block the caches hold.
    pub fn reclaim(&self, p: &mut DevicePool, clock: &ReuseClock) {
        for c in self.caches.lock().iter() {
            let mut st = c.state.lock();
            if st.generation != p.generation {
                continue;
            }
            let held = st.spill_all();
            c.publish(&st);
            drop(st);
            return_blocks(p, clock, &held);
        }
    }

    /// Under the device lock: take back the blocks of caches whose thread exited, and add what
    /// they counted to the device's counters.
    pub fn sweep_orphans(&self, p: &mut DevicePool, clock: &ReuseClock) {
        if self.orphans.load(Ordering::Acquire) == 0 {
            return;
        }
        self.caches.lock().retain(|c| {
            if !c.orphaned.load(Ordering::Acquire) {
                return true;
            }
            let mut st = c.state.lock();
            if st.generation == p.generation {
                settle_one(&mut st, p, clock);
            }
            add_counts(&mut p.stats, &st.counts);
            st.clear(p.generation);
            self.orphans.fetch_sub(1, Ordering::AcqRel);
            false
        });
        self.count
            .store(self.caches.lock().len(), Ordering::Relaxed);
    }

    /// How many thread caches the device has.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed) as u64
    }

    /// Under the device lock, before `forget_all`: every free block back, and the blocks the
    /// program holds become ordinary live blocks (the caches keep serving their frees no more).
    pub fn settle(&self, p: &mut DevicePool, clock: &ReuseClock) {
        for c in self.caches.lock().iter() {
            let mut st = c.state.lock();
            if st.generation == p.generation {
                settle_one(&mut st, p, clock);
                c.publish(&st);
            }
        }
    }

    /// The caches for a report, which may run at exit while another thread is stopped holding
    /// the list's lock: `None` after a short wait.
    pub fn caches_for_report(&self) -> Option<Vec<Arc<ThreadCache>>> {
        self.caches
            .try_lock_for(std::time::Duration::from_millis(200))
            .map(|l| l.clone())
    }

    /// Under the device lock, after `forget_all`: the caches forget their blocks too.
    pub fn forget(&self, generation: u64) {
        for c in self.caches.lock().iter() {
            let mut st = c.state.lock();
            st.clear(generation);
            c.publish(&st);
        }
    }
}

impl Borrowers for Registry {
    fn reclaim(&self, p: &mut DevicePool, clock: &ReuseClock) {
        Registry::reclaim(self, p, clock);
    }

    fn reclaim_ready(&self, p: &mut DevicePool, clock: &ReuseClock) -> bool {
        let mut any = false;
        for c in self.caches.lock().iter() {
            let mut st = c.state.lock();
            if st.generation != p.generation {
                continue;
            }
            // Half of what each cache keeps: all of it would leave every cache to borrow it
            // again at once. What still waits goes back to wait in the device.
            st.promote(clock);
            let mut held = st.take_waiting();
            let keep = st.ready_bytes / 2;
            st.spill_ready(keep, &mut held);
            c.publish(&st);
            drop(st);
            return_blocks(p, clock, &held);
            any |= !held.is_empty();
        }
        any
    }

    fn reclaim_size(&self, p: &mut DevicePool, clock: &ReuseClock, size: u64) -> bool {
        let mut any = false;
        for c in self.caches.lock().iter() {
            let mut st = c.state.lock();
            if st.generation != p.generation {
                continue;
            }
            let mut held = Vec::new();
            st.spill_size(size, false, &mut held);
            drop(st);
            return_blocks(p, clock, &held);
            any |= !held.is_empty();
        }
        any
    }

    fn waiting(&self, p: &DevicePool) -> (u64, u64) {
        let (mut barrier, mut fence) = (0, 0);
        for c in self.caches.lock().iter() {
            let st = c.state.lock();
            if st.generation == p.generation {
                fence += st.waiting_fence_bytes;
                barrier += st.waiting_bytes - st.waiting_fence_bytes;
            }
        }
        (barrier, fence)
    }
}

/// Under the device lock: a cache gives every free block back, and the blocks the program holds
/// become ordinary live blocks of the device.
fn settle_one(st: &mut CacheState, p: &mut DevicePool, clock: &ReuseClock) {
    let held = st.spill_all();
    return_blocks(p, clock, &held);
    for (_, o) in st.out.drain() {
        p.adopt(o.idx, o.requested, o.origin);
    }
    st.out_slack = 0;
}

/// Under the device lock: blocks a cache gives back.
pub fn return_blocks(p: &mut DevicePool, clock: &ReuseClock, held: &[CachedBlock]) {
    for h in held {
        p.take_back(h.idx, h.need, || clock.stamp_under_lock());
    }
}
