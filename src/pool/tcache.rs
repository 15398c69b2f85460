//! Per-thread caches of small blocks in front of a device's lock.
//!
//! One lock per device serializes every thread that allocates on it; two threads then run no
//! faster than one, and usually slower (the lock and the pool's lines move between cores on
//! every call). Once a second thread allocates on a device (in `strict` and `barrier` mode: and
//! the threads compete for its lock, `Contention`), each thread gets a cache of its own
//! for blocks up to `LIMIT`: the blocks it handed out (so that its own frees find them without
//! the device lock) and the blocks it freed. A miss takes the device lock once and borrows a few
//! more ready blocks of the size.
//!
//! A freed block is reusable at once in `relaxed` mode. Otherwise (`strict`, `barrier`,
//! `cudaFreeAsync`) it waits in the cache, stamped with the device's cache epoch
//! (`Seqs::cache_epoch`, read, not written: no shared line moves on a free), until a fence or
//! barrier that started after the free completed — the program's, the pool's, or one the
//! thread takes itself, outside the device lock, at a miss once its cache holds its share of
//! the fence budget waiting (`GPUPOOL_FENCE_BYTES` divided among the caches) and the caches
//! together hold the whole budget (each cache publishes what it holds waiting in an atomic the
//! others read only then), so that a fence covers about a budget, as the device's own do. The
//! device counts what caches hold waiting towards its own budget before it grows; past two
//! budgets a cache gives its waiting blocks back to wait in the device. `BENCHMARKS.md` has
//! the measurements.
//!
//! The device pool sees every block a cache holds as lent (`DevicePool::alloc_lent`): out of its
//! free structures, counted as allocated at full size. Caches give reusable blocks back when
//! they hold more than they keep (`Pool::cache_keep`), when another thread's request of a size
//! they hold reaches the device and finds no block there (half of that size: threads that free
//! a size more often than they ask for it feed those that ask for it more often), before the
//! device grows (half of the reusable ones and all waiting ones), when the device runs out of
//! memory (all), on `empty_cache`, when a release threshold is set, and when their thread exits
//! (the next pool operation on the device takes them back, with the blocks the program still
//! holds). They are never used while tracing, so a trace replays exactly.
//!
//! Lock order: device lock, then the list of caches, then one cache. A thread never holds its
//! cache's lock while it waits for the device lock.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::backend::Addr;
use super::contention::thread_token;
pub use super::contention::{Contention, CONTENTION, CONTENTION_WAITS, CONTENTION_WAIT_NS};
pub use super::device::Extras;
use super::device::{DevicePool, Lenders, Need};
use super::size::{ALIGN, SMALL_LIMIT};
use super::spin::SpinMutex;
use super::stats::{histogram_bucket, DeviceStats, HISTOGRAM_BUCKETS};
use super::{AddrHasher, Seqs};

pub use super::size::THREAD_CACHED_LIMIT as LIMIT;
/// A thread takes a barrier for its cache at a miss once the blocks waiting for one would serve
/// this many requests of the size (or fill a small segment), so that one barrier — a driver call
/// that joins the blocking streams, if no host wait — serves many allocations: without the bound,
/// a thread that frees and allocates one block in turn took one per allocation (found in review).
pub const BARRIER_BATCH: u64 = 8;

/// Ready blocks a miss borrows from the device besides the one it serves, at most.
pub const BATCH: usize = super::device::EXTRAS;

type AddrMap<V> = HashMap<Addr, V, BuildHasherDefault<AddrHasher>>;

/// A block the cache handed out and the program holds.
#[derive(Clone, Copy, Debug)]
pub struct Out {
    pub idx: u32,
    pub size: u64,
    pub requested: u64,
}

/// A free block the cache holds: reusable (in `ready`), or waiting for `need` (in `waiting`),
/// freed at cache epoch `stamp` (`Seqs::cache_epoch`).
#[derive(Clone, Copy, Debug)]
pub struct Held {
    pub idx: u32,
    pub addr: Addr,
    pub size: u64,
    pub need: Need,
    pub stamp: u64,
}

