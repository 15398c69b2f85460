//! The caching algorithm, in plain Rust with no FFI: one `DevicePool` per device behind its own
//! lock, each with the map of its live pointers. A free looks on the calling thread's current
//! device first (where a block is almost always freed), then on the others, so it finds its
//! block from any thread with one lock and one hash lookup on the common path. Generic over
//! `Backend`, so it is unit-tested and replayed offline.

pub mod backend;
pub mod device;
pub mod free_lists;
pub mod replay;
pub mod size;
pub mod spin;
pub mod stats;
pub mod tcache;
pub mod trace;

use parking_lot::{Mutex, MutexGuard};
use std::hash::Hasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

pub use backend::{Addr, Backend, CudaError};
pub use device::{DevicePool, LiveBlock, MemorySample, Need, OomEvent, Policy, Release};
pub use stats::DeviceStats;
pub use trace::TraceSink;

use crate::config::{DeviceBytes, ReuseMode};

/// Allocations under a device's lock over which `Settings::cache_contention` is counted.
const CONTENTION_WINDOW: u64 = 1 << 16;

/// The most of a fence share a strict- or barrier-mode thread cache keeps reusable (twice this at
/// most): `GPUPOOL_THREAD_CACHE`'s own limit (a budget of `none` would be unbounded).
const MAX_CACHE_SHARE: u64 = 1 << 30;

/// Devices the pool serves; calls for higher ordinals pass through to the runtime.
pub const MAX_DEVICES: usize = 64;

/// Sequence numbers of one device, readable without its lock. A free takes the next `freed`
/// number; a fence or barrier that started after `freed` reached `n` sets `fenced`/`barriered`
/// to at least `n`, which makes every block stamped below `n` reusable.
///
/// Thread caches stamp their frees with `cache_epoch` as it is, without the device's lock and
/// without writing it (a write on every free would move its line between the threads); every
/// fence or barrier, the pool's or the program's, moves the epoch on before it starts and
/// raises `cache_fenced`/`cache_barriered` to the epoch it started in once it completed.
#[derive(Default)]
pub struct Seqs {
    pub freed: AtomicU64,
    pub fenced: AtomicU64,
    pub barriered: AtomicU64,
    pub cache_epoch: AtomicU64,
    pub cache_fenced: AtomicU64,
    pub cache_barriered: AtomicU64,
}

/// What a fence or barrier will cover, read before it starts (`Seqs::before_sync`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncSeq {
    /// Blocks the device stamped below this.
    pub freed: u64,
    /// Blocks thread caches stamped below this.
    pub epoch: u64,
}

impl Seqs {
    /// Read before a fence or barrier starts: what it will cover once it completed.
    pub fn before_sync(&self) -> SyncSeq {
        SyncSeq {
            freed: self.freed.load(Ordering::Acquire),
            epoch: self.cache_epoch.fetch_add(1, Ordering::SeqCst) + 1,
        }
    }

    /// A fence that started at `at` completed. Returns the device's fenced sequence.
    pub fn fenced_at(&self, at: SyncSeq) -> u64 {
        self.cache_fenced.fetch_max(at.epoch, Ordering::SeqCst);
        self.fenced
            .fetch_max(at.freed, Ordering::AcqRel)
            .max(at.freed)
    }

    /// A barrier that started at `at` completed. Returns the device's barriered sequence.
    pub fn barriered_at(&self, at: SyncSeq) -> u64 {
        self.cache_barriered.fetch_max(at.epoch, Ordering::SeqCst);
        self.barriered
            .fetch_max(at.freed, Ordering::AcqRel)
            .max(at.freed)
    }

    /// The cache epoch a block freed now into a thread cache waits on. The program's work issued
    /// before the free must be ordered ahead of this read. Contract: the caller holds `_locked`,
    /// the cache's lock, taken during this free after the program's call. On x86-64 the locked
    /// instruction that took it did the ordering (a full barrier there; one more cost a fifth of
    /// the free path under two threads); elsewhere a fence does.
    pub fn cache_stamp<T>(&self, _locked: &spin::SpinGuard<'_, T>) -> u64 {
        #[cfg(not(target_arch = "x86_64"))]
        std::sync::atomic::fence(Ordering::SeqCst);
        self.cache_epoch.load(Ordering::SeqCst)
    }

    /// The stamp of a block freed now. Only frees under the device's lock write the sequence:
    /// no atomic read-modify-write needed (the hit path's cost is its atomic operations).
    pub fn stamp_under_lock(&self) -> u64 {
        let seq = self.freed.load(Ordering::Relaxed);
        self.freed.store(seq + 1, Ordering::Release);
        seq
    }
}

/// Aligned to two cache lines (the adjacent-line prefetcher pairs them): threads on different
/// devices then never write to a line another device's lock or sequences live on (measured by
/// `benches/threads.rs`: without it, two threads on two devices ran no faster than one).
#[repr(C, align(128))]
struct DeviceSlot {
    pool: Mutex<DevicePool>,
    seqs: Seqs,
    flags: tcache::Flags,
    caches: Arc<tcache::Registry>,
    /// Nanoseconds the device's pool spent in the backend under its lock (`Timed`).
    backend_ns: AtomicU64,
}

