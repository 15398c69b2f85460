//! Per-thread caches of blocks up to 10 MiB in front of a device's lock.
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
//! (`ReuseClock::cache_epoch`, read, not written: no shared line moves on a free), until a fence or
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
//!
//! This file holds the cache types; `state.rs` one cache's contents, `registry.rs` the device's
//! set of caches and what the device asks of them, `counts.rs` their counters in reports.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::pool::backend::Addr;
use crate::pool::contention::thread_token;
pub use crate::pool::contention::{Contention, CONTENTION, CONTENTION_WAITS, CONTENTION_WAIT_NS};
pub use crate::pool::device::Extras;
use crate::pool::device::{Borrowers, DevicePool, ReuseWait};
use crate::pool::size::{ALIGN, SMALL_LIMIT};
use crate::pool::spin::SpinMutex;
use crate::pool::stats::{histogram_bucket, DeviceStats, HISTOGRAM_BUCKETS};
use crate::pool::{AddrHasher, ReuseClock};

mod counts;
mod registry;
mod state;

pub use counts::{add_counts, merge_into};
pub use registry::return_blocks;
pub use state::{CacheState, Transit};

pub use crate::pool::size::THREAD_CACHED_LIMIT as LIMIT;
/// A thread takes a barrier for its cache at a miss once the blocks waiting for one would serve
/// this many requests of the size (or fill a small segment), so that one barrier — a driver call
/// that joins the blocking streams, if no host wait — serves many allocations: without the bound,
/// a thread that frees and allocates one block in turn took one per allocation.
pub const BARRIER_BATCH: u64 = 8;

/// Ready blocks a miss borrows from the device besides the one it serves, at most.
pub const BATCH: usize = crate::pool::device::EXTRAS;

type AddrMap<V> = HashMap<Addr, V, BuildHasherDefault<AddrHasher>>;

/// A block the cache handed out and the program holds.
#[derive(Clone, Copy, Debug)]
pub struct HandedOut {
    pub idx: u32,
    pub size: u64,
    pub requested: u64,
    pub origin: crate::pool::device::Origin,
}

/// A free block the cache holds: reusable (in `ready`), or waiting for `need` (in `waiting`),
/// freed at cache epoch `stamp` (`ReuseClock::cache_epoch`).
#[derive(Clone, Copy, Debug)]
pub struct CachedBlock {
    pub idx: u32,
    pub addr: Addr,
    pub size: u64,
    pub need: ReuseWait,
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
    pub fn synced(&mut self, need: ReuseWait, ns: u64) {
        if need == ReuseWait::Fence {
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
pub struct CacheSwitches {
    /// `ENABLED` and `ANY`, in one word: the hit tests both with one load.
    bits: AtomicU8,
    /// A second thread allocated on the device.
    multi: AtomicBool,
    first_thread: AtomicUsize,
}

/// New blocks may go through thread caches (two threads allocate here, and in `strict` and
/// `barrier` mode take its lock in turn; no trace, no release threshold, a non-zero bound).
const ENABLED: u8 = 1;
/// Some cache was made (frees look there first; exited threads' caches may wait).
const ANY: u8 = 2;

impl CacheSwitches {
    /// Thread caches may take new blocks (`ENABLED`).
    pub fn enabled(&self) -> bool {
        self.bits.load(Ordering::Relaxed) & ENABLED != 0
    }

    /// Set under the device lock. A read-modify-write, as `set_any` may run beside it.
    pub fn set_enabled(&self, on: bool) {
        if on {
            self.bits.fetch_or(ENABLED, Ordering::Relaxed);
        } else {
            self.bits.fetch_and(!ENABLED, Ordering::Relaxed);
        }
    }

    /// Some cache was made (`ANY`), read with `order`: `Acquire` to see what the cache's
    /// registration wrote before (`set_any`).
    pub fn any(&self, order: Ordering) -> bool {
        self.bits.load(order) & ANY != 0
    }

    /// A cache was made; it is never unset.
    pub fn set_any(&self) {
        self.bits.fetch_or(ANY, Ordering::Release);
    }

    /// `enabled() || any(Relaxed)`, in one load: the hit's test.
    #[inline(always)]
    pub fn enabled_or_any(&self) -> bool {
        self.bits.load(Ordering::Relaxed) != 0
    }

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