/// What the program did through one cache (added to the device's counters in reports).
#[derive(Clone, Debug)]
pub struct CacheCounts {
    pub allocs: u64,
    pub frees: u64,
    pub hits: u64,
    pub allocated_in: u64,
    pub allocated_out: u64,
    pub requested_in: u64,
    pub requested_out: u64,
    pub histogram: [u64; HISTOGRAM_BUCKETS],
    /// Fences the cache's thread took itself, and the time they blocked it; barriers likewise.
    pub fences: u64,
    pub fence_ns: u64,
    pub barriers: u64,
}

impl CacheCounts {
    /// The cache's thread took a fence (that blocked it `ns`) or a barrier itself.
    pub fn synced(&mut self, need: Need, ns: u64) {
        if need == Need::Fence {
            self.fences += 1;
            self.fence_ns += ns;
        } else {
            self.barriers += 1;
        }
    }
}

impl Default for CacheCounts {
    fn default() -> Self {
        CacheCounts {
            allocs: 0,
            frees: 0,
            hits: 0,
            allocated_in: 0,
            allocated_out: 0,
            requested_in: 0,
            requested_out: 0,
            histogram: [0; HISTOGRAM_BUCKETS],
            fences: 0,
            fence_ns: 0,
            barriers: 0,
        }
    }
}

/// Lists of reusable blocks by size: small sizes (every 512 bytes up to 1 MiB, the common case)
/// indexed directly, larger ones in a map; a bitmap of the small sizes that got a block since
/// the last clear, so that a walk over the lists (a full cache choosing what to give back)
/// visits those alone rather than all 2 048.
#[derive(Default)]
struct ReadyLists {
    small: Vec<Vec<Held>>,
    small_used: [u64; SMALL_SLOTS / 64],
    large: HashMap<u64, Vec<Held>, BuildHasherDefault<AddrHasher>>,
}

const SMALL_SLOTS: usize = (SMALL_LIMIT / ALIGN) as usize;

impl ReadyLists {
    fn get_mut(&mut self, size: u64) -> Option<&mut Vec<Held>> {
        if size <= SMALL_LIMIT {
            self.small.get_mut((size / ALIGN) as usize - 1)
        } else {
            self.large.get_mut(&size)
        }
    }

    fn entry(&mut self, size: u64) -> &mut Vec<Held> {
        if size <= SMALL_LIMIT {
            if self.small.is_empty() {
                self.small.resize_with(SMALL_SLOTS, Vec::new);
            }
            let i = (size / ALIGN) as usize - 1;
            self.small_used[i / 64] |= 1 << (i % 64);
            &mut self.small[i]
        } else {
            self.large.entry(size).or_default()
        }
    }

    /// (size, list) of every size that got a block since the last `prune` or `clear` (some
    /// lists may be empty).
    fn iter(&self) -> impl Iterator<Item = (u64, &Vec<Held>)> {
        let small = self
            .small_used
            .iter()
            .enumerate()
            .flat_map(move |(w, &bits)| {
                let mut bits = bits;
                std::iter::from_fn(move || {
                    if bits == 0 {
                        return None;
                    }
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    Some(((i as u64 + 1) * ALIGN, &self.small[i]))
                })
            });
        small.chain(self.large.iter().map(|(&s, v)| (s, v)))
    }

    /// Forget the sizes whose lists are empty now.
    fn prune(&mut self) {
        for (w, bits) in self.small_used.iter_mut().enumerate() {
            let mut b = *bits;
            while b != 0 {
                let i = w * 64 + b.trailing_zeros() as usize;
                b &= b - 1;
                if self.small[i].is_empty() {
                    *bits &= !(1 << (i % 64));
                }
            }
        }
        self.large.retain(|_, v| !v.is_empty());
    }

    fn clear(&mut self) {
        self.small.iter_mut().for_each(Vec::clear);
        self.small_used = [0; SMALL_SLOTS / 64];
        self.large.clear();
    }
}