/// The backend as a device's pool calls it under the device's lock: the time spent there is
/// added to `ns`, so that a thread that waited for the lock meanwhile does not take a fence or a
/// driver call for contention (`tcache::Contention`: a program that synchronizes the device
/// under the pool's lock is not one whose threads compete for it).
struct Timed<'a, B: Backend> {
    inner: &'a B,
    ns: &'a AtomicU64,
}

impl<B: Backend> Timed<'_, B> {
    fn time<R>(&self, f: impl FnOnce() -> R) -> R {
        let t = Instant::now();
        let r = f();
        self.ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
}

impl<B: Backend> Backend for Timed<'_, B> {
    fn alloc_segment(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        self.time(|| self.inner.alloc_segment(device, bytes))
    }
    fn free_segment(&self, device: u32, addr: Addr) -> Result<(), CudaError> {
        self.time(|| self.inner.free_segment(device, addr))
    }
    fn fence(&self, device: u32) -> Result<(), CudaError> {
        self.time(|| self.inner.fence(device))
    }
    fn barrier(&self, device: u32) -> Result<(), CudaError> {
        self.time(|| self.inner.barrier(device))
    }
    fn memory_info(&self, device: u32) -> Result<(u64, u64), CudaError> {
        self.time(|| self.inner.memory_info(device))
    }
}

/// Device pointers are aligned and well spread: a multiplicative hash is enough and much cheaper
/// than SipHash on the hit path.
#[derive(Default)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }
}

/// Small integer keys (stream ids, block handles): one multiplication mixes them enough, where
/// SipHash would be most of a stream-ordered pair's cost.
#[derive(Default)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// How long a report waits for a device's lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Patience {
    /// As long as it takes (the program asked, from one of its threads).
    Wait,
    /// 200 ms (at exit, on a signal, on an out-of-memory: another thread may be stopped in the
    /// pool).
    Brief,
}

/// How the program gave a block back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeKind {
    /// `cudaFree`.
    Sync,
    /// `cudaFreeAsync` on a stream; `blocking` is false for a non-blocking stream.
    Async { blocking: bool, stream: StreamKey },
}

/// Names a stream for stream-ordered reuse (`Pool::alloc_on`): in the library, the runtime's
/// unique id of the stream (`hooks::stream_key`); in a replay, the trace's number for it.
pub type StreamKey = u64;

/// No stream, or one the runtime could not name: never reused in stream order.
pub const NO_STREAM: StreamKey = StreamKey::MAX;
/// The legacy default stream's name (`hooks::stream_key`), out of the range of the runtime's
/// stream ids (a counter from zero).
pub const LEGACY_STREAM: StreamKey = StreamKey::MAX - 1;

impl FreeKind {
    /// The code the trace records.
    pub fn code(self) -> u16 {
        match self {
            FreeKind::Sync => 0,
            FreeKind::Async { blocking: true, .. } => 1,
            FreeKind::Async {
                blocking: false, ..
            } => 2,
        }
    }

    /// The kind a trace record's code gives, on stream `stream` (a replay's key for the trace's
    /// stream number) when it was asynchronous.
    pub fn from_code(code: u16, stream: StreamKey) -> FreeKind {
        match code {
            1 => FreeKind::Async {
                blocking: true,
                stream,
            },
            2 => FreeKind::Async {
                blocking: false,
                stream,
            },
            _ => FreeKind::Sync,
        }
    }
}

/// What happened to a pointer handed to `free`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeOutcome {
    /// A live block of ours: back in the pool.
    Freed,
    /// Inside pool memory but not a live block (double free, interior pointer): refused.
    Invalid,
    /// Not pool memory at all: the runtime should handle it.
    NotOurs,
}

/// Settings the pool is built with (from `Config`).
#[derive(Clone)]
pub struct Settings {
    pub reuse: ReuseMode,
    pub threshold: DeviceBytes,
    /// The most bytes the pool reserves on each device (`GPUPOOL_LIMIT`).
    pub limit: DeviceBytes,
    pub policy: Policy,
    /// Where the allocation trace goes, when there is one.
    pub trace: Option<Arc<dyn TraceSink>>,
    /// Bytes of free blocks each thread may keep in its own cache once two threads allocate on a
    /// device (`tcache.rs`); 0 turns thread caches off.
    pub thread_cache: u64,
    /// In `strict` and `barrier` mode, thread caches start only once allocating threads compete
    /// for the device's lock: it went from one to another (or an allocation found it taken) this
    /// many times within `CONTENTION_WINDOW` allocations (`tcache::CONTENTION`), or they waited
    /// for it as `tcache::CONTENTION_WAIT_NS` says. Threads that take turns by phases gain
    /// nothing from caches there. 0: at once.
    pub cache_contention: u64,
}

pub struct Pool<B: Backend> {
    /// Tells this pool's thread caches from another pool's.
    id: u64,
    backend: B,
    settings: Settings,
    devices: Vec<OnceLock<DeviceSlot>>,
    /// The program created a non-blocking stream: barriers no longer cover all its work.
    nonblocking_seen: AtomicBool,
    /// Runtime override of the threshold (bytes), `u64::MAX - 1` meaning "not set".
    threshold_override: AtomicU64,
    /// Time zero of the trace.
    start: Instant,
}

const NO_OVERRIDE: u64 = u64::MAX - 1;

