//! Unit tests of the pool algorithm against the model driver (`model_driver/`), one file per
//! job of the code; the helpers they share are here.

mod alloc_fit;
mod cache_sync;
mod expandable;
mod expandable_interplay;
mod expandable_refusals;
mod frees;
mod growth;
mod hazard_stress;
mod many_threads;
mod memory_view;
mod oom;
mod peers;
mod pending;
mod release;
mod slack;
mod small_range;
mod stream_hold;
mod thread_caches;
mod trace_replay;

use super::model_driver::{ModelDriver, GUARD_GAP};
use super::model_wrapper::ModelWrapper;
use super::*;
use std::collections::BTreeMap;
use std::sync::Mutex;

const MIB: u64 = 1 << 20;

/// A xorshift generator from `state` (not 0): the random traffic of the tests, the same on
/// every machine.
fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// Whether the shared helpers build pools with expandable segments
/// (`GPUPOOL_TEST_EXPANDABLE=1`), to run the whole suite with them on.
fn expandable_on() -> bool {
    std::env::var_os("GPUPOOL_TEST_EXPANDABLE").is_some_and(|v| v == "1")
}

/// A driver with `capacity` bytes per device, and a gap after each segment so that a block
/// running over its segment's end lands in no other; with virtual memory when
/// `expandable_on`.
fn model(capacity: u64) -> ModelDriver {
    model_of(capacity, expandable_on())
}

/// `model` without virtual memory, whatever `GPUPOOL_TEST_EXPANDABLE` says: a pool on it keeps
/// classic segments.
fn classic_model(capacity: u64) -> ModelDriver {
    model_of(capacity, false)
}

fn model_of(capacity: u64, vmm: bool) -> ModelDriver {
    let driver = ModelDriver::new()
        .with_capacity(capacity)
        .with_gap(GUARD_GAP);
    if vmm {
        driver.with_vmm()
    } else {
        driver
    }
}

/// A pool on `model(capacity)` with no limit, no split bound and a 64 MiB fence budget.
fn pool_with(reuse: ReuseMode, threshold: DeviceBytes, capacity: u64) -> Pool<ModelDriver> {
    pool_of(expandable_on(), reuse, threshold, capacity)
}

/// `pool_with` with classic segments, whatever `GPUPOOL_TEST_EXPANDABLE` says: for the tests
/// of what classic segments look like (their sizes, their count, room to grow, outgrown ones).
fn classic_pool_with(reuse: ReuseMode, threshold: DeviceBytes, capacity: u64) -> Pool<ModelDriver> {
    pool_of(false, reuse, threshold, capacity)
}

fn pool_of(
    expandable: bool,
    reuse: ReuseMode,
    threshold: DeviceBytes,
    capacity: u64,
) -> Pool<ModelDriver> {
    Pool::new(
        model_of(capacity, expandable),
        Settings::for_tests(reuse, threshold, expandable),
    )
}

/// The pool's structure checks (`Pool::check`) and its driver saw no call a real one would
/// refuse (`ModelDriver::misuses`): how a test ends that is done with its pool.
fn assert_sound<B: Backend + AsRef<ModelDriver>>(p: &Pool<B>) {
    let misuses = p.backend().as_ref().misuses();
    assert!(misuses.is_empty(), "{misuses:?}");
    p.check().unwrap();
}

/// `pool_with` in relaxed mode, no threshold, 80 GiB per device.
fn relaxed() -> Pool<ModelDriver> {
    pool_with(ReuseMode::Relaxed, DeviceBytes::Unbounded, 80 << 30)
}

/// `relaxed` with classic segments (`classic_pool_with`).
fn classic_relaxed() -> Pool<ModelDriver> {
    classic_pool_with(ReuseMode::Relaxed, DeviceBytes::Unbounded, 80 << 30)
}

/// Device `d`'s counters.
fn stats<B: Backend>(p: &Pool<B>, d: u32) -> DeviceStats {
    p.device_stats(d).unwrap().stats
}

/// A `cudaFreeAsync` on `stream`.
fn on(stream: StreamKey, blocking: bool) -> FreeKind {
    FreeKind::Async { blocking, stream }
}

/// Barriers and fences the pool took so far.
fn syncs(p: &Pool<ModelDriver>) -> u64 {
    let counts = p.backend().counts();
    counts.barriers + counts.fences
}

/// Run `f` on a new thread and wait for it (each thread has its own caches).
fn on_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().unwrap())
}