#[derive(Default)]
pub struct CacheState {
    /// The device pool's generation these blocks belong to (`DevicePool::generation`).
    pub generation: u64,
    pub out: AddrMap<Out>,
    /// Reusable blocks by size, oldest first.
    ready: ReadyLists,
    pub ready_bytes: u64,
    pub ready_count: u64,
    /// Freed blocks that wait for a barrier or fence, in the order of their stamps: reusable
    /// from here once one covers them (`promote`), or given back to the device.
    waiting: VecDeque<Held>,
    pub waiting_bytes: u64,
    /// Of `waiting_bytes`, those waiting for a fence.
    pub waiting_fence_bytes: u64,
    /// Over the blocks handed out: their size minus what was requested.
    pub out_slack: u64,
    /// Free blocks on their way back to the device (out of this cache, not yet taken back: the
    /// device still counts them lent), so that a report does not read them as the program's.
    pub transit: Transit,
    pub counts: CacheCounts,
}

/// Free blocks a cache sent back to the device that the device has not taken yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transit {
    pub bytes: u64,
    pub count: u64,
    /// Of `bytes`, those whose reuse waits for a barrier or fence (pending).
    pub waiting_bytes: u64,
}

impl Transit {
    fn of(held: &[Held]) -> Transit {
        held.iter().fold(Transit::default(), |t, h| Transit {
            bytes: t.bytes + h.size,
            count: t.count + 1,
            waiting_bytes: t.waiting_bytes + if h.need == Need::Nothing { 0 } else { h.size },
        })
    }
}

impl CacheState {
    /// A reusable block of `rounded` bytes for a request of `requested`, if the cache has one.
    pub fn take_ready(&mut self, rounded: u64, requested: u64) -> Option<Addr> {
        let h = self.ready.get_mut(rounded)?.pop()?;
        self.ready_bytes -= h.size;
        self.ready_count -= 1;
        self.counts.hits += 1;
        self.counts.allocs += 1;
        self.counts.allocated_in += h.size;
        self.counts.requested_in += requested;
        self.counts.histogram[histogram_bucket(requested)] += 1;
        self.hand_out(h.addr, h.idx, h.size, requested);
        Some(h.addr)
    }

    /// Record a block handed out (the device counted the allocation if it served it).
    pub fn hand_out(&mut self, addr: Addr, idx: u32, size: u64, requested: u64) {
        self.out_slack += size - requested;
        self.out.insert(
            addr,
            Out {
                idx,
                size,
                requested,
            },
        );
    }

    /// The program freed `addr`: the block, if this cache handed it out.
    pub fn take_out(&mut self, addr: Addr) -> Option<Out> {
        let o = self.out.remove(&addr)?;
        self.out_slack -= o.size - o.requested;
        self.counts.frees += 1;
        self.counts.allocated_out += o.size;
        self.counts.requested_out += o.requested;
        Some(o)
    }

    pub fn push_ready(&mut self, addr: Addr, idx: u32, size: u64) {
        self.ready.entry(size).push(Held {
            idx,
            addr,
            size,
            need: Need::Nothing,
            stamp: 0,
        });
        self.ready_bytes += size;
        self.ready_count += 1;
    }

    /// A block freed at cache epoch `stamp` that must wait for `need`.
    pub fn push_waiting(&mut self, addr: Addr, idx: u32, size: u64, need: Need, stamp: u64) {
        self.waiting.push_back(Held {
            idx,
            addr,
            size,
            need,
            stamp,
        });
        self.waiting_bytes += size;
        if need == Need::Fence {
            self.waiting_fence_bytes += size;
        }
    }

    /// What the oldest waiting block waits for (`promote` stops at the first block not covered).
    pub fn front_waits_for(&self) -> Option<Need> {
        self.waiting.front().map(|h| h.need)
    }

    /// Waiting blocks that a fence or barrier covered since become reusable. Whether any did.
    pub fn promote(&mut self, seqs: &Seqs) -> bool {
        let Some(front) = self.waiting.front() else {
            return false;
        };
        let fenced = seqs.cache_fenced.load(Ordering::SeqCst);
        let barriered = seqs.cache_barriered.load(Ordering::SeqCst).max(fenced);
        let covered = |h: &Held| match h.need {
            Need::Nothing => true,
            Need::Barrier => h.stamp < barriered,
            Need::Fence => h.stamp < fenced,
        };
        if !covered(front) {
            return false;
        }
        // In stamp order: the first block still waiting stops the walk (a barrier-bound block
        // behind a fence-bound one waits a little longer, never less).
        while let Some(h) = self.waiting.front().copied().filter(covered) {
            self.waiting.pop_front();
            self.waiting_bytes -= h.size;
            if h.need == Need::Fence {
                self.waiting_fence_bytes -= h.size;
            }
            self.push_ready(h.addr, h.idx, h.size);
        }
        true
    }