impl<B: Backend> Pool<B> {
    pub fn new(backend: B, settings: Settings) -> Self {
        Pool {
            id: tcache::new_pool_id(),
            backend,
            settings,
            devices: (0..MAX_DEVICES).map(|_| OnceLock::new()).collect(),
            nonblocking_seen: AtomicBool::new(false),
            threshold_override: AtomicU64::new(NO_OVERRIDE),
            start: Instant::now(),
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    fn slot(&self, device: u32) -> Option<&DeviceSlot> {
        let cell = self.devices.get(device as usize)?;
        Some(cell.get_or_init(|| {
            let threshold = self.initial_threshold(device);
            let mut pool = DevicePool::new(device, threshold);
            pool.stream_reuse = self.settings.reuse == ReuseMode::Relaxed;
            if let Some(sink) = &self.settings.trace {
                let buf = trace::TraceBuf::new(Arc::clone(sink), self.start, device);
                pool.set_trace(buf, &self.settings.policy, reuse_code(self.settings.reuse));
                if self.nonblocking_seen.load(Ordering::Relaxed) {
                    pool.note_nonblocking_stream();
                }
            }
            let limit = self.resolve(self.settings.limit, device);
            if limit != u64::MAX {
                pool.set_limit(limit);
            }
            let caches = Arc::new(tcache::Registry::default());
            pool.set_lenders(Arc::clone(&caches) as Arc<dyn device::Lenders>);
            DeviceSlot {
                pool: Mutex::new(pool),
                seqs: Seqs::default(),
                flags: tcache::Flags::default(),
                caches,
                backend_ns: AtomicU64::new(0),
            }
        }))
    }

    /// The threshold `device` starts with: the run-time override, or the configured one.
    fn initial_threshold(&self, device: u32) -> u64 {
        match self.threshold_override.load(Ordering::Relaxed) {
            NO_OVERRIDE => self.resolve(self.settings.threshold, device),
            // `set_threshold(u64::MAX)` (keep everything) is stored just below the sentinel.
            t if t >= NO_OVERRIDE - 1 => u64::MAX,
            t => t,
        }
    }

    /// `amount` in bytes on `device` (a fraction asks the driver for the device's size; no
    /// answer, no bound).
    fn resolve(&self, amount: DeviceBytes, device: u32) -> u64 {
        match amount {
            DeviceBytes::Fraction(_) => match self.backend.memory_info(device) {
                Ok((_, total)) => amount.resolve(total),
                Err(_) => u64::MAX,
            },
            a => a.resolve(0),
        }
    }

    /// The most bytes the pool reserves on `device` (`u64::MAX`: no limit).
    pub fn limit(&self, device: u32) -> u64 {
        match self.existing(device) {
            Some(slot) => Self::lock(slot).limit,
            None => self.resolve(self.settings.limit, device),
        }
    }

    /// What `cudaMemGetInfo` tells the program of `device`, from the driver's `free` and
    /// `total`: the memory it could get, as without the pool. Whole free segments count as free
    /// (the pool gives them back before it reports out-of-memory), so the thread caches first
    /// return their free blocks; free pieces of segments that hold live blocks do not. Under a
    /// limit the device looks the limit's size.
    pub fn memory_for_program(&self, device: u32, free: u64, total: u64) -> (u64, u64) {
        let (reserved, idle, limit) = match self.existing(device) {
            Some(slot) => {
                let mut p = Self::lock(slot);
                slot.caches.sweep_orphans(&mut p, &slot.seqs);
                slot.caches.reclaim(&mut p, &slot.seqs);
                (p.stats.reserved.current, p.idle_bytes(), p.limit)
            }
            None => (0, 0, self.settings.limit.resolve(total)),
        };
        program_memory(free, total, reserved, idle, limit)
    }

    fn existing(&self, device: u32) -> Option<&DeviceSlot> {
        self.devices.get(device as usize)?.get()
    }

    /// The lock for reports. One asked for by the program waits (another thread may hold it
    /// for a fence as long as the GPU's work); one at exit or on a signal, when another thread
    /// may be stopped inside the pool, gives up after a short wait rather than hang.
    fn lock_for_report(
        slot: &DeviceSlot,
        patience: Patience,
    ) -> Option<MutexGuard<'_, DevicePool>> {
        match patience {
            Patience::Wait => Some(Self::lock(slot)),
            Patience::Brief => slot
                .pool
                .try_lock_for(std::time::Duration::from_millis(200)),
        }
    }

    #[inline(always)]
    fn lock(slot: &DeviceSlot) -> MutexGuard<'_, DevicePool> {
        // No poisoning: a panic while the lock is held is caught at the FFI boundary, and the
        // pool's state is structurally valid between any two of its steps.
        slot.pool.lock()
    }