/// A relaxed pool with thread caches of `thread_cache` bytes, on which a second thread has
/// allocated.
fn pool_cache(capacity: u64, thread_cache: u64) -> Pool<ModelDriver> {
    pool_cache_in(ReuseMode::Relaxed, capacity, thread_cache)
}

/// `pool_cache` in `reuse` mode (thread caches start with the second thread: no contention
/// needed, `cache_contention` 0).
fn pool_cache_in(reuse: ReuseMode, capacity: u64, thread_cache: u64) -> Pool<ModelDriver> {
    pool_cache_of(expandable_on(), reuse, capacity, thread_cache)
}

/// `pool_cache_in`, with expandable segments or without.
fn pool_cache_of(
    expandable: bool,
    reuse: ReuseMode,
    capacity: u64,
    thread_cache: u64,
) -> Pool<ModelDriver> {
    let mut s = pool_of(expandable, reuse, DeviceBytes::Unbounded, 1)
        .settings()
        .clone();
    s.thread_cache = thread_cache;
    let p = Pool::new(model_of(capacity, expandable), s);
    let a = p.alloc(0, 4096).unwrap();
    on_thread(|| {
        let b = p.alloc(0, 4096).unwrap();
        assert_eq!(p.free(b, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    });
    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    p
}

/// A relaxed pool on which a second thread has allocated, so thread caches are on.
fn shared_relaxed(capacity: u64) -> Pool<ModelDriver> {
    pool_cache(capacity, crate::config::DEFAULT_THREAD_CACHE)
}

/// `shared_relaxed` with classic segments, whatever `GPUPOOL_TEST_EXPANDABLE` says.
fn classic_shared_relaxed(capacity: u64) -> Pool<ModelDriver> {
    pool_cache_of(
        false,
        ReuseMode::Relaxed,
        capacity,
        crate::config::DEFAULT_THREAD_CACHE,
    )
}

/// Run `f` on the main thread while a second thread holds its own cache, filled by `other`
/// (which gets the pool), and waits; then let it go.
fn beside_a_second_cache<T>(
    p: &Pool<ModelDriver>,
    other: impl FnOnce(&Pool<ModelDriver>) + Send,
    f: impl FnOnce() -> T,
) -> T {
    let (ready, done) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
    std::thread::scope(|t| {
        t.spawn(|| {
            other(p);
            ready.wait();
            done.wait();
        });
        ready.wait();
        // The other thread waits until `f` returned or panicked.
        struct Release<'a>(&'a std::sync::Barrier);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.wait();
            }
        }
        let _release = Release(&done);
        f()
    })
}

/// Allocate `n` blocks of `size` on device 0 and free them all (into the thread's cache).
fn alloc_and_free(p: &Pool<ModelDriver>, n: usize, size: u64) {
    let v: Vec<Addr> = (0..n).map(|_| p.alloc(0, size).unwrap()).collect();
    for a in v {
        p.free(a, FreeKind::Sync, Some(0));
    }
}

/// Run `holder` on a thread that stays alive (its cache full) while `main` runs here.
fn while_a_thread_holds(p: &Pool<ModelDriver>, holder: impl FnOnce() + Send, main: impl FnOnce()) {
    std::thread::scope(|s| {
        // Made here so that a failing `main` drops the sender and the holder ends too.
        let (filled_tx, filled_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        s.spawn(move || {
            holder();
            filled_tx.send(()).unwrap();
            let _ = done_rx.recv();
        });
        filled_rx.recv().unwrap();
        main();
        p.check().unwrap();
        done_tx.send(()).unwrap();
    });
}

/// The model driver with work in flight: the ranges a "kernel" uses stay busy until a fence (or,
/// for barrier mode, a barrier) completes; a fence takes `fence_ms`.
struct Hazard {
    inner: ModelDriver,
    busy: Mutex<BTreeMap<Addr, u64>>,
    fence_ms: u64,
}

impl Default for Hazard {
    fn default() -> Self {
        Hazard {
            inner: model(80 << 30),
            busy: Mutex::new(BTreeMap::new()),
            fence_ms: 0,
        }
    }
}

impl AsRef<ModelDriver> for Hazard {
    fn as_ref(&self) -> &ModelDriver {
        &self.inner
    }
}

impl ModelWrapper for Hazard {
    fn fence(&self, d: u32) -> Result<(), CudaError> {
        std::thread::sleep(std::time::Duration::from_millis(self.fence_ms));
        self.busy.lock().unwrap().clear();
        self.inner.fence(d)
    }
    fn barrier(&self, d: u32) -> Result<(), CudaError> {
        self.busy.lock().unwrap().clear();
        self.inner.barrier(d)
    }
}
