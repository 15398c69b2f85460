//! The caching algorithm, in plain Rust with no FFI: one `DevicePool` per device behind its own
//! lock, each with the map of its live pointers. A free looks on the device it is told first
//! (where the block almost always is), then on the others, so it finds its block from any
//! thread with one lock and one lookup on the common path. Generic over
//! `Backend`, so it is unit-tested and replayed offline.
//!
//! `Pool` is defined here with its locks; each job is an `impl Pool` block of its own:
//! `hit.rs` (the hit path, a cached block in one step, and its budget in instructions),
//! `alloc.rs` (allocation, through the device or the thread's cache), `free.rs` (frees, on any
//! device, from any cache), `cache_policy.rs` (what thread caches keep and when they fence),
//! `sync.rs` (the program's synchronizations and streams), `control.rs` (threshold, limit,
//! empty-cache, reset) and `inspect.rs` (snapshots, live blocks, `cudaMemGetInfo`, the check).
//! The types they share: `free_kind.rs`, `reuse_clock.rs`, `hashers.rs`; the live map `live_map.rs`
//! and the pending queues `fifo.rs`. One device's pool is `device/`; thread caches are
//! `tcache/`. `model_driver/` is the `Backend` the tests, the replay and the policy comparison
//! run on; `model_wrapper.rs` lets a test backend change a few of its answers. `cancel.rs`
//! keeps a `pthread_cancel` from acting inside the pool's waits on a program's thread.

pub mod backend;
pub mod cancel;
pub mod device;
pub mod fifo;
pub mod free_lists;
mod held_sets;
pub mod live_map;
pub mod model_driver;
pub mod model_wrapper;
pub mod replay;
pub mod size;
pub mod spin;
pub mod stats;
pub mod tcache;
pub mod trace;

mod alloc;
mod cache_policy;
mod contention;
mod control;
mod free;
mod free_kind;
mod hashers;
mod hit;
mod inspect;
mod origins;
mod peers;
mod reset_freed;
mod reuse_clock;
mod sync;

use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

pub use backend::{Addr, Backend, CudaError, DeviceSet};
pub use device::{
    CacheFigures, DevicePool, Expandable, LiveBlock, MemorySample, OomEvent, Origin, Policy,
    Release, ReuseWait,
};
pub use stats::DeviceStats;
pub use trace::TraceSink;

pub use free_kind::{
    need_for, reuse_code, reuse_from_code, FreeKind, FreeOutcome, StreamKey, LEGACY_STREAM,
    NO_STREAM,
};
pub use hashers::{AddrHasher, IntHasher};
pub use inspect::{program_memory, DeviceSnapshot};
pub use peers::{IpcRefusal, IpcRefusals};
pub use reuse_clock::{ReuseClock, SyncSeq};

use crate::config::{DeviceBytes, ReuseMode};
use size::usable_limit;

/// Allocations under a device's lock over which `Settings::cache_contention` is counted (a
/// multiple of 64: `Pool::allocated_under_lock` samples its end).
const CONTENTION_WINDOW: u64 = 1 << 16;
const _: () = assert!(CONTENTION_WINDOW.is_multiple_of(64));

/// The most of a fence share a strict- or barrier-mode thread cache keeps reusable (twice this at
/// most): `GPUPOOL_THREAD_CACHE`'s own limit (a budget of `none` would be unbounded).
const MAX_CACHE_SHARE: u64 = 1 << 30;

/// Devices the pool serves; calls for higher ordinals pass through to the runtime.
pub const MAX_DEVICES: usize = 64;

/// Aligned to two cache lines (the adjacent-line prefetcher pairs them): threads on different
/// devices then never write to a line another device's lock or sequences live on (measured by
/// `crates/gpupool-lab/benches/threads.rs`: without it, two threads on two devices ran no faster than one).
#[repr(C, align(128))]
struct DeviceSlot {
    pool: Mutex<DevicePool>,
    clock: ReuseClock,
    flags: tcache::CacheSwitches,
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
    fn vmm_granularity(&self, device: u32) -> Option<u64> {
        self.inner.vmm_granularity(device)
    }
    fn vmm_reserve(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        self.time(|| self.inner.vmm_reserve(device, bytes))
    }
    fn vmm_map(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        self.time(|| self.inner.vmm_map(device, addr, bytes))
    }
    fn vmm_access(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        self.time(|| self.inner.vmm_access(device, addr, bytes))
    }
    fn vmm_unmap(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        self.time(|| self.inner.vmm_unmap(device, addr, bytes))
    }
    fn vmm_grant(
        &self,
        device: u32,
        addr: Addr,
        bytes: u64,
        peers: DeviceSet,
    ) -> Result<(), CudaError> {
        self.time(|| self.inner.vmm_grant(device, addr, bytes, peers))
    }
    fn vmm_free_reservation(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        self.time(|| self.inner.vmm_free_reservation(device, addr, bytes))
    }
    fn vmm_peers(&self, device: u32) -> Option<DeviceSet> {
        self.inner.vmm_peers(device)
    }
    fn vmm_stopped(&self, device: u32, why: CudaError) {
        self.inner.vmm_stopped(device, why)
    }
    fn vmm_peer_dropped(&self, device: u32, peer: u32, why: CudaError) {
        self.inner.vmm_peer_dropped(device, peer, why)
    }
}