    /// `lock` for an allocation: once a second thread allocated here, it counts how allocating
    /// threads compete for the lock (`Settings::cache_contention`; consulted only while thread
    /// caches are off); one thread pays a load.
    #[inline(always)]
    fn lock_to_allocate(slot: &DeviceSlot) -> MutexGuard<'_, DevicePool> {
        match slot.pool.try_lock() {
            Some(mut p) => {
                if slot.flags.multi() {
                    p.contention
                        .took(None, slot.backend_ns.load(Ordering::Relaxed));
                }
                p
            }
            None => Self::lock_contended(slot),
        }
    }

    /// `lock_to_allocate` when the lock was found taken: wait, and count how long, less the time
    /// the holder spent in the backend meanwhile (`Timed`).
    #[cold]
    #[inline(never)]
    fn lock_contended(slot: &DeviceSlot) -> MutexGuard<'_, DevicePool> {
        let in_backend = slot.backend_ns.load(Ordering::Relaxed);
        let t = Instant::now();
        let mut p = slot.pool.lock();
        let waited = t.elapsed().as_nanos() as u64;
        if slot.flags.multi() && !slot.flags.enabled.load(Ordering::Relaxed) {
            // All of a backend call that ended during the wait is left out, also the part
            // before this thread came: a little waiting may go uncounted, never a fence.
            let now_in_backend = slot.backend_ns.load(Ordering::Relaxed);
            let waited = waited.saturating_sub(now_in_backend - in_backend);
            p.contention.took(Some(waited), now_in_backend);
        }
        p
    }

    /// The backend for `slot`'s pool under its lock.
    fn timed<'a>(&'a self, slot: &'a DeviceSlot) -> Timed<'a, B> {
        Timed {
            inner: &self.backend,
            ns: &slot.backend_ns,
        }
    }

    /// Whether the pool serves `device` (its ordinal is within range).
    pub fn serves(&self, device: u32) -> bool {
        (device as usize) < MAX_DEVICES
    }

    /// Allocate `size` bytes on `device`, the calling thread's current device.
    pub fn alloc(&self, device: u32, size: u64) -> Result<Addr, CudaError> {
        self.alloc_on(device, size, None)
    }

    /// Entries in `device`'s fence and barrier queues (tests).
    #[cfg(test)]
    pub fn queue_lens(&self, device: u32) -> (usize, usize) {
        self.existing(device)
            .map_or((0, 0), |slot| Self::lock(slot).queue_lens())
    }

    /// Whether frees and allocations should name their streams (`StreamKey`): for stream-ordered
    /// reuse (`relaxed`), or for the trace, so that replays in `relaxed` mode can reuse so too.
    pub fn names_streams(&self) -> bool {
        self.settings.reuse == ReuseMode::Relaxed || self.settings.trace.is_some()
    }

    /// Whether a free in stream order needs to say if its stream is blocking: not in `strict`
    /// mode, where every such free waits for a fence, unless a trace records it (a replay in
    /// another mode reads it).
    pub fn tells_blocking(&self) -> bool {
        self.settings.reuse != ReuseMode::Strict || self.settings.trace.is_some()
    }

    /// `alloc` for use on `stream` when there is one: in `relaxed` mode a block freed on that
    /// stream serves it first, before a barrier or fence (`DevicePool::alloc_on`); such requests
    /// go to the device, not to a thread cache (whose blocks are not held by stream).
    #[inline(always)]
    pub fn alloc_on(
        &self,
        device: u32,
        size: u64,
        stream: Option<StreamKey>,
    ) -> Result<Addr, CudaError> {
        let slot = self.slot(device).ok_or(CudaError::INVALID_VALUE)?;
        let held_by_stream = stream.is_some() && self.settings.reuse == ReuseMode::Relaxed;
        if !held_by_stream && slot.flags.enabled.load(Ordering::Relaxed) {
            if let Some(r) = self.alloc_cached(slot, device, size) {
                return r;
            }
        }
        let mut p = Self::lock_to_allocate(slot);
        if slot.flags.any.load(Ordering::Relaxed) {
            slot.caches.sweep_orphans(&mut p, &slot.seqs);
        }
        let r = p.alloc_on(
            size,
            stream,
            &self.timed(slot),
            &slot.seqs,
            &self.settings.policy,
        );
        // Which thread allocates is sampled (every allocation at first, then one in 64): a
        // second thread that allocates often is seen soon, and one thread pays almost nothing.
        p.lock_allocs += 1;
        if (p.lock_allocs <= 1024 || p.lock_allocs % 64 == 0)
            && (slot.flags.second_thread_arrived() || self.caches_due(slot, &p))
        {
            self.update_caches(slot, &mut p);
        }
        // Contention is a rate: the count starts over every 65 536 allocations under the lock, so
        // threads that take turns by phases never start caches in a long run.
        if p.lock_allocs % CONTENTION_WINDOW == 0 {
            p.contention.restart();
        }
        r
    }

    /// Thread caches are off on `slot`'s device only for want of contention, which has come.
    fn caches_due(&self, slot: &DeviceSlot, p: &DevicePool) -> bool {
        slot.flags.multi()
            && !slot.flags.enabled.load(Ordering::Relaxed)
            && self.settings.reuse != ReuseMode::Relaxed
            && p.contention.reached(
                self.settings.cache_contention,
                slot.backend_ns.load(Ordering::Relaxed),
            )
    }

    /// Whether thread caches may take new blocks on this device, and if not, take back what
    /// they hold. Under the device lock.
    fn update_caches(&self, slot: &DeviceSlot, p: &mut DevicePool) {
        let on = slot.flags.multi()
            && (self.settings.reuse == ReuseMode::Relaxed
                || slot.flags.enabled.load(Ordering::Relaxed)
                || p.contention.reached(
                    self.settings.cache_contention,
                    slot.backend_ns.load(Ordering::Relaxed),
                ))
            && self.settings.thread_cache > 0
            && self.settings.trace.is_none()
            && p.threshold == u64::MAX;
        slot.flags.enabled.store(on, Ordering::Relaxed);
        if !on {
            slot.caches.reclaim(p, &slot.seqs);
        }
    }

    /// A small allocation through the calling thread's cache: `None` when the request is not
    /// for it (too large) or the thread has none (it is exiting).
    fn alloc_cached(
        &self,
        slot: &DeviceSlot,
        device: u32,
        size: u64,
    ) -> Option<Result<Addr, CudaError>> {
        let rounded = size::round_request(size).filter(|&r| r <= tcache::LIMIT)?;
        slot.caches
            .with_mine(&slot.flags, self.id, device, true, |c| {
                let mut st = c.state.lock();
                if let Some(addr) = st.take_ready(rounded, size) {
                    return Ok(addr);
                }
                // Blocks this thread freed may have become reusable since (a fence or barrier),
                // or this thread holds its share of the fence budget waiting: it fences itself,
                // without the device's lock (and without its cache's: the device may need it
                // meanwhile).
                let mut covered = st.promote(&slot.seqs);
                // Enough blocks wait for a barrier, first in line (behind one that waits for a
                // fence, a barrier would make none reusable): a barrier costs no host wait, so
                // the thread takes one (`tcache::BARRIER_BATCH`).
                if !covered
                    && st.front_waits_for() == Some(Need::Barrier)
                    && st.waiting_bytes - st.waiting_fence_bytes
                        >= (rounded * tcache::BARRIER_BATCH).max(size::SMALL_SEGMENT)
                {
                    (st, covered) = self.sync_for_cache(slot, device, c, st, Need::Barrier);
                }
                let own = st.waiting_fence_bytes;
                if !covered && own > 0 && own >= self.fence_share(slot) {
                    (st, covered) = self.sync_for_cache(slot, device, c, st, Need::Fence);
                }
                if covered {
                    c.publish(&st);
                    // What became reusable counts against what the cache keeps (found in
                    // review: a fence could leave a cache holding any amount).
                    let mut spilled = Vec::new();
                    let keep = self.cache_keep(slot);
                    if st.ready_bytes > keep {
                        st.spill_ready(keep, &mut spilled);
                    }
                    let hit = st.take_ready(rounded, size);
                    if !spilled.is_empty() || hit.is_some() {
                        let gen = st.generation;
                        st.send(&spilled);
                        drop(st);
                        if !spilled.is_empty() {
                            Self::give_back(slot, c, gen, &spilled);
                        }
                        if let Some(addr) = hit {
                            return Ok(addr);
                        }
                        st = c.state.lock();
                    }
                }
                // A miss: one trip to the device serves it and borrows a few ready blocks of
                // this size.
                let room = self.cache_keep(slot).saturating_sub(st.ready_bytes);
                drop(st);
                let extra = tcache::BATCH.min((room / rounded) as usize);
                let mut extras = tcache::Extras::default();
                let mut p = Self::lock(slot);
                slot.caches.sweep_orphans(&mut p, &slot.seqs);
                let r = p.alloc_lent(
                    size,
                    &self.timed(slot),
                    &slot.seqs,
                    &self.settings.policy,
                    extra,
                    &mut extras,
                );
                let (addr, idx, block) = r?;
                // The cache's lock before the device's goes (lock order: device, then cache):
                // a report, which reads both, never finds the blocks lent and nowhere else
                // (found in review), and no reset comes between.
                let mut st = c.state.lock();
                if st.generation != p.generation {
                    st.clear(p.generation);
                }
                drop(p);
                st.hand_out(addr, idx, block, size);
                for (a, i) in extras.iter() {
                    // Extras come from the exact-size bin of the block served.
                    st.push_ready(a, i, block);
                }
                Ok(addr)
            })
    }

    /// Give a pointer back; `current` is the calling thread's current device, where the block
    /// is looked for first, and the device whose stream a free in stream order names: a block
    /// of another device (or of any device, when `current` is unknown) then waits for a fence.
    /// Frees of pointers the pool does not own are reported, not handled.
    pub fn free(&self, addr: Addr, kind: FreeKind, current: Option<u32>) -> FreeOutcome {
        let need = self.need_for(kind);
        if let Some(d) = current {
            if let Some(slot) = self.existing(d) {
                if slot.flags.any.load(Ordering::Relaxed) {
                    if self.free_cached(slot, d, addr, need) || self.free_in(slot, addr, kind, need)
                    {
                        return FreeOutcome::Freed;
                    }
                } else if Self::lock(slot).free(addr, kind, need, || slot.seqs.stamp_under_lock()) {
                    // The hit path: no thread caches on this device.
                    return FreeOutcome::Freed;
                }
            }
        }
        self.free_elsewhere(addr, kind, need, current)
    }

    /// A free of a live block of `slot`'s device (after taking back exited threads' caches).
    fn free_in(&self, slot: &DeviceSlot, addr: Addr, kind: FreeKind, need: Need) -> bool {
        let mut p = Self::lock(slot);
        if slot.flags.any.load(Ordering::Relaxed) {
            slot.caches.sweep_orphans(&mut p, &slot.seqs);
        }
        p.free(addr, kind, need, || slot.seqs.stamp_under_lock())
    }

    /// `free` of a block not found on the current device: on the others, in any thread's cache,
    /// or not ours.
    #[inline(never)]
    fn free_elsewhere(
        &self,
        addr: Addr,
        kind: FreeKind,
        need: Need,
        current: Option<u32>,
    ) -> FreeOutcome {
        // A free in stream order names a stream of the current device (or of the device the
        // caller named): for a block of another device, its order says nothing that device's
        // barriers or stream-ordered reuse could rely on. Such a block waits for a fence.
        let (kind_there, need_there) = match kind {
            FreeKind::Async { .. } => {
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
                    slot.flags.any.load(Ordering::Relaxed)
                        && self.free_cached(slot, d, addr, need_there)
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
            Some(device) => {
                if let Some(slot) = self.existing(device) {
                    Self::lock(slot).stats.invalid_frees += 1;
                }
                FreeOutcome::Invalid
            }
            None => FreeOutcome::NotOurs,
        }
    }

    /// A free of a block the calling thread's cache handed out: kept there when reusable at
    /// once, else (and when the cache outgrows its bound) given back to the device in a batch.
    fn free_cached(&self, slot: &DeviceSlot, device: u32, addr: Addr, need: Need) -> bool {
        let bound = self.settings.thread_cache;
        let handled = slot
            .caches
            .with_mine(&slot.flags, self.id, device, false, |c| {
                let mut st = c.state.lock();
                let Some(o) = st.take_out(addr) else {
                    return false;
                };
                // Read under the cache's lock: a threshold set meanwhile reclaims after this.
                let enabled = slot.flags.enabled.load(Ordering::Relaxed);
                let mut held = Vec::new();
                // Stamped now, after the program's free: a fence or barrier that starts later
                // covers it (`Seqs::before_sync`).
                let stamp = match need {
                    Need::Nothing => 0,
                    _ => slot.seqs.cache_stamp(&st),
                };
                if !enabled || o.size > tcache::LIMIT || o.size > bound {
                    // Caches are off (everything goes back), or the block is larger than any
                    // request a cache serves (a large block the device did not split), or than
                    // the cache may hold.
                    held.push(tcache::Held {
                        idx: o.idx,
                        addr,
                        size: o.size,
                        need,
                        stamp,
                    });
                    if !enabled {
                        held.extend(st.spill_all());
                    }
                } else if need == Need::Nothing {
                    // Full: the sizes held most of make room (what is freed now is likelier to be
                    // asked for again than what waited longest).
                    // Down to half the bound, or lower when the block needs more room: the cache
                    // never holds more than its bound (found in review: a 4 MiB bound held 8).
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
                    Self::give_back(slot, c, gen, &held);
                }
                true
            });
        handled == Some(true)
    }

    /// The fence budget's share of one thread cache: once its blocks waiting for a fence reach
    /// it, the thread fences itself (the caches together then fence about as often as the
    /// device would).
    fn fence_share(&self, slot: &DeviceSlot) -> u64 {
        self.settings.policy.fence_bytes / slot.caches.count().max(1)
    }

    /// The reusable bytes a thread cache keeps: `Settings::thread_cache` in `relaxed` mode, where
    /// a free is reusable at once. Otherwise a thread reuses between two fences only what the
    /// last one made reusable, about its share of the budget, whose sizes follow its frees, not
    /// its next requests: twice the larger of the two, so that a size it frees less often than
    /// it asks for it does not send it to the device's lock (measured: 90-94% of allocations
    /// served by the caches at once the share, 97-98% at twice; BENCHMARKS.md).
    fn cache_keep(&self, slot: &DeviceSlot) -> u64 {
        let bound = self.settings.thread_cache;
        if self.settings.reuse == ReuseMode::Relaxed {
            bound
        } else {
            2 * bound.max(self.fence_share(slot).min(MAX_CACHE_SHARE))
        }
    }

    /// Whether the calling thread, whose cache holds its share of the fence budget waiting
    /// (`own` bytes), fences itself now: when the caches together hold the budget (the device's
    /// rule: each fence then covers about a budget, as the device's own do, however the
    /// threads' cycles fall). Not to be called with a cache's lock held (it takes the list's).
    fn fence_due(&self, slot: &DeviceSlot, own: u64) -> bool {
        let budget = self.settings.policy.fence_bytes;
        own >= budget || slot.caches.waiting_fence() >= budget
    }

    /// A fence or barrier (`need`) the calling thread takes for its cache `c`, whose lock `st`
    /// it releases meanwhile (the device may need it) and takes again; a fence only if still
    /// due (`fence_due`). Outside the device's lock: blocks freed into caches before it
    /// (every cache's) become reusable, and this cache's are promoted. Returns the lock and
    /// whether any block became reusable here. A failed fence or barrier leaves them waiting.
    fn sync_for_cache<'c>(
        &self,
        slot: &DeviceSlot,
        device: u32,
        c: &'c tcache::ThreadCache,
        st: spin::SpinGuard<'c, tcache::CacheState>,
        need: Need,
    ) -> (spin::SpinGuard<'c, tcache::CacheState>, bool) {
        let own = st.waiting_fence_bytes;
        drop(st);
        let synced = (need == Need::Barrier || self.fence_due(slot, own))
            .then(|| {
                let at = slot.seqs.before_sync();
                let t = std::time::Instant::now();
                let (r, done) = match need {
                    Need::Fence => (self.backend.fence(device), &slot.seqs.cache_fenced),
                    _ => (self.backend.barrier(device), &slot.seqs.cache_barriered),
                };
                r.ok()?;
                let ns = t.elapsed().as_nanos() as u64;
                // Caches only: the device, which takes a raised `fenced` or `barriered` for a
                // program synchronization (its summary counts those), keeps its own pending
                // blocks for its own fences and barriers.
                done.fetch_max(at.epoch, Ordering::SeqCst);
                Some(ns)
            })
            .flatten();
        let mut st = c.state.lock();
        let covered = synced.is_some_and(|ns| {
            st.counts.synced(need, ns);
            st.promote(&slot.seqs)
        });
        (st, covered)
    }

    /// Blocks cache `c` of generation `gen` sent back (`CacheState::send`) to `slot`'s device
    /// (dropped if the device was reset since: they went with it). Takes the device lock, then
    /// the cache's, to count them arrived; not to be called with a cache's lock held.
    fn give_back(slot: &DeviceSlot, c: &tcache::ThreadCache, gen: u64, held: &[tcache::Held]) {
        let mut p = Self::lock(slot);
        if gen == p.generation {
            tcache::give_back(&mut p, &slot.seqs, held);
        }
        c.state.lock().arrived(gen, held);
    }

    /// A free of a block some thread's cache handed out (another thread's, or one whose thread
    /// exited): straight back to its device, to wait for `need_on` that device.
    fn free_from_any_cache(&self, addr: Addr, need_on: impl Fn(u32) -> Need) -> bool {
        for d in 0..MAX_DEVICES as u32 {
            let need = need_on(d);
            let Some(slot) = self.existing(d) else {
                continue;
            };
            if !slot.flags.any.load(Ordering::Relaxed) {
                continue;
            }
            for c in slot.caches.caches() {
                let mut st = c.state.lock();
                let Some(o) = st.take_out(addr) else {
                    continue;
                };
                let gen = st.generation;
                // The device stamps it when it takes it back.
                let held = [tcache::Held {
                    idx: o.idx,
                    addr,
                    size: o.size,
                    need,
                    stamp: 0,
                }];
                st.send(&held);
                drop(st);
                Self::give_back(slot, &c, gen, &held);
                return true;
            }
        }
        false
    }

    fn need_for(&self, kind: FreeKind) -> Need {
        need_for(
            self.settings.reuse,
            kind,
            self.nonblocking_seen.load(Ordering::Relaxed),
        )
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
            if !slot.flags.any.load(Ordering::Relaxed) {
                return None;
            }
            slot.caches.caches().iter().find_map(|c| {
                let st = c.state.lock();
                let o = st.out.get(&addr)?;
                (st.generation == p.generation)
                    .then(|| p.lent_block(o.idx, o.requested))
                    .flatten()
                    .map(|b| (d, b))
            })
        })
    }

    /// The program created a non-blocking stream. The first time, every device's trace records
    /// it (a device made meanwhile may miss it: only a replay's fidelity depends on it).
    pub fn note_nonblocking_stream(&self) {
        if !self.nonblocking_seen.swap(true, Ordering::Relaxed) && self.settings.trace.is_some() {
            for d in 0..MAX_DEVICES as u32 {
                if let Some(slot) = self.existing(d) {
                    Self::lock(slot).note_nonblocking_stream();
                }
            }
        }
    }

    /// The current sequence number of `device`, read before a program synchronization starts.
    /// (The thread caches' epoch moves on only while caches exist: a kernel launch in `barrier`
    /// mode reads this too, and needs no shared write otherwise.)
    pub fn seq_before_sync(&self, device: u32) -> SyncSeq {
        match self.existing(device) {
            None => SyncSeq::default(),
            Some(s) if s.flags.any.load(Ordering::Acquire) => s.seqs.before_sync(),
            Some(s) => SyncSeq {
                freed: s.seqs.freed.load(Ordering::Acquire),
                epoch: 0,
            },
        }
    }

    /// The program's `cudaDeviceSynchronize` on `device` returned: every block freed before
    /// `at` is safe. Also a release point for the threshold.
    pub fn observe_fence(&self, device: u32, at: SyncSeq) {
        if let Some(slot) = self.existing(device) {
            slot.seqs.fenced_at(at);
            self.sync_point(device);
        }
    }

    /// The program put an action on `device`'s legacy stream after `at`.
    pub fn observe_barrier(&self, device: u32, at: SyncSeq) {
        if let Some(slot) = self.existing(device) {
            slot.seqs.barriered_at(at);
        }
    }

    /// A synchronization the program made: apply the release threshold.
    pub fn sync_point(&self, device: u32) {
        if let Some(slot) = self.existing(device) {
            let mut p = Self::lock(slot);
            slot.caches.sweep_orphans(&mut p, &slot.seqs);
            p.sync_point(&self.timed(slot), &slot.seqs);
        }
    }

    /// Release every whole free segment of `device`. Returns the bytes released.
    pub fn empty_cache(&self, device: u32) -> u64 {
        let Some(slot) = self.existing(device) else {
            return 0;
        };
        let mut p = Self::lock(slot);
        slot.caches.sweep_orphans(&mut p, &slot.seqs);
        slot.caches.reclaim(&mut p, &slot.seqs);
        p.empty_cache(&self.timed(slot), &slot.seqs)
    }

    /// Set the release threshold of every device, now and for devices not yet used.
    pub fn set_threshold(&self, bytes: u64) {
        self.threshold_override
            .store(bytes.min(NO_OVERRIDE - 1), Ordering::Relaxed);
        for d in 0..MAX_DEVICES as u32 {
            if let Some(slot) = self.existing(d) {
                let mut p = Self::lock(slot);
                p.set_threshold(bytes);
                self.update_caches(slot, &mut p);
            }
        }
    }

    /// Set the release threshold of `device` alone (its pool is made if it was not used yet).
    /// Returns false for a device the pool does not serve.
    pub fn set_device_threshold(&self, device: u32, bytes: u64) -> bool {
        match self.slot(device) {
            Some(slot) => {
                let mut p = Self::lock(slot);
                p.set_threshold(bytes);
                self.update_caches(slot, &mut p);
                true
            }
            None => false,
        }
    }

    /// The release threshold of `device`: its own, or the one it will start with.
    pub fn threshold(&self, device: u32) -> u64 {
        match self.existing(device) {
            Some(slot) => Self::lock(slot).threshold,
            None => self.initial_threshold(device),
        }
    }

    /// `cudaDeviceReset` on `device` succeeded: forget its memory (the driver freed it).
    pub fn forget_device(&self, device: u32) {
        let Some(slot) = self.existing(device) else {
            return;
        };
        Self::forget_locked(slot, &mut Self::lock(slot));
    }

    /// `forget_device`, under the device lock.
    fn forget_locked(slot: &DeviceSlot, p: &mut DevicePool) {
        // Settle the caches first, so that the device's totals account for their blocks.
        slot.caches.settle(p, &slot.seqs);
        p.forget_all();
        slot.caches.forget(p.generation);
    }

    /// A copy of `device`'s counters, with its cached and pending figures (waiting for the
    /// device's lock).
    pub fn device_stats(&self, device: u32) -> Option<DeviceSnapshot> {
        self.device_stats_with(device, Patience::Wait)
    }

    /// `device_stats`; with `Patience::Brief`, `None` also when the lock stays busy.
    pub fn device_stats_with(&self, device: u32, patience: Patience) -> Option<DeviceSnapshot> {
        let slot = self.existing(device)?;
        let p = Self::lock_for_report(slot, patience)?;
        let mut stats = p.stats.clone();
        let mut pending = p.pending_bytes();
        let mut largest_free = p.largest_free();
        for c in slot.caches.caches_for_report() {
            let Some(st) = c.state.try_lock_for(std::time::Duration::from_millis(200)) else {
                continue;
            };
            if st.generation == p.generation {
                tcache::merge_into(&mut stats, &st);
                pending += st.waiting_bytes + st.transit.waiting_bytes;
                // Found in review: free blocks in thread caches were left out, and a cache of
                // reusable 1 MB blocks read as 100% fragmented.
                largest_free = largest_free.max(st.largest_ready());
            } else {
                tcache::add_counts(&mut stats, &st.counts);
            }
        }
        Some(DeviceSnapshot {
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
        })
    }

    /// Devices the pool has been used on.
    pub fn used_devices(&self) -> Vec<u32> {
        (0..MAX_DEVICES as u32)
            .filter(|&d| self.existing(d).is_some())
            .collect()
    }

    /// Live blocks of `device` (none for a device not used; `None` when its lock stays busy,
    /// with `Patience::Brief`).
    pub fn live_blocks(&self, device: u32, patience: Patience) -> Option<Vec<LiveBlock>> {
        let Some(slot) = self.existing(device) else {
            return Some(Vec::new());
        };
        let p = Self::lock_for_report(slot, patience)?;
        let mut blocks = p.live_blocks();
        for c in slot.caches.caches_for_report() {
            let Some(st) = c.state.try_lock_for(std::time::Duration::from_millis(200)) else {
                continue;
            };
            if st.generation == p.generation {
                blocks.extend(
                    st.out
                        .values()
                        .filter_map(|o| p.lent_block(o.idx, o.requested)),
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
                .and_then(|slot| Self::lock_for_report(slot, Patience::Brief))
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

    fn check_with(&self, settled: bool) -> Result<(), String> {
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
}

#[cfg(test)]
mod tests;

/// `Pool::memory_for_program` on figures: the driver's `free` and `total`, the pool's
/// `reserved` bytes, `idle` of them in whole free segments, and its `limit`.
pub fn program_memory(free: u64, total: u64, reserved: u64, idle: u64, limit: u64) -> (u64, u64) {
    let free = free.saturating_add(idle).min(total);
    if limit == u64::MAX {
        return (free, total);
    }
    let within = limit.saturating_sub(reserved.saturating_sub(idle));
    let total = total.min(limit);
    (free.min(within).min(total), total)
}

/// What a free must wait for before its block is reused, by reuse mode and how it was freed.
pub fn need_for(reuse: ReuseMode, kind: FreeKind, nonblocking_seen: bool) -> Need {
    match (reuse, kind) {
        (ReuseMode::Strict, _) => Need::Fence,
        (
            _,
            FreeKind::Async {
                blocking: false, ..
            },
        ) => Need::Fence,
        (ReuseMode::Barrier, _) if nonblocking_seen => Need::Fence,
        (ReuseMode::Barrier, _) | (ReuseMode::Relaxed, FreeKind::Async { .. }) => Need::Barrier,
        (ReuseMode::Relaxed, FreeKind::Sync) => Need::Nothing,
    }
}

/// The trace's code for a reuse mode.
pub fn reuse_code(reuse: ReuseMode) -> u16 {
    match reuse {
        ReuseMode::Strict => 0,
        ReuseMode::Barrier => 1,
        ReuseMode::Relaxed => 2,
    }
}

pub fn reuse_from_code(code: u16) -> ReuseMode {
    match code {
        1 => ReuseMode::Barrier,
        2 => ReuseMode::Relaxed,
        _ => ReuseMode::Strict,
    }
}