    /// Free bytes held, reusable or not.
    pub fn held_bytes(&self) -> u64 {
        self.ready_bytes + self.waiting_bytes
    }

    /// Free blocks held.
    pub fn held_count(&self) -> u64 {
        self.ready_count + self.waiting.len() as u64
    }

    /// Every free block (to give back to the device).
    pub fn spill_all(&mut self) -> Vec<Held> {
        let mut out = self.take_waiting();
        self.spill_ready(0, &mut out);
        out
    }

    /// Every block still waiting (given back to the device, they wait there).
    pub fn take_waiting(&mut self) -> Vec<Held> {
        self.waiting_bytes = 0;
        self.waiting_fence_bytes = 0;
        self.waiting.drain(..).collect()
    }

    /// Move reusable blocks into `out` until at most `keep` reusable bytes remain (the sizes
    /// held most of first).
    pub fn spill_ready(&mut self, keep: u64, out: &mut Vec<Held>) {
        self.ready.prune();
        while self.ready_bytes > keep {
            // The size holding the most bytes gives back its older half (the newest stay for
            // the next request of this size).
            let Some((size, _)) = self
                .ready
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .max_by_key(|(s, v)| s * v.len() as u64)
            else {
                break;
            };
            self.spill_size(size, keep == 0, out);
        }
    }

    /// Move the older half of the reusable blocks of `size` bytes (all of them if `all`) into
    /// `out`.
    pub fn spill_size(&mut self, size: u64, all: bool, out: &mut Vec<Held>) {
        let Some(list) = self.ready.get_mut(size) else {
            return;
        };
        let n = if all {
            list.len()
        } else {
            list.len().div_ceil(2)
        };
        for h in list.drain(..n) {
            self.ready_bytes -= h.size;
            self.ready_count -= 1;
            out.push(h);
        }
    }

    /// `held` left this cache for the device (`Pool::give_back`), which takes them back once it
    /// has its lock.
    pub fn send(&mut self, held: &[Held]) {
        let sent = Transit::of(held);
        let t = &mut self.transit;
        t.bytes += sent.bytes;
        t.count += sent.count;
        t.waiting_bytes += sent.waiting_bytes;
    }

    /// The device took back `held`, sent at generation `generation`.
    pub fn arrived(&mut self, generation: u64, held: &[Held]) {
        if self.generation == generation {
            let back = Transit::of(held);
            let t = &mut self.transit;
            t.bytes = t.bytes.saturating_sub(back.bytes);
            t.count = t.count.saturating_sub(back.count);
            t.waiting_bytes = t.waiting_bytes.saturating_sub(back.waiting_bytes);
        }
    }

    /// Forget every block (the device forgot them: `cudaDeviceReset`; or its thread exited).
    pub fn clear(&mut self, generation: u64) {
        if generation != self.generation {
            // A reset: blocks on their way back are gone with the rest.
            self.transit = Transit::default();
        }
        self.out.clear();
        self.ready.clear();
        self.waiting.clear();
        self.ready_bytes = 0;
        self.ready_count = 0;
        self.waiting_bytes = 0;
        self.waiting_fence_bytes = 0;
        self.out_slack = 0;
        self.generation = generation;
    }

    /// The size of the largest reusable block held (0 for none).
    pub fn largest_ready(&self) -> u64 {
        self.ready
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(size, _)| size)
            .max()
            .unwrap_or(0)
    }

    /// Every free block held.
    pub fn held_blocks(&self) -> impl Iterator<Item = &Held> {
        self.ready
            .iter()
            .flat_map(|(_, v)| v.iter())
            .chain(self.waiting.iter())
    }
}