/// How long a report waits for a device's lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockWait {
    /// As long as it takes (the program asked, from one of its threads).
    Unbounded,
    /// 200 ms (at exit, on a signal, on an out-of-memory: another thread may be stopped in the
    /// pool).
    Brief,
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
    /// device (`tcache/`); 0 turns thread caches off.
    pub thread_cache: u64,
    /// In `strict` and `barrier` mode, thread caches start only once allocating threads compete
    /// for the device's lock: it went from one to another (or an allocation found it taken) this
    /// many times within `CONTENTION_WINDOW` allocations (`tcache::CONTENTION`), or they waited
    /// for it as `tcache::CONTENTION_WAIT_NS` says. Threads that take turns by phases gain
    /// nothing from caches there. 0: at once.
    pub cache_contention: u64,
    /// Blocks come from expandable segments on CUDA virtual memory where the backend
    /// supports it (`GPUPOOL_EXPANDABLE`; `device/expandable.rs`). Traced as any other
    /// decision: the trace records the setting, the ranges and every granule mapped and
    /// unmapped (`trace.rs`), and a replay maps where the live run did.
    pub expandable: bool,
}

#[cfg(test)]
impl Settings {
    /// What the crate's unit tests start from: `reuse` mode and `threshold`, no limit, no split
    /// cap, a 64 MiB fence budget, no slack, no trace, thread caches of the default size that
    /// start with the second thread, and expandable segments where `expandable` says.
    pub(crate) fn for_tests(
        reuse: ReuseMode,
        threshold: DeviceBytes,
        expandable: bool,
    ) -> Settings {
        Settings {
            reuse,
            threshold,
            limit: DeviceBytes::Unbounded,
            policy: Policy {
                max_split_size: u64::MAX,
                fence_bytes: 64 << 20,
                mapped_slack_permille: None,
            },
            trace: None,
            thread_cache: crate::config::DEFAULT_THREAD_CACHE,
            cache_contention: 0,
            expandable,
        }
    }
}

pub struct Pool<B: Backend> {
    /// Tells this pool's thread caches from another pool's.
    id: u64,
    backend: B,
    settings: Settings,
    /// An array, not a vector: a device known to be below `MAX_DEVICES` indexes it unchecked.
    /// A slot, once made, stays until the pool is dropped.
    devices: Box<[OnceLock<DeviceSlot>; MAX_DEVICES]>,
    /// Each device's slot in `devices` once made (null before): the hit path's lookup, one load.
    made: [AtomicPtr<DeviceSlot>; MAX_DEVICES],
    /// The program made work no barrier orders (a non-blocking stream, a context of its own):
    /// barriers no longer cover all its work (`Pool::note_work_beyond_barriers`).
    beyond_barriers: AtomicBool,
    /// Runtime override of the threshold (bytes), `u64::MAX - 1` meaning "not set".
    threshold_override: AtomicU64,
    /// Per device, a threshold set at run time for it alone (encoded as `threshold_override`):
    /// what a device not used yet starts with, ahead of the override.
    device_threshold: [AtomicU64; MAX_DEVICES],
    /// The devices whose threshold the user set at run time (the C API): a threshold the
    /// program sets on CUDA's default memory pool no longer replaces it.
    user_threshold: AtomicU64,
    /// The devices whose own threshold (`device_threshold`) the program set on CUDA's default
    /// memory pool: it bounds the reserved bytes, as CUDA's does, not the cached ones.
    program_threshold: AtomicU64,
    /// Time zero of the trace.
    start: Instant,
    /// Per device, the devices given access to its mapped memory (`peers.rs`).
    peers: Vec<Arc<peers::PeerSet>>,
    /// IPC handles refused on the pool's memory (`peers.rs`).
    ipc: peers::IpcCounts,
    /// The devices in use: allocated on or made current (`peers.rs`).
    in_use: AtomicU64,
    /// Held while a device is noted in use.
    noting: Mutex<()>,
    /// The segments resets took back (`reset_freed.rs`).
    reset_freed: reset_freed::ResetFreed,
}