/// Aligned so that two threads' caches never share a cache line.
#[repr(align(128))]
pub struct ThreadCache {
    pub state: SpinMutex<CacheState>,
    /// `CacheState::waiting_fence_bytes` as of the owner's last operation, for other threads to
    /// read without the cache's lock (`Registry::waiting_fence`): it times fences, nothing else.
    published: AtomicU64,
    /// Its thread exited: the device takes its blocks back at its next operation.
    orphaned: AtomicBool,
    orphans: Arc<AtomicUsize>,
}

/// The thread caches of one device.
#[derive(Default)]
pub struct Registry {
    caches: Mutex<Vec<Arc<ThreadCache>>>,
    /// How many caches the list holds (read without its lock).
    count: AtomicUsize,
    /// Caches whose thread exited and whose blocks the device has not taken back yet.
    orphans: Arc<AtomicUsize>,
}

/// Whether a device's thread caches are in use: read by every operation, kept in the device's
/// slot (no pointer to follow on the hit path).
#[derive(Default)]
pub struct Flags {
    /// New blocks may go through thread caches (two threads allocate here, and in `strict` and
    /// `barrier` mode take its lock in turn; no trace, no release threshold, a non-zero bound).
    pub enabled: AtomicBool,
    /// Some cache was made (frees look there first; exited threads' caches may wait).
    pub any: AtomicBool,
    /// A second thread allocated on the device.
    multi: AtomicBool,
    first_thread: AtomicUsize,
}

impl Flags {
    /// Called under the device lock after each allocation there: the first time a second thread
    /// allocates on the device, returns true (the caller then decides whether to enable caches).
    pub fn second_thread_arrived(&self) -> bool {
        if self.multi.load(Ordering::Relaxed) {
            return false;
        }
        let me = thread_token();
        match self.first_thread.load(Ordering::Relaxed) {
            0 => {
                self.first_thread.store(me, Ordering::Relaxed);
                false
            }
            t if t == me => false,
            _ => {
                self.multi.store(true, Ordering::Relaxed);
                true
            }
        }
    }

    pub fn multi(&self) -> bool {
        self.multi.load(Ordering::Relaxed)
    }
}

/// Identifies pools, so that a thread's caches of one pool are never taken for another's.
static POOL_IDS: AtomicU64 = AtomicU64::new(1);

pub fn new_pool_id() -> u64 {
    POOL_IDS.fetch_add(1, Ordering::Relaxed)
}

/// The calling thread's caches: (pool, device, cache).
struct Mine(Vec<(u64, u32, Arc<ThreadCache>)>);

impl Drop for Mine {
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
    static MINE: RefCell<Mine> = const { RefCell::new(Mine(Vec::new())) };
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
        flags: &Flags,
        pool: u64,
        device: u32,
        create: bool,
        f: impl FnOnce(&ThreadCache) -> R,
    ) -> Option<R> {
        MINE.try_with(|m| {
            if let Ok(m) = m.try_borrow() {
                if let Some((_, _, c)) = m.0.iter().find(|(p, d, _)| *p == pool && *d == device) {
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
            flags.any.store(true, Ordering::Release);
            Some(f(&c))
        })
        .ok()?
    }

    /// Every cache, for reports and checks (not to be called with a cache's lock held).
    pub fn caches(&self) -> Vec<Arc<ThreadCache>> {
        self.caches.lock().clone()
    }

    /// Under the device lock: take back every free block the caches hold.
    pub fn reclaim(&self, p: &mut DevicePool, seqs: &Seqs) {
        for c in self.caches.lock().iter() {
            let mut st = c.state.lock();
            if st.generation != p.generation {
                continue;
            }
            let held = st.spill_all();
            c.publish(&st);
            drop(st);
            give_back(p, seqs, &held);
        }
    }

    /// Under the device lock: take back the blocks of caches whose thread exited, and add what
    /// they counted to the device's counters.
    pub fn sweep_orphans(&self, p: &mut DevicePool, seqs: &Seqs) {
        if self.orphans.load(Ordering::Acquire) == 0 {
            return;
        }
        self.caches.lock().retain(|c| {
            if !c.orphaned.load(Ordering::Acquire) {
                return true;
            }
            let mut st = c.state.lock();
            if st.generation == p.generation {
                settle_one(&mut st, p, seqs);
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
    pub fn settle(&self, p: &mut DevicePool, seqs: &Seqs) {
        for c in self.caches.lock().iter() {
            let mut st = c.state.lock();
            if st.generation == p.generation {
                settle_one(&mut st, p, seqs);
                c.publish(&st);
            }
        }
    }

    /// The caches for a report, which may run at exit while another thread is stopped holding
    /// the list's lock: none after a short wait.
    pub fn caches_for_report(&self) -> Vec<Arc<ThreadCache>> {
        self.caches
            .try_lock_for(std::time::Duration::from_millis(200))
            .map_or_else(Vec::new, |l| l.clone())
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

impl Lenders for Registry {
    fn reclaim(&self, p: &mut DevicePool, seqs: &Seqs) {
        Registry::reclaim(self, p, seqs);
    }

    fn reclaim_ready(&self, p: &mut DevicePool, seqs: &Seqs) -> bool {
        let mut any = false;
        for c in self.caches.lock().iter() {
            let mut st = c.state.lock();
            if st.generation != p.generation {
                continue;
            }
            // Half of what each cache keeps: all of it would leave every cache to borrow it
            // again at once. What still waits goes back to wait in the device.
            st.promote(seqs);
            let mut held = st.take_waiting();
            let keep = st.ready_bytes / 2;
            st.spill_ready(keep, &mut held);
            c.publish(&st);
            drop(st);
            give_back(p, seqs, &held);
            any |= !held.is_empty();
        }
        any
    }

    fn reclaim_size(&self, p: &mut DevicePool, seqs: &Seqs, size: u64) -> bool {
        let mut any = false;
        for c in self.caches.lock().iter() {
            let mut st = c.state.lock();
            if st.generation != p.generation {
                continue;
            }
            let mut held = Vec::new();
            st.spill_size(size, false, &mut held);
            drop(st);
            give_back(p, seqs, &held);
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
fn settle_one(st: &mut CacheState, p: &mut DevicePool, seqs: &Seqs) {
    let held = st.spill_all();
    give_back(p, seqs, &held);
    for (_, o) in st.out.drain() {
        p.adopt(o.idx, o.requested);
    }
    st.out_slack = 0;
}

/// Under the device lock: blocks a cache gives back.
pub fn give_back(p: &mut DevicePool, seqs: &Seqs, held: &[Held]) {
    for h in held {
        p.take_back(h.idx, h.need, || seqs.stamp_under_lock());
    }
}

/// Add what a cache counted to a device's counters.
pub fn add_counts(s: &mut DeviceStats, c: &CacheCounts) {
    s.allocs += c.allocs;
    s.frees += c.frees;
    s.hits += c.hits;
    s.thread_cache_hits += c.hits;
    s.allocated.total_in += c.allocated_in;
    s.allocated.total_out += c.allocated_out;
    s.requested.total_in += c.requested_in;
    s.requested.total_out += c.requested_out;
    s.blocks.total_in += c.allocs;
    s.blocks.total_out += c.frees;
    s.fences += c.fences;
    s.fence_ns += c.fence_ns;
    s.barriers += c.barriers;
    for (h, n) in s.histogram.iter_mut().zip(c.histogram.iter()) {
        *h += n;
    }
}

/// A device's counters with what its caches hold and counted: current values exclude the free
/// blocks the caches hold (the device counts them as allocated), and what the program holds is
/// counted at its requested size. Peaks stay the device's, which counted cached blocks as
/// allocated: with thread caches in use they may exceed the true peak by what the caches held.
pub fn merge_into(s: &mut DeviceStats, st: &CacheState) {
    add_counts(s, &st.counts);
    let held = st.held_bytes() + st.transit.bytes;
    let held_blocks = st.held_count() + st.transit.count;
    s.allocated.current = s.allocated.current.saturating_sub(held);
    s.requested.current = s.requested.current.saturating_sub(held + st.out_slack);
    s.blocks.current = s.blocks.current.saturating_sub(held_blocks);
}