const NO_OVERRIDE: u64 = u64::MAX - 1;

impl<B: Backend> Pool<B> {
    pub fn new(backend: B, settings: Settings) -> Self {
        Pool {
            id: tcache::new_pool_id(),
            backend,
            settings,
            // Made on the heap: the slots are too large for a small thread's stack.
            devices: (0..MAX_DEVICES)
                .map(|_| OnceLock::new())
                .collect::<Box<[_]>>()
                .try_into()
                .ok()
                .expect("MAX_DEVICES slots"),
            made: [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_DEVICES],
            beyond_barriers: AtomicBool::new(false),
            threshold_override: AtomicU64::new(NO_OVERRIDE),
            device_threshold: [const { AtomicU64::new(NO_OVERRIDE) }; MAX_DEVICES],
            user_threshold: AtomicU64::new(0),
            program_threshold: AtomicU64::new(0),
            start: Instant::now(),
            peers: (0..MAX_DEVICES).map(|_| Arc::default()).collect(),
            ipc: peers::IpcCounts::default(),
            in_use: AtomicU64::new(0),
            noting: Mutex::new(()),
            reset_freed: reset_freed::ResetFreed::default(),
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
        // The device's first use asks CUDA about it (its context may be made then): on the
        // program's thread, with cancellation points inside.
        let slot = cell.get_or_init(|| cancel::uncancellable(|| self.make_slot(device)));
        let made = &self.made[device as usize];
        if made.load(Ordering::Relaxed).is_null() {
            made.store(
                slot as *const DeviceSlot as *mut DeviceSlot,
                Ordering::Release,
            );
            // A threshold set while the slot was being made, which found no slot to update.
            self.settle_threshold(device, slot);
        }
        // Also on a slot another thread is making: its grants are done once this returns (one
        // load once they are).
        self.note_device_in_use(device);
        Some(slot)
    }

    fn make_slot(&self, device: u32) -> DeviceSlot {
        let threshold = self.initial_threshold(device);
        let mut pool = DevicePool::new(device, threshold);
        pool.stream_reuse = self.settings.reuse == ReuseMode::Relaxed;
        if let Some(sink) = &self.settings.trace {
            let buf = trace::TraceBuf::new(Arc::clone(sink), self.start, device);
            pool.set_trace(buf, &self.settings.policy, reuse_code(self.settings.reuse));
            if self.beyond_barriers.load(Ordering::Relaxed) {
                pool.note_work_beyond_barriers();
            }
        }
        // After the trace's settings, so that a replay has the threshold's meaning too.
        if self.threshold_from_program(device) {
            pool.set_threshold(threshold, true);
        }
        if self.settings.expandable {
            pool.enable_expandable(&self.backend);
        }
        pool.share_peers(Arc::clone(&self.peers[device as usize]));
        let limit = self.resolve(self.settings.limit, device);
        if limit != u64::MAX {
            pool.set_limit(limit);
        }
        let caches = Arc::new(tcache::Registry::default());
        pool.set_borrowers(Arc::clone(&caches) as Arc<dyn device::Borrowers>);
        DeviceSlot {
            pool: Mutex::new(pool),
            clock: ReuseClock::default(),
            flags: tcache::CacheSwitches::default(),
            caches,
            backend_ns: AtomicU64::new(0),
        }
    }

    #[inline(always)]
    fn existing(&self, device: u32) -> Option<&DeviceSlot> {
        let made = self.made.get(device as usize)?.load(Ordering::Acquire);
        if made.is_null() {
            // Not made, or made by another thread that has not noted it yet.
            return self.devices[device as usize].get();
        }
        // SAFETY: `made` points at the slot inside `self.devices` (`slot`), a boxed array
        // that neither moves nor lets a made slot go while `self` lives.
        Some(unsafe { &*made })
    }

    /// The lock for reports. One asked for by the program waits (another thread may hold it
    /// for a fence as long as the GPU's work); one at exit or on a signal, when another thread
    /// may be stopped inside the pool, gives up after a short wait rather than hang.
    fn lock_for_report(
        slot: &DeviceSlot,
        patience: LockWait,
    ) -> Option<MutexGuard<'_, DevicePool>> {
        match patience {
            LockWait::Unbounded => Some(Self::lock(slot)),
            LockWait::Brief => slot
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
        if slot.flags.multi() && !slot.flags.enabled() {
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
}

#[cfg(test)]
mod tests;
