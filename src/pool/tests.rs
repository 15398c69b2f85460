//! Unit tests of the pool algorithm against a model backend.

use super::size::SMALL_SEGMENT;
use super::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;

/// A backend with a capacity per device, address ranges handed out in order, and counters.
#[derive(Default)]
pub struct Model {
    pub state: Mutex<ModelState>,
}

#[derive(Default)]
pub struct ModelState {
    pub capacity: u64,
    pub next: u64,
    pub live: BTreeMap<Addr, (u32, u64)>,
    pub mallocs: u64,
    pub frees: u64,
    pub fences: u64,
    pub barriers: u64,
    /// The next `alloc_segment` fails with this code.
    pub fail_next_malloc: Option<i32>,
}

impl Model {
    pub fn with_capacity(capacity: u64) -> Self {
        let m = Model::default();
        {
            let mut s = m.state.lock().unwrap();
            s.capacity = capacity;
            s.next = 1 << 40;
        }
        m
    }
    pub fn live_bytes(&self, device: u32) -> u64 {
        let s = self.state.lock().unwrap();
        s.live.values().filter(|v| v.0 == device).map(|v| v.1).sum()
    }
    pub fn get<T>(&self, f: impl FnOnce(&ModelState) -> T) -> T {
        f(&self.state.lock().unwrap())
    }
}

impl Backend for Model {
    fn alloc_segment(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        let mut s = self.state.lock().unwrap();
        s.mallocs += 1;
        if let Some(code) = s.fail_next_malloc.take() {
            return Err(CudaError(code));
        }
        let used: u64 = s.live.values().filter(|v| v.0 == device).map(|v| v.1).sum();
        if used.checked_add(bytes).is_none_or(|t| t > s.capacity) {
            return Err(CudaError::MEMORY_ALLOCATION);
        }
        let addr = s.next;
        s.next += bytes.div_ceil(2 << 20) * (2 << 20) + (2 << 20);
        s.live.insert(addr, (device, bytes));
        Ok(addr)
    }
    fn free_segment(&self, _device: u32, addr: Addr) -> Result<(), CudaError> {
        let mut s = self.state.lock().unwrap();
        s.frees += 1;
        s.live
            .remove(&addr)
            .map(|_| ())
            .ok_or(CudaError::INVALID_VALUE)
    }
    fn fence(&self, _device: u32) -> Result<(), CudaError> {
        self.state.lock().unwrap().fences += 1;
        Ok(())
    }
    fn barrier(&self, _device: u32) -> Result<(), CudaError> {
        self.state.lock().unwrap().barriers += 1;
        Ok(())
    }
    fn memory_info(&self, device: u32) -> Result<(u64, u64), CudaError> {
        let s = self.state.lock().unwrap();
        let used: u64 = s.live.values().filter(|v| v.0 == device).map(|v| v.1).sum();
        Ok((s.capacity - used, s.capacity))
    }
}

const MIB: u64 = 1 << 20;

fn pool_with(reuse: ReuseMode, threshold: DeviceBytes, capacity: u64) -> Pool<Model> {
    Pool::new(
        Model::with_capacity(capacity),
        Settings {
            reuse,
            threshold,
            limit: DeviceBytes::Unbounded,
            policy: Policy {
                max_split_size: u64::MAX,
                fence_bytes: 64 * MIB,
            },
            trace: None,
            thread_cache: crate::config::DEFAULT_THREAD_CACHE,
            cache_contention: 0,
        },
    )
}

fn relaxed() -> Pool<Model> {
    pool_with(ReuseMode::Relaxed, DeviceBytes::Unbounded, 80 << 30)
}

fn stats(p: &Pool<Model>, d: u32) -> DeviceStats {
    p.device_stats(d).unwrap().stats
}

#[test]
fn pointers_are_aligned_and_distinct() {
    let p = relaxed();
    let mut ptrs: Vec<Addr> = (1..200u64).map(|i| p.alloc(0, i * 37).unwrap()).collect();
    ptrs.sort();
    for w in ptrs.windows(2) {
        assert!(w[1] - w[0] >= 512);
    }
    assert!(ptrs.iter().all(|a| a % 512 == 0));
    p.check().unwrap();
}

#[test]
fn small_requests_share_a_segment_and_count_one_malloc() {
    let p = relaxed();
    let n = SMALL_SEGMENT / (512 * 1024);
    for _ in 0..n {
        p.alloc(0, 512 * 1024).unwrap();
    }
    let s = stats(&p, 0);
    assert_eq!(s.real_mallocs, 1);
    assert_eq!(s.reserved.current, SMALL_SEGMENT);
    assert_eq!(s.allocated.current, SMALL_SEGMENT);
    assert_eq!(s.hits, n - 1);
    assert_eq!(s.misses, 1);
    p.alloc(0, 1).unwrap();
    assert_eq!(stats(&p, 0).real_mallocs, 2);
}

#[test]
fn best_fit_picks_the_smallest_block_that_fits() {
    let p = relaxed();
    // Carve one 20 MiB medium segment into blocks of 2, 8 and 4 MiB with live separators.
    let a = p.alloc(0, 2 * MIB).unwrap();
    let _s1 = p.alloc(0, 3 * MIB / 2).unwrap();
    let b = p.alloc(0, 8 * MIB).unwrap();
    let _s2 = p.alloc(0, 3 * MIB / 2).unwrap();
    let c = p.alloc(0, 4 * MIB).unwrap();
    let _s3 = p.alloc(0, 3 * MIB / 2).unwrap();
    assert_eq!(stats(&p, 0).real_mallocs, 1);
    for x in [a, b, c] {
        assert_eq!(p.free(x, FreeKind::Sync, None), FreeOutcome::Freed);
    }
    // 3 MiB fits in b (8) and c (4); best fit is c.
    assert_eq!(p.alloc(0, 3 * MIB).unwrap(), c);
    assert_eq!(p.alloc(0, 2 * MIB).unwrap(), a);
    assert_eq!(p.alloc(0, 5 * MIB).unwrap(), b);
    assert_eq!(stats(&p, 0).real_mallocs, 1);
    p.check().unwrap();
}

#[test]
fn small_blocks_come_back_from_exact_size_bins_and_merge_when_needed() {
    let p = relaxed();
    // A whole small segment of 512 KiB blocks.
    let v: Vec<Addr> = (0..SMALL_SEGMENT / (512 << 10))
        .map(|_| p.alloc(0, 512 << 10).unwrap())
        .collect();
    for a in &v {
        p.free(*a, FreeKind::Sync, None);
    }
    p.check().unwrap();
    // The same size comes straight back, last freed first.
    let last = *v.last().unwrap();
    assert_eq!(p.alloc(0, 512 << 10).unwrap(), last);
    p.free(last, FreeKind::Sync, None);
    // A larger request finds no fit among the separate 512 KiB blocks until they merge.
    assert_eq!(p.alloc(0, MIB).unwrap(), v[0]);
    assert_eq!(stats(&p, 0).real_mallocs, 1);
    p.check().unwrap();
}

#[test]
fn large_blocks_split_only_with_a_big_remainder() {
    let p = relaxed();
    // 15 MiB gets a 16 MiB segment; the 1 MiB remainder is not split off.
    let a = p.alloc(0, 15 * MIB).unwrap();
    assert_eq!(stats(&p, 0).allocated.current, 16 * MIB);
    p.free(a, FreeKind::Sync, None);
    // A 12 MiB request splits the cached 16 MiB block (4 MiB remain).
    let b = p.alloc(0, 12 * MIB).unwrap();
    assert_eq!(b, a);
    assert_eq!(stats(&p, 0).allocated.current, 12 * MIB);
    assert_eq!(p.device_stats(0).unwrap().largest_free, 4 * MIB);
    assert_eq!(stats(&p, 0).real_mallocs, 1);
    p.check().unwrap();
}

#[test]
fn a_new_largest_request_gets_room_to_grow() {
    let p = relaxed();
    // 600 MiB, larger than any segment so far and above 512 MiB: a 768 MiB segment.
    let a = p.alloc(0, 600 * MIB).unwrap();
    assert_eq!(stats(&p, 0).reserved.current, 768 * MIB);
    p.free(a, FreeKind::Sync, None);
    // A larger one later fits in the room.
    let b = p.alloc(0, 700 * MIB).unwrap();
    assert_eq!(b, a);
    // Sizes up to the largest segment so far get the plain 2 MiB rounding.
    let c = p.alloc(0, 701 * MIB).unwrap();
    assert_eq!(stats(&p, 0).reserved.current, (768 + 702) * MIB);
    // A new record, but not the first above 512 MiB: its own size (nothing idle to release).
    let d = p.alloc(0, 900 * MIB).unwrap();
    assert_eq!(stats(&p, 0).reserved.current, (768 + 702 + 900) * MIB);
    assert_eq!(stats(&p, 0).outgrown_releases, 0);
    for x in [b, c, d] {
        p.free(x, FreeKind::Sync, None);
    }
    p.check().unwrap();
    // With a release threshold, segments are never rounded up for growth.
    let t = pool_with(ReuseMode::Relaxed, DeviceBytes::Bytes(1 << 40), 80 << 30);
    t.alloc(0, 600 * MIB).unwrap();
    assert_eq!(stats(&t, 0).reserved.current, 600 * MIB);
    // Nor with a maximum split size.
    let m = Pool::new(
        Model::with_capacity(80 << 30),
        Settings {
            reuse: ReuseMode::Relaxed,
            threshold: DeviceBytes::Unbounded,
            limit: DeviceBytes::Unbounded,
            policy: Policy {
                max_split_size: 256 * MIB,
                fence_bytes: 64 * MIB,
            },
            trace: None,
            thread_cache: crate::config::DEFAULT_THREAD_CACHE,
            cache_contention: 0,
        },
    );
    m.alloc(0, 600 * MIB).unwrap();
    assert_eq!(stats(&m, 0).reserved.current, 600 * MIB);
    // Near the capacity, a refused rounded segment is asked for again at the exact size
    // before anything cached is released.
    let q = pool_with(ReuseMode::Relaxed, DeviceBytes::Unbounded, 700 * MIB);
    let s = q.alloc(0, 10 * MIB).unwrap();
    q.free(s, FreeKind::Sync, None);
    q.alloc(0, 600 * MIB).unwrap();
    let st = stats(&q, 0);
    assert_eq!(st.reserved.current, 620 * MIB);
    assert_eq!((st.real_mallocs, st.oom_retries), (3, 0));
    q.check().unwrap();
}

#[test]
fn a_new_largest_request_releases_the_idle_segments_it_outgrew() {
    let p = relaxed();
    let a = p.alloc(0, 600 * MIB).unwrap(); // a record: a 768 MiB segment
    let k = p.alloc(0, 700 * MIB).unwrap(); // no record: 700 MiB
    let m = p.alloc(0, 200 * MIB).unwrap(); // below 512 MiB: 200 MiB
    p.free(a, FreeKind::Sync, None);
    p.free(m, FreeKind::Sync, None);
    assert_eq!(stats(&p, 0).reserved.current, (768 + 700 + 200) * MIB);
    // A new record: the idle 768 MiB segment, which cannot serve it, goes back first; the live
    // 700 MiB one and the idle 200 MiB one stay. Not the first above 512 MiB, the record gets its
    // own size, without room to grow.
    let b = p.alloc(0, 1000 * MIB).unwrap();
    let s = stats(&p, 0);
    assert_eq!(s.reserved.current, (700 + 200 + 1000) * MIB);
    // The peak is the new state, not the 2 692 MiB of keeping the old segment too.
    assert_eq!(s.reserved.peak, (700 + 200 + 1000) * MIB);
    assert_eq!(
        (s.outgrown_releases, s.outgrown_released_bytes),
        (1, 768 * MIB)
    );
    assert_eq!((s.real_mallocs, s.real_frees), (4, 1));
    assert_eq!(p.backend().live_bytes(0), s.reserved.current);
    // The smaller segment still serves what fits in it; a request that is no record (the
    // 700 MiB one freed, then 900 MiB) releases nothing.
    assert_eq!(p.alloc(0, 90 * MIB).unwrap(), m);
    p.free(k, FreeKind::Sync, None);
    p.free(b, FreeKind::Sync, None);
    p.alloc(0, 900 * MIB).unwrap();
    assert_eq!(stats(&p, 0).outgrown_releases, 1);
    p.check().unwrap();

    // Strict mode: the outgrown segment's block still waits for a fence (the budget is larger
    // than the block); the release (a real cudaFree, which waits for the device) takes it along
    // and the pending accounting stays exact.
    let mut q = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    q.settings.policy.fence_bytes = 4 << 30;
    let a = q.alloc(0, 600 * MIB).unwrap();
    q.free(a, FreeKind::Sync, None);
    assert_eq!(q.device_stats(0).unwrap().pending, 600 * MIB);
    q.alloc(0, 1000 * MIB).unwrap();
    let d = q.device_stats(0).unwrap();
    assert_eq!((d.pending, d.stats.reserved.current), (0, 1000 * MIB));
    assert_eq!(d.stats.outgrown_released_bytes, 768 * MIB);
    q.check().unwrap();

    // With a release threshold (which gives idle segments back itself) records neither round
    // up nor release.
    let t = pool_with(ReuseMode::Relaxed, DeviceBytes::Bytes(1 << 40), 80 << 30);
    let a = t.alloc(0, 600 * MIB).unwrap();
    t.free(a, FreeKind::Sync, None);
    t.alloc(0, 1000 * MIB).unwrap();
    let s = stats(&t, 0);
    assert_eq!((s.reserved.current, s.outgrown_releases), (1600 * MIB, 0));
}

#[test]
fn the_first_request_above_512_mib_releases_the_idle_segments_of_256_mib_it_outgrew() {
    // An inference server's logits: idle 300 MiB segments of earlier prompts cannot serve the
    // first buffer above 512 MiB; they go back before it gets its segment. Below 256 MiB they
    // stay (later requests are likelier to reuse them).
    let p = relaxed();
    let a = p.alloc(0, 300 * MIB).unwrap();
    let m = p.alloc(0, 200 * MIB).unwrap();
    p.free(a, FreeKind::Sync, None);
    p.free(m, FreeKind::Sync, None);
    p.alloc(0, 600 * MIB).unwrap(); // with room to grow: 768 MiB
    let s = stats(&p, 0);
    assert_eq!(
        (s.outgrown_releases, s.outgrown_released_bytes),
        (1, 300 * MIB)
    );
    assert_eq!(s.reserved.current, (200 + 768) * MIB);
    assert_eq!(
        s.reserved.peak,
        (200 + 768) * MIB,
        "never the old and the new at once"
    );
    p.check().unwrap();
}

#[test]
fn free_blocks_in_thread_caches_do_not_keep_an_outgrown_segment() {
    // Found in review: medium blocks carved from a big segment's room and cached by a thread
    // kept the segment busy, so the record behind them released nothing.
    let p = relaxed();
    on_thread(|| p.alloc(0, 4096).unwrap()); // a second thread: caches on
    let a = p.alloc(0, 600 * MIB).unwrap(); // 768 MiB segment, 168 MiB of room
    let x = p.alloc(0, 5 * MIB).unwrap(); // through this thread's cache, from the room
    let y = p.alloc(0, 5 * MIB).unwrap();
    p.free(x, FreeKind::Sync, Some(0));
    p.free(y, FreeKind::Sync, Some(0));
    p.free(a, FreeKind::Sync, Some(0));
    p.alloc(0, 1000 * MIB).unwrap();
    let s = stats(&p, 0);
    assert_eq!(s.outgrown_released_bytes, 768 * MIB);
    assert_eq!(
        s.reserved.current,
        SMALL_SEGMENT + 1000 * MIB,
        "a small segment and the record's"
    );
    p.check().unwrap();
}

#[test]
fn an_out_of_memory_report_counts_what_the_outgrown_release_gave_back() {
    // Found in review: the report said nothing was released before the failure.
    let p = pool_with(ReuseMode::Relaxed, DeviceBytes::Unbounded, 1800 * MIB);
    let a = p.alloc(0, 600 * MIB).unwrap(); // 768 MiB segment
    let _k = p.alloc(0, 700 * MIB).unwrap();
    p.free(a, FreeKind::Sync, None);
    // A record: the idle 768 MiB segment goes back, and 1 200 MiB still does not fit.
    assert!(p.alloc(0, 1200 * MIB).is_err());
    let d = p.device_stats(0).unwrap();
    assert_eq!(d.stats.outgrown_released_bytes, 768 * MIB);
    assert_eq!(
        d.last_oom.expect("an out-of-memory event").released,
        768 * MIB
    );
}

#[test]
fn the_first_large_request_leaves_thread_caches_alone() {
    // Found in review: with nothing of 512 MiB or more to outgrow, the first such request
    // still emptied every thread cache.
    let p = relaxed();
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.alloc(0, 4096).unwrap(); // the device sees a second thread: caches on
    let v: Vec<Addr> = (0..4).map(|_| p.alloc(0, 3 * MIB).unwrap()).collect();
    for a in v {
        p.free(a, FreeKind::Sync, Some(0));
    }
    let s = stats(&p, 0);
    assert_eq!((s.thread_cache_borrowed, s.thread_cache_returned), (4, 0));
    p.alloc(0, 600 * MIB).unwrap();
    // Half of what the cache holds, as before any growth; not all of it.
    assert_eq!(stats(&p, 0).thread_cache_returned, 2);
}

#[test]
fn a_block_a_barrier_made_reusable_serves_the_request_that_took_it() {
    // Found in review: the barrier the pool issued before growing put the block in its bin,
    // where the fit that followed did not look, and the pool grew beside it. The same with a
    // fence in strict mode (a budget the one block reaches).
    for (mode, budget) in [(ReuseMode::Barrier, 64 * MIB), (ReuseMode::Strict, MIB)] {
        let mut p = pool_with(mode, DeviceBytes::Unbounded, 80 << 30);
        p.settings.policy.fence_bytes = budget;
        // A whole small segment of 1 MiB blocks: the next one would need a new segment.
        let a = p.alloc(0, MIB).unwrap();
        let _rest: Vec<Addr> = (1..SMALL_SEGMENT / MIB)
            .map(|_| p.alloc(0, MIB).unwrap())
            .collect();
        p.free(a, FreeKind::Sync, None);
        assert_eq!(p.alloc(0, MIB).unwrap(), a, "{mode:?}");
        let syncs = p.backend().get(|s| (s.barriers, s.fences));
        assert_eq!(
            syncs,
            if mode == ReuseMode::Strict {
                (0, 1)
            } else {
                (1, 0)
            }
        );
        assert_eq!(stats(&p, 0).reserved.current, SMALL_SEGMENT, "{mode:?}");
        p.check().unwrap();
    }
}

#[test]
fn max_split_size_keeps_big_blocks_whole() {
    let mut p = relaxed();
    p.settings.policy.max_split_size = 32 * MIB;
    let big = p.alloc(0, 64 * MIB).unwrap();
    p.free(big, FreeKind::Sync, None);
    // A small-ish large request does not carve the 64 MiB block...
    let x = p.alloc(0, 4 * MIB).unwrap();
    assert_ne!(x, big);
    // ...but a request of similar size takes it whole.
    let y = p.alloc(0, 60 * MIB).unwrap();
    assert_eq!(y, big);
    assert_eq!(stats(&p, 0).allocated.current, 64 * MIB + 4 * MIB);
    p.check().unwrap();
}

#[test]
fn freed_neighbours_merge_back_into_one_block() {
    let p = relaxed();
    // Four 4 MiB blocks and a 4 MiB free tail in one 20 MiB segment.
    let v: Vec<Addr> = (0..4).map(|_| p.alloc(0, 4 * MIB).unwrap()).collect();
    let largest = |p: &Pool<Model>| p.device_stats(0).unwrap().largest_free;
    p.free(v[1], FreeKind::Sync, None);
    p.check().unwrap();
    assert_eq!(largest(&p), 4 * MIB);
    p.free(v[3], FreeKind::Sync, None);
    p.check().unwrap();
    assert_eq!(largest(&p), 8 * MIB);
    p.free(v[2], FreeKind::Sync, None);
    p.check().unwrap();
    assert_eq!(largest(&p), 16 * MIB);
    p.free(v[0], FreeKind::Sync, None);
    p.check().unwrap();
    assert_eq!(largest(&p), 20 * MIB);
    // The whole segment serves a 10 MiB request again from its start.
    assert_eq!(p.alloc(0, 10 * MIB).unwrap(), v[0]);
}

#[test]
fn threshold_releases_whole_free_segments_at_the_next_operation() {
    let p = pool_with(ReuseMode::Relaxed, DeviceBytes::Bytes(256 * MIB), 80 << 30);
    let v: Vec<Addr> = (0..16).map(|_| p.alloc(0, 64 * MIB).unwrap()).collect();
    assert_eq!(p.backend().live_bytes(0), 1024 * MIB);
    for a in v {
        p.free(a, FreeKind::Sync, None);
    }
    // Nothing released inside the frees themselves.
    assert_eq!(p.backend().live_bytes(0), 1024 * MIB);
    p.sync_point(0);
    assert_eq!(p.backend().live_bytes(0), 256 * MIB);
    let s = stats(&p, 0);
    assert_eq!(s.threshold_releases, 12);
    assert_eq!(s.threshold_released_bytes, 768 * MIB);
    assert_eq!(s.reserved.current, 256 * MIB);
    p.check().unwrap();
}

#[test]
fn without_threshold_everything_stays_cached() {
    let p = relaxed();
    let v: Vec<Addr> = (0..16).map(|_| p.alloc(0, 64 * MIB).unwrap()).collect();
    for a in v {
        p.free(a, FreeKind::Sync, None);
    }
    p.sync_point(0);
    assert_eq!(p.backend().live_bytes(0), 1024 * MIB);
    assert_eq!(p.empty_cache(0), 1024 * MIB);
    assert_eq!(p.backend().live_bytes(0), 0);
    assert_eq!(stats(&p, 0).empty_cache_releases, 16);
}

#[test]
fn percentage_threshold_uses_device_memory() {
    let p = pool_with(ReuseMode::Relaxed, DeviceBytes::Fraction(0.25), 1 << 30);
    p.alloc(0, 512).unwrap();
    assert_eq!(p.device_stats(0).unwrap().threshold, 256 * MIB);
}

#[test]
fn out_of_memory_releases_cache_and_retries() {
    // Strict mode: freed blocks wait for a fence, so recovery must fence, release, retry.
    let p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 64 * MIB);
    let v: Vec<Addr> = (0..56).map(|_| p.alloc(0, MIB).unwrap()).collect();
    for a in v {
        p.free(a, FreeKind::Sync, None);
    }
    assert_eq!(p.backend().live_bytes(0), 56 * MIB);
    let big = p.alloc(0, 40 * MIB).unwrap();
    assert!(big > 0);
    let s = stats(&p, 0);
    assert_eq!(s.oom_retries, 1);
    assert_eq!(s.oom_recovered, 1);
    assert_eq!(s.ooms, 0);
    assert!(s.fences >= 1);
    assert_eq!(s.oom_released_bytes, 56 * MIB);
    assert_eq!(p.backend().live_bytes(0), 40 * MIB);
    p.check().unwrap();
}

#[test]
fn out_of_memory_is_reported_and_the_pool_stays_usable() {
    let p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 64 * MIB);
    let a = p.alloc(0, 32 * MIB).unwrap();
    assert_eq!(p.alloc(0, 48 * MIB), Err(CudaError::MEMORY_ALLOCATION));
    assert_eq!(stats(&p, 0).ooms, 1);
    p.check().unwrap();
    p.free(a, FreeKind::Sync, None);
    assert!(p.alloc(0, 48 * MIB).is_ok());
    p.check().unwrap();
}

#[test]
fn exact_size_fallback_when_the_segment_would_not_fit() {
    // 3 MiB capacity: a 1.5 MiB request would take a 20 MiB medium segment; only the exact size
    // fits.
    let p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 3 * MIB);
    assert!(p.alloc(0, 3 * MIB / 2).is_ok());
    assert_eq!(stats(&p, 0).reserved.current, 3 * MIB / 2);
}

#[test]
fn other_errors_pass_through_without_retry() {
    let p = relaxed();
    p.backend().state.lock().unwrap().fail_next_malloc = Some(35);
    assert_eq!(p.alloc(0, 512), Err(CudaError(35)));
    assert_eq!(stats(&p, 0).oom_retries, 0);
    assert!(p.alloc(0, 512).is_ok());
    p.check().unwrap();
}

#[test]
fn sizes_near_the_maximum_are_out_of_memory() {
    let p = relaxed();
    for size in [u64::MAX, u64::MAX - 511, u64::MAX - (1 << 21), 1 << 62] {
        assert_eq!(p.alloc(0, size), Err(CudaError::MEMORY_ALLOCATION));
    }
    p.check().unwrap();
}

#[test]
fn strict_mode_never_reuses_before_a_fence() {
    let p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    let a = p.alloc(0, 4096).unwrap();
    p.free(a, FreeKind::Sync, None);
    let b = p.alloc(0, 4096).unwrap();
    assert_ne!(a, b, "reused a block no fence covered");
    assert_eq!(p.backend().get(|s| s.fences), 0);
    // The program synchronizes the device: everything freed before is safe.
    let seq = p.seq_before_sync(0);
    p.observe_fence(0, seq);
    let c = p.alloc(0, 4096).unwrap();
    assert_eq!(c, a);
    assert_eq!(stats(&p, 0).observed_fences, 1);
    p.check().unwrap();
}

#[test]
fn strict_mode_fences_once_pending_memory_reaches_the_budget() {
    let p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    // 64 MiB of frees wait for a fence, then the next miss takes one and reuses.
    let v: Vec<Addr> = (0..8).map(|_| p.alloc(0, 8 * MIB).unwrap()).collect();
    for a in &v {
        p.free(*a, FreeKind::Sync, None);
    }
    let before = stats(&p, 0).real_mallocs;
    let x = p.alloc(0, 8 * MIB).unwrap();
    assert!(v.contains(&x));
    assert_eq!(p.backend().get(|s| s.fences), 1);
    assert_eq!(stats(&p, 0).real_mallocs, before);
    p.check().unwrap();
}

#[test]
fn a_fence_does_not_cover_frees_made_after_it_started() {
    let p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    let a = p.alloc(0, 4096).unwrap();
    let seq = p.seq_before_sync(0);
    p.free(a, FreeKind::Sync, None);
    p.observe_fence(0, seq);
    assert_ne!(p.alloc(0, 4096).unwrap(), a);
}

#[test]
fn barrier_mode_issues_one_barrier_for_many_blocks() {
    let p = pool_with(ReuseMode::Barrier, DeviceBytes::Unbounded, 80 << 30);
    // 12 MiB blocks each have a segment of their own.
    let v: Vec<Addr> = (0..4).map(|_| p.alloc(0, 12 * MIB).unwrap()).collect();
    for a in &v {
        p.free(*a, FreeKind::Sync, None);
    }
    for _ in 0..4 {
        assert!(v.contains(&p.alloc(0, 12 * MIB).unwrap()));
    }
    assert_eq!(p.backend().get(|s| s.barriers), 1);
    assert_eq!(stats(&p, 0).real_mallocs, 4);
    // The program's own legacy-stream launch is a barrier too.
    let w = p.alloc(0, 12 * MIB).unwrap();
    let mut seq = p.seq_before_sync(0);
    seq.freed += 1;
    p.free(w, FreeKind::Sync, None);
    p.observe_barrier(0, seq);
    assert_eq!(p.alloc(0, 12 * MIB).unwrap(), w);
    assert_eq!(p.backend().get(|s| s.barriers), 1);
}

#[test]
fn barrier_mode_falls_back_to_fences_after_a_nonblocking_stream() {
    let p = pool_with(ReuseMode::Barrier, DeviceBytes::Unbounded, 80 << 30);
    p.note_nonblocking_stream();
    let a = p.alloc(0, 4096).unwrap();
    p.free(a, FreeKind::Sync, None);
    assert_ne!(p.alloc(0, 4096).unwrap(), a);
    assert_eq!(p.backend().get(|s| s.barriers), 0);
}

#[test]
fn relaxed_mode_reuses_at_once_but_not_async_frees_on_nonblocking_streams() {
    let p = relaxed();
    let a = p.alloc(0, 4096).unwrap();
    p.free(a, FreeKind::Sync, None);
    assert_eq!(p.alloc(0, 4096).unwrap(), a);
    p.free(
        a,
        FreeKind::Async {
            blocking: false,
            stream: 7,
        },
        None,
    );
    assert_ne!(p.alloc(0, 4096).unwrap(), a);
    p.check().unwrap();
}

fn on(stream: StreamKey, blocking: bool) -> FreeKind {
    FreeKind::Async { blocking, stream }
}

/// Barriers and fences the pool took so far.
fn syncs(p: &Pool<Model>) -> u64 {
    p.backend().get(|s| s.barriers + s.fences)
}

#[test]
fn relaxed_mode_reuses_a_block_at_once_on_the_stream_that_freed_it() {
    for blocking in [true, false] {
        // A pool of its own: no reusable block of the same size competes with the held one.
        let p = relaxed();
        let before = syncs(&p);
        let a = p.alloc_on(0, 4096, Some(5)).unwrap();
        p.free(a, on(5, blocking), Some(0));
        // The stream that freed it runs its next work after the work before the free.
        assert_eq!(p.alloc_on(0, 4096, Some(5)).unwrap(), a);
        assert_eq!(syncs(&p), before);
        // Another stream, or a plain cudaMalloc, gets it only after a barrier (or fence).
        p.free(a, on(5, blocking), Some(0));
        let other = p.alloc_on(0, 4096, Some(6)).unwrap();
        let plain = p.alloc(0, 4096).unwrap();
        assert!(other != a && plain != a || syncs(&p) > before);
        p.free(other, on(6, blocking), Some(0));
        p.free(plain, FreeKind::Sync, None);
        p.check().unwrap();
        assert!(stats(&p, 0).stream_hits >= 1);
    }
}

#[test]
fn frees_on_a_stream_hold_nothing_until_an_allocation_names_a_stream() {
    // A program that frees with cudaFreeAsync and allocates with cudaMalloc (the preload sees no
    // stream allocations): its blocks wait for their barrier as before, without taking their
    // free neighbours with them.
    let p = relaxed();
    let a = p.alloc(0, 4 * MIB).unwrap();
    p.free(a, on(5, true), Some(0));
    // The rest of the 20 MiB segment stays free for anyone: no barrier needed.
    assert_eq!(p.alloc(0, 12 * MIB).unwrap(), a + 4 * MIB);
    assert_eq!(syncs(&p), 0);
    // Once a request names a stream, a block freed on one is held for it.
    let b = p.alloc_on(0, 2 * MIB, Some(5)).unwrap();
    p.free(b, on(5, true), Some(0));
    assert_eq!(p.alloc_on(0, 2 * MIB, Some(5)).unwrap(), b);
    assert_eq!((syncs(&p), stats(&p, 0).stream_hits), (0, 1));
    p.check().unwrap();
}

#[test]
fn a_stream_served_by_its_own_frees_does_not_grow_the_pending_queues() {
    // Found in review: each block taken from the held ones (and each merge) left a queue entry
    // that only a barrier or fence clears, and such a stream never needs one: 100 000 pairs
    // left 300 002 entries.
    let p = relaxed();
    let a = p.alloc_on(0, 8 * MIB, Some(5)).unwrap();
    p.free(a, on(5, true), Some(0));
    for _ in 0..100_000 {
        let b = p.alloc_on(0, 2 * MIB, Some(5)).unwrap();
        p.free(b, on(5, true), Some(0));
    }
    let (fence, barrier) = p.queue_lens(0);
    assert_eq!((fence, syncs(&p)), (0, 0));
    assert!(barrier <= 2 * 4096, "{barrier} barrier queue entries");
    p.check().unwrap();
}

#[test]
fn stream_reuse_is_for_relaxed_mode_only() {
    for reuse in [ReuseMode::Strict, ReuseMode::Barrier] {
        let p = pool_with(reuse, DeviceBytes::Unbounded, 80 << 30);
        let a = p.alloc_on(0, 4096, Some(5)).unwrap();
        p.free(a, on(5, true), Some(0));
        assert_ne!(p.alloc_on(0, 4096, Some(5)).unwrap(), a, "{reuse:?}");
        assert_eq!(stats(&p, 0).stream_hits, 0);
    }
}

#[test]
fn a_split_stream_block_keeps_its_remainder_for_that_stream_until_covered() {
    let p = relaxed();
    // One 20 MiB segment, all of it freed on stream 5.
    let a = p.alloc_on(0, 20 * MIB, Some(5)).unwrap();
    p.free(a, on(5, true), Some(0));
    assert_eq!(p.alloc_on(0, 4 * MIB, Some(5)).unwrap(), a);
    // The other 16 MiB was freed with it: still the stream's alone ...
    assert_eq!(p.alloc_on(0, 16 * MIB, Some(5)).unwrap(), a + 4 * MIB);
    assert_eq!((stats(&p, 0).stream_hits, syncs(&p)), (2, 0));
    p.free(a + 4 * MIB, on(5, true), Some(0));
    assert_eq!(p.alloc_on(0, 8 * MIB, Some(5)).unwrap(), a + 4 * MIB);
    // ... so stream 6 gets the last 8 MiB only after a barrier.
    let other = p.alloc_on(0, 8 * MIB, Some(6)).unwrap();
    assert_eq!(other, a + 12 * MIB);
    assert_eq!(syncs(&p), 1);
    p.check().unwrap();
}

#[test]
fn blocks_freed_on_a_stream_merge_for_its_larger_requests() {
    let p = relaxed();
    let v: Vec<Addr> = (0..4)
        .map(|_| p.alloc_on(0, 4 * MIB, Some(5)).unwrap())
        .collect();
    assert!(v.windows(2).all(|w| w[1] == w[0] + 4 * MIB), "{v:x?}");
    // Freed out of order, with the free rest of the segment next to them.
    for i in [2, 0, 3, 1] {
        p.free(v[i], on(5, true), Some(0));
    }
    let mallocs = stats(&p, 0).real_mallocs;
    assert_eq!(p.alloc_on(0, 18 * MIB, Some(5)).unwrap(), v[0]);
    assert_eq!(stats(&p, 0).real_mallocs, mallocs);
    assert_eq!(p.backend().get(|s| s.barriers), 0);
    p.check().unwrap();
}

#[test]
fn a_small_block_freed_on_a_stream_leaves_its_free_neighbours_to_everyone() {
    // Small blocks are held alone: a stream that frees and allocates small tensors in turn
    // would otherwise merge the rest of the 2 MiB segment into each freed block and split it off
    // again on the next allocation (most of the pair's cost), while other streams would need a
    // barrier for memory nobody used.
    let p = relaxed();
    let a = p.alloc_on(0, 4096, Some(5)).unwrap();
    p.free(a, on(5, true), Some(0));
    let other = p.alloc_on(0, 64 << 10, Some(6)).unwrap();
    assert_eq!(other, a + 4096, "the free rest of the segment");
    assert_eq!(p.alloc_on(0, 4096, Some(5)).unwrap(), a);
    assert_eq!(
        (
            syncs(&p),
            stats(&p, 0).stream_hits,
            stats(&p, 0).real_mallocs
        ),
        (0, 1, 1)
    );
    p.check().unwrap();
}

#[test]
fn a_barrier_gives_stream_blocks_to_everyone() {
    let p = relaxed();
    let a = p.alloc_on(0, 12 * MIB, Some(5)).unwrap();
    p.free(a, on(5, true), Some(0));
    // Stream 6 needs 12 MiB: the pool's barrier covers the free rather than growing.
    assert_eq!(p.alloc_on(0, 12 * MIB, Some(6)).unwrap(), a);
    assert_eq!(p.backend().get(|s| s.barriers), 1);
    assert_eq!(stats(&p, 0).stream_hits, 0);
    p.free(a, on(6, true), Some(0));
    // Released with the rest of the cache (the held block goes with its segment).
    assert_eq!(p.empty_cache(0), 12 * MIB);
    p.check().unwrap();
}

/// A trace held in memory.
struct MemoryTrace(Mutex<Vec<u8>>);

impl TraceSink for MemoryTrace {
    fn write(&self, bytes: &[u8]) {
        self.0.lock().unwrap().extend_from_slice(bytes);
    }
}

impl MemoryTrace {
    /// The records written so far (after `Pool::flush_trace`).
    fn records(&self) -> Vec<trace::Record> {
        trace::parse(&self.0.lock().unwrap()).unwrap()
    }
}

/// A `relaxed` pool that traces into memory.
fn traced_relaxed() -> (Pool<Model>, Arc<MemoryTrace>) {
    let sink = Arc::new(MemoryTrace(Mutex::new(trace::MAGIC.to_vec())));
    let mut settings = relaxed().settings().clone();
    settings.trace = Some(Arc::clone(&sink) as Arc<dyn TraceSink>);
    (Pool::new(Model::with_capacity(80 << 30), settings), sink)
}

#[test]
fn a_trace_with_stream_ordered_reuse_replays_to_the_same_figures() {
    let (p, sink) = traced_relaxed();
    // Three streams and plain cudaMalloc/cudaFree; blocks freed mostly on their own stream.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut live: Vec<(Addr, Option<StreamKey>)> = Vec::new();
    for _ in 0..20_000 {
        let r = next();
        if live.len() > 40 || (!live.is_empty() && r % 2 == 0) {
            let (a, s) = live.swap_remove((r >> 8) as usize % live.len());
            let how = match (s, r >> 16 & 7) {
                (None, _) => FreeKind::Sync,
                (Some(s), 0) => on((s + 1) % 3, true),
                (Some(s), k) => on(s, k != 1),
            };
            assert_eq!(p.free(a, how, Some(0)), FreeOutcome::Freed);
        } else {
            let stream = (r >> 8) % 4;
            let stream = (stream < 3).then_some(stream);
            let size = [512, 4096, 300 << 10, 3 * MIB, 12 * MIB, 40 * MIB][(r >> 24) as usize % 6];
            live.push((p.alloc_on(0, size, stream).unwrap(), stream));
        }
    }
    p.check().unwrap();
    p.flush_trace();
    let live_stats = stats(&p, 0);
    assert!(live_stats.stream_hits > 1000, "{}", live_stats.stream_hits);
    let records = sink.records();
    let r = replay::replay(&records, &replay::Overrides::default());
    assert!(!r[0].diverged);
    let s = &r[0].stats;
    assert_eq!(
        (
            s.stream_hits,
            s.hits,
            s.real_mallocs,
            s.barriers,
            s.reserved.peak
        ),
        (
            live_stats.stream_hits,
            live_stats.hits,
            live_stats.real_mallocs,
            live_stats.barriers,
            live_stats.reserved.peak
        )
    );
}

/// A threshold set for one device (`gpupool_set_release_threshold(0, ...)`) is in the trace as
/// one set for every device is, so the replay releases where the live run did (found in review:
/// the replay kept the segment and peaked 40 MiB higher).
#[test]
fn a_per_device_threshold_is_traced_and_replayed() {
    let (p, sink) = traced_relaxed();
    assert!(p.set_device_threshold(0, 0));
    let a = p.alloc_on(0, 100 * MIB, None).unwrap();
    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    p.sync_point(0);
    let b = p.alloc_on(0, 60 * MIB, None).unwrap();
    let c = p.alloc_on(0, 60 * MIB, None).unwrap();
    p.check().unwrap();
    p.flush_trace();
    let live = stats(&p, 0);
    assert_eq!(
        live.reserved.peak,
        120 * MIB,
        "the 100 MiB segment went back"
    );
    let r = replay::replay(&sink.records(), &replay::Overrides::default());
    assert!(!r[0].diverged);
    assert_eq!(
        (
            r[0].stats.reserved.peak,
            r[0].stats.real_mallocs,
            r[0].stats.real_frees
        ),
        (live.reserved.peak, live.real_mallocs, live.real_frees)
    );
    for x in [b, c] {
        assert_eq!(p.free(x, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    }
}

/// Under `GPUPOOL_MAX_SPLIT_SIZE`, a request just below the cap gets a segment rounded up to
/// it: that block serves the same size again instead of a new segment each time (found in
/// review: 127.5 MiB under a 128 MiB cap took a new segment per cycle until out of memory).
#[test]
fn a_request_just_under_the_split_cap_reuses_its_own_segment() {
    for reuse in [ReuseMode::Strict, ReuseMode::Relaxed] {
        let mut s = pool_with(reuse, DeviceBytes::Unbounded, 1)
            .settings()
            .clone();
        s.policy.max_split_size = 128 * MIB;
        let p = Pool::new(Model::with_capacity(1 << 30), s);
        let req = 127 * MIB + MIB / 2;
        for _ in 0..12 {
            let a = p.alloc(0, req).unwrap();
            assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
            let at = p.seq_before_sync(0);
            p.observe_fence(0, at);
        }
        let st = stats(&p, 0);
        assert_eq!(
            (st.real_mallocs, st.reserved.peak, st.oom_retries),
            (1, 128 * MIB, 0),
            "{reuse:?}"
        );
        // The cap still keeps big blocks from smaller requests beyond their own rounding.
        let small = p.alloc(0, 100 * MIB).unwrap();
        assert_eq!(stats(&p, 0).real_mallocs, 2, "{reuse:?}");
        assert_eq!(p.free(small, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
        p.check().unwrap();
    }
}

/// A program that creates a non-blocking stream makes `barrier` mode fence (`need_for`): a
/// trace records it, so that a replay in `barrier` mode of a trace recorded in another mode
/// does what the live pool would have done (found in review: it took barriers throughout).
#[test]
fn a_barrier_replay_fences_once_the_trace_says_a_non_blocking_stream_was_made() {
    let run = |reuse: ReuseMode| {
        let sink = Arc::new(MemoryTrace(Mutex::new(trace::MAGIC.to_vec())));
        let mut settings = pool_with(reuse, DeviceBytes::Unbounded, 1)
            .settings()
            .clone();
        settings.trace = Some(Arc::clone(&sink) as Arc<dyn TraceSink>);
        let p = Pool::new(Model::with_capacity(80 << 30), settings);
        let churn = |rounds: usize| {
            for _ in 0..rounds {
                let blocks: Vec<Addr> = (0..8).map(|_| p.alloc(0, 4 * MIB).unwrap()).collect();
                for a in blocks {
                    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
                }
            }
        };
        churn(20);
        p.note_nonblocking_stream();
        churn(20);
        p.flush_trace();
        (stats(&p, 0), sink.records())
    };
    let (live, live_records) = run(ReuseMode::Barrier);
    assert!(live.barriers > 0 && live.fences > 0, "{live:?}");
    let marks = |records: &[trace::Record]| {
        records
            .iter()
            .filter(|r| r.kind == trace::Kind::NonBlockingStream)
            .count()
    };
    assert_eq!(marks(&live_records), 1);
    let (_, strict_records) = run(ReuseMode::Strict);
    assert_eq!(marks(&strict_records), 1);
    let barrier = replay::Overrides {
        reuse: Some(ReuseMode::Barrier),
        ..Default::default()
    };
    let r = &replay::replay(&strict_records, &barrier)[0].stats;
    assert_eq!(
        (r.fences, r.barriers, r.real_mallocs, r.reserved.peak),
        (
            live.fences,
            live.barriers,
            live.real_mallocs,
            live.reserved.peak
        )
    );
    // Without the record, the replay takes barriers only.
    let unmarked: Vec<trace::Record> = strict_records
        .into_iter()
        .filter(|r| r.kind != trace::Kind::NonBlockingStream)
        .collect();
    assert_eq!(replay::replay(&unmarked, &barrier)[0].stats.fences, 0);
}

/// The largest free block counts the reusable blocks thread caches hold (found in review: a
/// thread's cache of forty free 1 MB blocks read as 100% fragmentation).
#[test]
fn the_largest_free_block_counts_blocks_in_thread_caches() {
    let p = shared_relaxed(80 << 30);
    on_thread(|| {
        let blocks: Vec<Addr> = (0..40).map(|_| p.alloc(0, 1_000_000).unwrap()).collect();
        for a in blocks {
            assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
        }
    });
    let snap = p.device_stats(0).unwrap();
    assert!(snap.stats.thread_cache_borrowed > 0, "{:?}", snap.stats);
    assert_eq!(snap.largest_free, 1_000_448);
}

/// Reports read while threads allocate and free through their caches: the current values are
/// what the program holds at that moment, blocks on their way between a cache and the device
/// included (found in review: a live read counted them as the program's, 634 live blocks of
/// at most 256, in 6 reads of 40).
#[test]
fn reports_during_thread_cache_traffic_count_only_what_the_program_holds() {
    for reuse in [ReuseMode::Relaxed, ReuseMode::Strict] {
        reports_during_thread_cache_traffic(reuse);
    }
}

fn reports_during_thread_cache_traffic(reuse: ReuseMode) {
    let p = pool_cache_in(reuse, 80 << 30, 1 << 20);
    let stop = std::sync::atomic::AtomicBool::new(false);
    const THREADS: u64 = 4;
    const SLOTS: usize = 64;
    let largest = 512 + 9 * 100_000;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (p, stop) = (&p, &stop);
            s.spawn(move || {
                let mut rng = t + 11;
                let mut slots: Vec<Option<Addr>> = vec![None; SLOTS];
                while !stop.load(Ordering::Relaxed) {
                    rng = rng
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let i = (rng >> 33) as usize % SLOTS;
                    match slots[i].take() {
                        Some(a) => {
                            assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
                        }
                        None => {
                            let size = 512 + (rng >> 40) % 10 * 100_000;
                            slots[i] = Some(p.alloc(0, size).unwrap());
                        }
                    }
                }
                for a in slots.into_iter().flatten() {
                    p.free(a, FreeKind::Sync, Some(0));
                }
            });
        }
        // Stops the threads however this loop ends (a failed check included, or the scope
        // would wait for them forever).
        struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(&stop);
        let mut reads = 0;
        loop {
            let snap = p.device_stats(0).unwrap();
            // What waits for in-flight work is part of the cache, blocks on their way back
            // included.
            assert!(snap.pending <= snap.cached, "{reuse:?}: {snap:?}");
            let s = snap.stats;
            reads += 1;
            if s.allocs > 200_000 && reads > 1000 {
                break;
            }
            assert_eq!(s.allocs - s.frees, s.blocks.current, "{s:?}");
            assert!(s.blocks.current <= THREADS * SLOTS as u64, "{s:?}");
            assert!(
                s.requested.current <= THREADS * SLOTS as u64 * largest,
                "{s:?}"
            );
            assert!(s.requested.current <= s.allocated.current, "{s:?}");
        }
    });
    let s = stats(&p, 0);
    assert!(s.thread_cache_hits > 1000, "{s:?}");
    assert_eq!((s.blocks.current, s.requested.current), (0, 0), "{s:?}");
}

#[test]
fn invalid_frees_are_refused_and_leave_the_pool_intact() {
    let p = relaxed();
    let a = p.alloc(0, 4096).unwrap();
    let b = p.alloc(0, 4096).unwrap();
    assert_eq!(p.free(a + 512, FreeKind::Sync, None), FreeOutcome::Invalid);
    assert_eq!(p.free(a, FreeKind::Sync, None), FreeOutcome::Freed);
    assert_eq!(p.free(a, FreeKind::Sync, None), FreeOutcome::Invalid);
    assert_eq!(
        p.free(0xdead_0000, FreeKind::Sync, None),
        FreeOutcome::NotOurs
    );
    assert_eq!(stats(&p, 0).invalid_frees, 2);
    p.check().unwrap();
    assert_eq!(p.live_block(b).unwrap().1.size, 4096);
}

#[test]
fn blocks_are_freed_from_any_device() {
    let p = relaxed();
    let a = p.alloc(0, MIB).unwrap();
    let b = p.alloc(1, MIB).unwrap();
    assert_eq!(p.free(a, FreeKind::Sync, None), FreeOutcome::Freed);
    assert_eq!(p.free(b, FreeKind::Sync, None), FreeOutcome::Freed);
    assert_eq!(stats(&p, 0).frees, 1);
    assert_eq!(stats(&p, 1).frees, 1);
    assert_eq!(p.used_devices(), vec![0, 1]);
    assert!(p.alloc(MAX_DEVICES as u32, 512).is_err());
}

#[test]
fn device_reset_forgets_without_freeing() {
    let p = relaxed();
    let a = p.alloc(0, MIB).unwrap();
    let b = p.alloc(1, MIB).unwrap();
    p.forget_device(0);
    assert_eq!(p.backend().get(|s| s.frees), 0);
    assert_eq!(p.free(a, FreeKind::Sync, None), FreeOutcome::NotOurs);
    assert_eq!(p.free(b, FreeKind::Sync, None), FreeOutcome::Freed);
    let s = stats(&p, 0);
    assert_eq!(
        (s.reserved.current, s.allocated.current, s.resets),
        (0, 0, 1)
    );
    assert!(p.alloc(0, MIB).is_ok());
    p.check().unwrap();
}

#[test]
fn accounting_identities_hold_under_churn() {
    let p = pool_with(ReuseMode::Strict, DeviceBytes::Bytes(64 * MIB), 2 << 30);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut live: Vec<(Addr, u64)> = Vec::new();
    for step in 0..5000 {
        let r = next();
        if r % 100 < 60 || live.is_empty() {
            let size = match r % 7 {
                0 => next() % (64 * MIB),
                1..=3 => next() % (16 << 10) + 1,
                _ => next() % (4 * MIB) + 1,
            };
            if let Ok(a) = p.alloc(0, size) {
                assert!(
                    live.iter().all(|&(b, s)| a + size <= b || b + s <= a),
                    "step {step}: overlap"
                );
                live.push((a, size));
            }
        } else {
            let i = (next() % live.len() as u64) as usize;
            let (a, _) = live.swap_remove(i);
            assert_eq!(p.free(a, FreeKind::Sync, None), FreeOutcome::Freed);
        }
        if step % 500 == 0 {
            let seq = p.seq_before_sync(0);
            p.observe_fence(0, seq);
        }
        p.check().unwrap_or_else(|e| panic!("step {step}: {e}"));
        let snap = p.device_stats(0).unwrap();
        assert_eq!(
            snap.stats.allocated.current + snap.cached,
            snap.stats.reserved.current
        );
        assert_eq!(p.backend().live_bytes(0), snap.stats.reserved.current);
    }
}

#[test]
fn threads_share_a_pool_without_handing_out_a_block_twice() {
    let p = Arc::new(pool_with(
        ReuseMode::Relaxed,
        DeviceBytes::Unbounded,
        80 << 30,
    ));
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            let p = Arc::clone(&p);
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..2000u64 {
                    let size = ((i * 7919 + t * 104_729) % (2 * MIB)) + 1;
                    mine.push(p.alloc((t % 2) as u32, size).unwrap());
                    if i % 3 != 0 {
                        let a = mine.swap_remove((i as usize * 31) % mine.len());
                        assert_eq!(p.free(a, FreeKind::Sync, None), FreeOutcome::Freed);
                    }
                }
                mine
            })
        })
        .collect();
    let mut all: Vec<Addr> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "a block was handed out twice");
    p.check().unwrap();
}

#[test]
fn per_device_thresholds_and_keep_all_overrides() {
    let p = pool_with(ReuseMode::Relaxed, DeviceBytes::Bytes(8 * MIB), 1 << 30);
    assert_eq!(
        p.threshold(3),
        8 * MIB,
        "an unused device reports what it will start with"
    );
    assert!(p.set_device_threshold(1, 0));
    assert_eq!((p.threshold(0), p.threshold(1)), (8 * MIB, 0));
    assert!(!p.set_device_threshold(MAX_DEVICES as u32, 0));
    p.set_threshold(u64::MAX);
    assert_eq!(p.threshold(1), u64::MAX, "used device");
    assert_eq!(
        p.threshold(5),
        u64::MAX,
        "device used later: keep all, not a huge number"
    );
}

// Thread caches (`tcache.rs`).

/// Run `f` on a new thread and wait for it (each thread has its own caches).
fn on_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().unwrap())
}

/// A relaxed pool with thread caches of `thread_cache` bytes, on which a second thread has
/// allocated.
fn pool_cache(capacity: u64, thread_cache: u64) -> Pool<Model> {
    pool_cache_in(ReuseMode::Relaxed, capacity, thread_cache)
}

/// `pool_cache` in `reuse` mode (thread caches start with the second thread: no contention
/// needed, `cache_contention` 0).
fn pool_cache_in(reuse: ReuseMode, capacity: u64, thread_cache: u64) -> Pool<Model> {
    let mut s = pool_with(reuse, DeviceBytes::Unbounded, 1)
        .settings()
        .clone();
    s.thread_cache = thread_cache;
    let p = Pool::new(Model::with_capacity(capacity), s);
    let a = p.alloc(0, 4096).unwrap();
    on_thread(|| {
        let b = p.alloc(0, 4096).unwrap();
        assert_eq!(p.free(b, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    });
    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    p
}

/// A relaxed pool on which a second thread has allocated, so thread caches are on.
fn shared_relaxed(capacity: u64) -> Pool<Model> {
    pool_cache(capacity, crate::config::DEFAULT_THREAD_CACHE)
}

#[test]
fn thread_caches_start_with_a_second_allocating_thread() {
    let p = pool_with(ReuseMode::Relaxed, DeviceBytes::Unbounded, 80 << 30);
    for _ in 0..10 {
        let a = p.alloc(0, 4096).unwrap();
        p.free(a, FreeKind::Sync, Some(0));
    }
    assert_eq!(stats(&p, 0).thread_cache_hits, 0, "one thread: no caches");
    on_thread(|| {
        // A thread that only frees does not count.
        let a = p.alloc(0, 4096).unwrap();
        p.free(a, FreeKind::Sync, Some(0));
    });
    for _ in 0..10 {
        let a = p.alloc(0, 4096).unwrap();
        p.free(a, FreeKind::Sync, Some(0));
    }
    let s = stats(&p, 0);
    assert!(s.thread_cache_hits >= 9, "{s:?}");
    assert_eq!((s.allocs, s.frees), (21, 21));
    assert_eq!((s.allocated.current, s.requested.current), (0, 0));
    assert_eq!(s.blocks.current, 0);
    assert_eq!(s.allocated.total_in, s.allocated.total_out);
    assert_eq!(s.requested.total_in, 21 * 4096);
    assert_eq!(s.histogram.iter().sum::<u64>(), 21);
    p.check_settled().unwrap();
}

#[test]
fn thread_caches_are_off_while_tracing() {
    struct Discard;
    impl TraceSink for Discard {
        fn write(&self, _: &[u8]) {}
    }
    let sink: Arc<dyn TraceSink> = Arc::new(Discard);
    let mut settings = pool_with(ReuseMode::Relaxed, DeviceBytes::Unbounded, 1)
        .settings()
        .clone();
    settings.trace = Some(sink);
    let p = Pool::new(Model::with_capacity(80 << 30), settings);
    let a = p.alloc(0, 4096).unwrap();
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.free(a, FreeKind::Sync, Some(0));
    p.alloc(0, 4096).unwrap();
    assert_eq!(stats(&p, 0).thread_cache_borrowed, 0);
}

#[test]
fn a_threads_own_fence_is_not_counted_as_a_program_sync() {
    // Found in review: the summary's "program syncs used" counted the caches' own fences.
    let mut p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    p.settings.policy.fence_bytes = 2 * MIB;
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.alloc(0, 4096).unwrap(); // caches on
    let v: Vec<Addr> = (0..4).map(|_| p.alloc(0, 512 << 10).unwrap()).collect();
    let big = p.alloc(0, 12 * MIB).unwrap(); // not through caches: waits in the device
    for &a in &v {
        p.free(a, FreeKind::Sync, Some(0));
    }
    p.free(big, FreeKind::Sync, Some(0));
    p.alloc(0, 512 << 10).unwrap(); // the thread's own fence
    assert_eq!(p.backend().get(|s| s.fences), 1);
    p.alloc(0, 12 * MIB).unwrap();
    assert_eq!(stats(&p, 0).observed_fences, 0);
    p.check().unwrap();
}

#[test]
fn a_strict_thread_cache_keeps_at_most_its_bound_of_reusable_blocks() {
    // Found in review: blocks a fence made reusable went to the ready lists whatever the bound.
    // They may stay up to twice the bound or the thread's fence share, whichever is larger
    // (`Pool::cache_keep`).
    let mut p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    p.settings.policy.fence_bytes = 64 * MIB;
    p.settings.thread_cache = 8 * MIB;
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.alloc(0, 4096).unwrap(); // caches on
    let (made, done) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
    std::thread::scope(|t| {
        // A second live cache: shares of 32 MiB.
        t.spawn(|| {
            p.alloc(0, 4096).unwrap();
            made.wait();
            done.wait();
        });
        made.wait();
        let v: Vec<Addr> = (0..100).map(|_| p.alloc(0, MIB).unwrap()).collect();
        for &a in &v {
            p.free(a, FreeKind::Sync, Some(0));
        }
        let at = p.seq_before_sync(0);
        p.observe_fence(0, at);
        p.alloc(0, 4096).unwrap(); // a miss of another size promotes what the fence covered
        let slot = p.existing(0).unwrap();
        let most = slot
            .caches
            .caches()
            .iter()
            .map(|c| c.state.lock().ready_bytes)
            .max();
        done.wait(); // before the check: a failure must not leave the other thread waiting
        assert!(most.unwrap() <= 64 * MIB, "{most:?}");
        assert!(most.unwrap() >= 32 * MIB, "{most:?}");
    });
    p.check().unwrap();
}

/// A relaxed-mode cache never holds more than its bound, also when freed blocks are larger than
/// half of it (found in review: a 4 MiB bound held an 8 MiB block).
#[test]
fn a_small_thread_cache_bound_holds_for_large_blocks() {
    for (bound, size) in [(4 * MIB, 8 * MIB), (4 * MIB, 3 * MIB), (8 * MIB, 5 * MIB)] {
        let p = pool_cache(80 << 30, bound);
        let v: Vec<Addr> = (0..6).map(|_| p.alloc(0, size).unwrap()).collect();
        for a in v {
            assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
        }
        let slot = p.existing(0).unwrap();
        for c in slot.caches.caches() {
            let held = c.state.lock().ready_bytes;
            assert!(
                held <= bound,
                "bound {bound}, {size}-byte blocks: holds {held}"
            );
        }
        p.check().unwrap();
    }
}

#[test]
fn in_strict_mode_thread_caches_wait_for_contention() {
    // Two threads that take turns (PyTorch's forward and backward threads do): no caches in
    // strict mode, which would only add fences; in relaxed mode, caches at once.
    for (reuse, cached) in [(ReuseMode::Strict, false), (ReuseMode::Relaxed, true)] {
        let mut p = pool_with(reuse, DeviceBytes::Unbounded, 80 << 30);
        p.settings.cache_contention = tcache::CONTENTION;
        on_thread(|| p.alloc(0, 4096).unwrap());
        for _ in 0..2000 {
            let a = p.alloc(0, 4096).unwrap();
            p.free(a, FreeKind::Sync, Some(0));
        }
        assert_eq!(stats(&p, 0).thread_cache_borrowed > 0, cached, "{reuse:?}");
    }
    // Once a second thread allocated, each allocation by another thread than the last counts;
    // once the count reaches the setting, caches start.
    let mut p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    p.settings.cache_contention = 4;
    let turn = |p: &Pool<Model>| {
        let a = p.alloc(0, 4096).unwrap();
        p.free(a, FreeKind::Sync, Some(0));
    };
    turn(&p);
    on_thread(|| turn(&p)); // the second thread: counting starts
    for _ in 0..1000 {
        turn(&p); // one change of hands
    }
    on_thread(|| turn(&p));
    turn(&p);
    assert_eq!(
        stats(&p, 0).thread_cache_borrowed,
        0,
        "three changes of hands"
    );
    on_thread(|| turn(&p)); // the fourth: caches start after this allocation
    turn(&p);
    assert!(stats(&p, 0).thread_cache_borrowed > 0);
    p.check_settled().unwrap();
}

#[test]
fn in_strict_mode_long_waits_for_the_device_lock_start_thread_caches() {
    // A lock whose holder takes it again before a woken waiter runs changes hands seldom; the
    // waiting shows the contention.
    let mut c = tcache::Contention::default();
    c.took(None, 0);
    c.took(Some(10_000), 0);
    assert!(!c.reached(u64::MAX, 0), "10 us of waiting");
    c.took(Some(1_000_000_000), 0);
    assert!(
        !c.reached(u64::MAX, 0),
        "one long wait: a holder preempted once"
    );
    for _ in 0..10 {
        c.took(Some(1_000_000_000), 0);
    }
    assert!(
        c.reached(u64::MAX, 0),
        "11 s of waiting, more than all the time since the count started"
    );
    c.restart();
    assert!(!c.reached(u64::MAX, 0));
    c.took(None, 0); // the same thread again
    assert!(!c.reached(1, 0));
    c.took(Some(0), 0);
    assert!(c.reached(1, 0), "a collision counts as a change of hands");
    // Time in the backend is left out of the time since the count started.
    let mut c = tcache::Contention::default();
    c.took(None, 0);
    std::thread::sleep(std::time::Duration::from_millis(40));
    for _ in 0..4 {
        c.took(Some(1_000_000), 0);
    }
    assert!(!c.reached(u64::MAX, 0), "4 ms of 40");
    assert!(
        c.reached(u64::MAX, 40_000_000),
        "4 ms of 40, all but 4 of it fences"
    );

    // Through the pool: a thread that waits for the device's lock (held here) while it
    // allocates, for longer each try until the waiting thread was there to wait.
    let mut p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    p.settings.cache_contention = u64::MAX; // changes of hands alone never start them
    let turn = |p: &Pool<Model>| {
        let a = p.alloc(0, 4096).unwrap();
        p.free(a, FreeKind::Sync, Some(0));
    };
    turn(&p);
    on_thread(|| turn(&p));
    let slot = p.existing(0).unwrap();
    for hold_ms in [20, 20, 20, 20, 80, 80, 320, 320, 1280] {
        let held = Pool::<Model>::lock(slot);
        std::thread::scope(|t| {
            let waiter = t.spawn(|| turn(&p));
            std::thread::sleep(std::time::Duration::from_millis(hold_ms));
            drop(held);
            waiter.join().unwrap();
        });
        turn(&p);
        if stats(&p, 0).thread_cache_borrowed > 0 {
            break;
        }
    }
    assert!(stats(&p, 0).thread_cache_borrowed > 0);
    p.check_settled().unwrap();
}

#[test]
fn time_behind_the_pools_own_fence_is_not_counted_as_waiting() {
    // Found in review: a thread that waited for the device's lock while the holder synchronized
    // the device under it (a fence before growing) counted the wait, so two threads that take
    // turns could start caches in strict mode. The holder's time in the backend is left out.
    let mut s = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 1)
        .settings()
        .clone();
    s.cache_contention = u64::MAX; // the waiting alone decides
    s.policy.fence_bytes = MIB;
    let p = Pool::new(
        Hazard {
            fence_ms: 100,
            ..Hazard::default()
        },
        s,
    );
    let turn = |p: &Pool<Hazard>| {
        let a = p.alloc(0, 4096).unwrap();
        p.free(a, FreeKind::Sync, Some(0));
    };
    turn(&p);
    std::thread::scope(|t| t.spawn(|| turn(&p)).join().unwrap()); // a second thread
    let mut waited_behind_a_fence = false;
    for _ in 0..5 {
        let big = p.alloc(0, 12 * MIB).unwrap();
        p.free(big, FreeKind::Sync, Some(0)); // pending: the next one fences first
        let fences = p.backend().inner.get(|s| s.fences);
        std::thread::scope(|t| {
            let waiter = t.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(30));
                let start = std::time::Instant::now();
                turn(&p);
                start.elapsed()
            });
            let again = p.alloc(0, 12 * MIB).unwrap();
            assert_eq!(p.backend().inner.get(|s| s.fences), fences + 1);
            let waited = waiter.join().unwrap();
            p.free(again, FreeKind::Sync, Some(0));
            // The waiter came while the 100 ms fence ran, found the lock taken and waited.
            let (collisions, counted) = p.existing(0).unwrap().pool.lock().contention.collisions();
            if collisions > 0 && waited >= std::time::Duration::from_millis(30) {
                waited_behind_a_fence = true;
                assert!(counted < 20_000_000, "{counted} ns counted of {waited:?}");
            }
        });
        if waited_behind_a_fence {
            break;
        }
    }
    assert!(waited_behind_a_fence, "the waiter never met the fence");
    turn(&p);
    assert_eq!(p.device_stats(0).unwrap().stats.thread_cache_borrowed, 0);
    p.check().unwrap();
}

#[test]
fn a_fence_budget_of_none_with_thread_caches_does_not_overflow() {
    // Found in review: `GPUPOOL_FENCE_BYTES=none` (u64::MAX) doubled in the cache's keep and
    // give-back bounds overflowed (a panic in a debug build, every cached call failing).
    let mut p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    p.settings.policy.fence_bytes = u64::MAX;
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.alloc(0, 4096).unwrap(); // caches on, this thread's the only one
    let v: Vec<Addr> = (0..8).map(|_| p.alloc(0, 8192).unwrap()).collect();
    for a in v {
        assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    }
    let at = p.seq_before_sync(0);
    p.observe_fence(0, at);
    p.alloc(0, 8192).unwrap();
    assert!(stats(&p, 0).thread_cache_hits > 0);
    p.check().unwrap();
}

#[test]
fn in_strict_mode_a_cached_block_waits_for_a_fence_in_its_cache() {
    let mut p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    p.settings.policy.fence_bytes = 1 << 30; // no fence of the pool's own in this test
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.alloc(0, 4096).unwrap(); // a second thread: caches on
    let a = p.alloc(0, 4096).unwrap();
    assert_eq!(stats(&p, 0).thread_cache_borrowed, 1);
    p.free(a, FreeKind::Sync, Some(0));
    assert_eq!(p.device_stats(0).unwrap().pending, 4096);
    // Not before a fence: a different block.
    let b = p.alloc(0, 4096).unwrap();
    assert_ne!(b, a);
    // A free that happens while a program synchronization runs is not covered by it.
    let at = p.seq_before_sync(0);
    p.free(b, FreeKind::Sync, Some(0));
    p.observe_fence(0, at);
    assert_eq!(
        p.alloc(0, 4096).unwrap(),
        a,
        "covered by the program's fence"
    );
    assert_ne!(p.alloc(0, 4096).unwrap(), b, "freed during the fence");
    assert_eq!(p.backend().get(|s| s.fences), 0);
    p.check().unwrap();
}

#[test]
fn a_thread_whose_cache_holds_its_fence_share_fences_itself() {
    let mut p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    p.settings.policy.fence_bytes = 2 * MIB; // one cache, which holds the whole budget below
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.alloc(0, 4096).unwrap();
    let v: Vec<Addr> = (0..4).map(|_| p.alloc(0, 512 << 10).unwrap()).collect();
    for &a in &v {
        p.free(a, FreeKind::Sync, Some(0));
    }
    let before = p.backend().get(|s| s.fences);
    // 2 MiB wait in this thread's cache: the next miss fences without the device's lock and
    // serves from what the fence made reusable.
    let again = p.alloc(0, 512 << 10).unwrap();
    assert!(v.contains(&again));
    assert_eq!(p.backend().get(|s| s.fences), before + 1);
    assert_eq!(
        stats(&p, 0).fences,
        before + 1,
        "counted in the device's figures"
    );
    p.check().unwrap();
}

/// Run `f` on the main thread while a second thread holds its own cache, filled by `other`
/// (which gets the pool), and waits; then let it go.
fn beside_a_second_cache<T>(
    p: &Pool<Model>,
    other: impl FnOnce(&Pool<Model>) + Send,
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

#[test]
fn a_thread_fences_itself_only_once_the_caches_together_hold_the_budget() {
    // Two caches, shares of 2 MiB: a thread holding its share waiting does not fence while the
    // caches together hold less than the budget (so that each fence covers about a budget, as
    // the device's do); once the other thread's cache holds its share too, it does.
    let mut p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    p.settings.policy.fence_bytes = 4 * MIB;
    // Reusable room in the device first: the caches' misses below never make it grow (which
    // would take back what the caches hold waiting).
    let room: Vec<Addr> = (0..16).map(|_| p.alloc(0, 512 << 10).unwrap()).collect();
    for a in room {
        p.free(a, FreeKind::Sync, Some(0));
    }
    let at = p.seq_before_sync(0);
    p.observe_fence(0, at);
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.alloc(0, 4096).unwrap(); // caches on
    let mine: Vec<Addr> = (0..4).map(|_| p.alloc(0, 512 << 10).unwrap()).collect();
    for &a in &mine {
        p.free(a, FreeKind::Sync, Some(0));
    }
    let fences = || p.backend().get(|s| s.fences);
    let before = fences();
    let b = beside_a_second_cache(
        &p,
        |p| {
            p.alloc(0, 4096).unwrap();
        },
        || {
            let b = p.alloc(0, 512 << 10).unwrap();
            assert!(!mine.contains(&b), "not reusable before a fence");
            assert_eq!(fences(), before, "2 MiB of 4 wait: no fence yet");
            p.free(b, FreeKind::Sync, Some(0));
            b
        },
    );
    // The second thread exited; its cache is swept at the next device operation. Now with a
    // second cache holding its share.
    let c = beside_a_second_cache(
        &p,
        |p| {
            let v: Vec<Addr> = (0..4).map(|_| p.alloc(0, 512 << 10).unwrap()).collect();
            for a in v {
                p.free(a, FreeKind::Sync, Some(0));
            }
        },
        || {
            let n = fences();
            let c = p.alloc(0, 512 << 10).unwrap();
            assert_eq!(
                fences(),
                n + 1,
                "the caches hold the budget: the thread fences"
            );
            c
        },
    );
    assert!(
        mine.contains(&c) || c == b,
        "served from what its own fence made reusable"
    );
    p.check().unwrap();
}

#[test]
fn a_miss_takes_blocks_of_its_size_from_another_threads_cache_and_nothing_else() {
    // The device has no 4 MiB block left; another thread's cache keeps five reusable, besides
    // blocks of other sizes and blocks still waiting for a fence. A miss of 4 MiB takes half of
    // the five (no growth, no fence) and leaves the rest of that cache as it was.
    let mut p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    p.settings.policy.fence_bytes = 1 << 30; // no fence of the pool's own
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.alloc(0, 4096).unwrap(); // caches on
    let slot = p.existing(0).unwrap();
    let theirs = std::sync::Mutex::new(Vec::new());
    beside_a_second_cache(
        &p,
        |p| {
            // One 20 MiB segment of five 4 MiB blocks, and small blocks.
            let big: Vec<Addr> = (0..5).map(|_| p.alloc(0, 4 * MIB).unwrap()).collect();
            let small: Vec<Addr> = (0..4).map(|_| p.alloc(0, 64 << 10).unwrap()).collect();
            for &a in big.iter().chain(&small) {
                p.free(a, FreeKind::Sync, Some(0));
            }
            let at = p.seq_before_sync(0);
            p.observe_fence(0, at);
            // A miss of another size makes what the fence covered reusable here; then a free
            // that waits.
            let w = p.alloc(0, 8192).unwrap();
            p.free(w, FreeKind::Sync, Some(0));
            *theirs.lock().unwrap() = big;
        },
        || {
            let other = slot
                .caches
                .caches()
                .into_iter()
                .find(|c| c.state.lock().ready_bytes >= 20 * MIB)
                .expect("the other thread's cache");
            let held = |c: &tcache::ThreadCache| {
                let st = c.state.lock();
                (st.ready_bytes, st.waiting_bytes)
            };
            let (ready, waiting) = held(&other);
            assert_eq!(ready, 20 * MIB + 4 * (64 << 10));
            assert_eq!(waiting, 8192);
            let reserved = stats(&p, 0).reserved.current;
            let fences = p.backend().get(|s| s.fences);
            let a = p.alloc(0, 4 * MIB).unwrap();
            assert!(theirs.lock().unwrap().contains(&a));
            assert_eq!(stats(&p, 0).reserved.current, reserved, "no growth");
            assert_eq!(p.backend().get(|s| s.fences), fences, "no fence");
            assert_eq!(
                held(&other),
                (ready - 3 * 4 * MIB, waiting),
                "three of the five 4 MiB blocks back, nothing else"
            );
            p.check().unwrap();
        },
    );
    p.check().unwrap();
}

/// `Model` that tracks in-flight work: the ranges a "kernel" uses stay busy until a fence (or,
/// for barrier mode, a barrier) completes; a fence takes `fence_ms`.
struct Hazard {
    inner: Model,
    busy: Mutex<BTreeMap<Addr, u64>>,
    fence_ms: u64,
}

impl Default for Hazard {
    fn default() -> Self {
        Hazard {
            inner: Model::with_capacity(80 << 30),
            busy: Mutex::new(BTreeMap::new()),
            fence_ms: 0,
        }
    }
}

impl Backend for Hazard {
    fn alloc_segment(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        self.inner.alloc_segment(device, bytes)
    }
    fn free_segment(&self, device: u32, addr: Addr) -> Result<(), CudaError> {
        self.inner.free_segment(device, addr)
    }
    fn fence(&self, d: u32) -> Result<(), CudaError> {
        std::thread::sleep(std::time::Duration::from_millis(self.fence_ms));
        self.busy.lock().unwrap().clear();
        self.inner.fence(d)
    }
    fn barrier(&self, d: u32) -> Result<(), CudaError> {
        self.busy.lock().unwrap().clear();
        self.inner.barrier(d)
    }
    fn memory_info(&self, device: u32) -> Result<(u64, u64), CudaError> {
        self.inner.memory_info(device)
    }
}

/// Allocations per thread and round in the hazard stress (written by a review, 2026-11-30).
const HAZARD_ITERS: u64 = 50_000;

/// `threads` threads on one device, three rounds (exiting in between), `iters` allocations each
/// of sizes every thread favours differently (so that caches take from each other): a "kernel"
/// on every block allocated, frees while it runs, a fifth of them by another thread, now and
/// then a program synchronization. No allocation may overlap a busy range; the counts end at
/// zero.
fn hazard_stress(reuse: ReuseMode, threads: u64, iters: u64) {
    let mut s = pool_with(reuse, DeviceBytes::Unbounded, 1)
        .settings()
        .clone();
    s.policy.fence_bytes = 8 * MIB;
    s.cache_contention = 0;
    let p = Arc::new(Pool::new(Hazard::default(), s));
    let queue = Arc::new(Mutex::new(Vec::<Addr>::new()));
    for round in 0..3u64 {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (p, queue) = (Arc::clone(&p), Arc::clone(&queue));
                std::thread::spawn(move || {
                    let mut rng = crate::workloads::rng::Rng::new(round * 100 + t + 1);
                    let mut mine: Vec<(Addr, u64)> = Vec::new();
                    // Thread t favours some sizes for allocs, others for frees (reclaim_size).
                    let sizes = [4096u64, 65536, 512 << 10, MIB, 4 * MIB];
                    for _ in 0..iters {
                        let k = rng.range(0, 4) as usize;
                        let size = sizes[(k + t as usize) % 5];
                        let a = p.alloc(0, size).unwrap();
                        {
                            let b = p.backend().busy.lock().unwrap();
                            for (&s0, &n) in b.range(..a + size) {
                                assert!(
                                    s0 + n <= a,
                                    "{a:#x}+{size} handed out while {s0:#x}+{n} busy"
                                );
                            }
                            drop(b);
                            // A kernel on the block, launched now.
                            p.backend().busy.lock().unwrap().insert(a, size);
                        }
                        mine.push((a, size));
                        while mine.len() > 6 || (!mine.is_empty() && rng.range(0, 1) == 0) {
                            let i = rng.range(0, mine.len() as u64 - 1) as usize;
                            let (a, _) = mine.swap_remove(i);
                            if rng.range(0, 5) == 0 {
                                queue.lock().unwrap().push(a);
                            } else {
                                assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
                            }
                        }
                        if let Some(a) = queue.lock().unwrap().pop() {
                            assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
                        }
                        if rng.range(0, 200) == 0 {
                            // The program synchronizes.
                            let at = p.seq_before_sync(0);
                            p.backend().busy.lock().unwrap().clear();
                            p.observe_fence(0, at);
                        } else if reuse == ReuseMode::Barrier && rng.range(0, 100) == 0 {
                            let at = p.seq_before_sync(0);
                            p.backend().busy.lock().unwrap().clear();
                            p.observe_barrier(0, at);
                        }
                    }
                    p.check().unwrap();
                    for (a, _) in mine {
                        assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
    for a in queue.lock().unwrap().drain(..) {
        assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    }
    let st = p.device_stats(0).unwrap().stats;
    assert_eq!(
        (
            st.allocated.current,
            st.requested.current,
            st.blocks.current
        ),
        (0, 0, 0),
        "{st:?}"
    );
    assert!(st.thread_cache_hits > 0, "{st:?}");
    p.check().unwrap();
}

#[test]
fn threads_on_one_device_never_get_a_block_a_kernel_still_uses_strict() {
    hazard_stress(ReuseMode::Strict, 4, HAZARD_ITERS);
}

#[test]
fn threads_on_one_device_never_get_a_block_a_kernel_still_uses_barrier() {
    hazard_stress(ReuseMode::Barrier, 4, HAZARD_ITERS);
}

#[test]
fn two_threads_on_one_device_never_share_a_block_and_account_exactly() {
    let p = Arc::new(shared_relaxed(80 << 30));
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let p = Arc::clone(&p);
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                let mut freed = 0u64;
                for i in 0..3000u64 {
                    let size = 512 << ((i * 7 + t * 3) % 14);
                    mine.push((p.alloc(0, size).unwrap(), size));
                    if i % 3 != 0 {
                        let (a, _) = mine.swap_remove((i as usize * 31) % mine.len());
                        assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
                        freed += 1;
                    }
                }
                p.check().unwrap();
                (mine, freed)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut spans: Vec<(Addr, u64)> = results.iter().flat_map(|r| r.0.clone()).collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "live blocks overlap: {w:?}");
    }
    let s = stats(&p, 0);
    assert!(s.thread_cache_hits > 1000, "{s:?}");
    assert_eq!(s.allocs, 2 + 4 * 3000);
    let freed: u64 = results.iter().map(|r| r.1).sum();
    assert_eq!(s.frees, 2 + freed);
    assert_eq!(s.blocks.current, spans.len() as u64);
    assert_eq!(
        s.requested.current,
        spans.iter().map(|&(_, n)| n).sum::<u64>(),
        "requested bytes of the live blocks"
    );
    // The leak list shows every live block, whichever way it was served.
    let mut live: Vec<Addr> = p
        .live_blocks(0, Patience::Wait)
        .unwrap()
        .iter()
        .map(|b| b.addr)
        .collect();
    live.sort();
    assert_eq!(live, spans.iter().map(|s| s.0).collect::<Vec<_>>());
    p.check_settled().unwrap();
}

#[test]
fn a_block_from_one_threads_cache_is_freed_by_another() {
    let p = shared_relaxed(80 << 30);
    let a = on_thread(|| p.alloc(0, 8192).unwrap());
    assert!(p.live_block(a).is_some());
    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Invalid);
    assert_eq!(
        p.free(a + 512, FreeKind::Sync, Some(0)),
        FreeOutcome::Invalid
    );
    assert_eq!(stats(&p, 0).invalid_frees, 2);
    assert_eq!(stats(&p, 0).allocated.current, 0);
    p.check_settled().unwrap();
}

#[test]
fn a_double_free_into_a_thread_cache_is_refused() {
    let p = shared_relaxed(80 << 30);
    let a = p.alloc(0, 4096).unwrap();
    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Invalid);
    // The cached block is handed out once, not twice.
    let b = p.alloc(0, 4096).unwrap();
    let c = p.alloc(0, 4096).unwrap();
    assert_ne!(b, c);
    p.check_settled().unwrap();
}

#[test]
fn blocks_of_an_exited_thread_come_back_to_the_device() {
    let p = shared_relaxed(80 << 30);
    let kept = on_thread(|| {
        let kept: Vec<Addr> = (0..20).map(|_| p.alloc(0, 64 << 10).unwrap()).collect();
        for &a in &kept[10..] {
            p.free(a, FreeKind::Sync, Some(0));
        }
        kept[..10].to_vec()
    });
    // The thread is gone; its cache held 10 free blocks and 10 the program still holds.
    p.alloc(0, 1 << 20).unwrap();
    p.check().unwrap();
    for a in kept {
        assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    }
    let s = stats(&p, 0);
    assert_eq!(s.blocks.current, 1);
    assert_eq!(s.allocs, s.frees + 1);
    p.check_settled().unwrap();
}

/// Allocate `n` blocks of `size` on device 0 and free them all (into the thread's cache).
fn alloc_and_free(p: &Pool<Model>, n: usize, size: u64) {
    let v: Vec<Addr> = (0..n).map(|_| p.alloc(0, size).unwrap()).collect();
    for a in v {
        p.free(a, FreeKind::Sync, Some(0));
    }
}

/// Run `holder` on a thread that stays alive (its cache full) while `main` runs here.
fn while_a_thread_holds(p: &Pool<Model>, holder: impl FnOnce() + Send, main: impl FnOnce()) {
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

#[test]
fn out_of_memory_takes_back_what_a_live_threads_cache_holds() {
    let p = shared_relaxed(64 * MIB);
    let fill = || alloc_and_free(&p, 40, 512 << 10);
    while_a_thread_holds(&p, fill, || {
        let s = p.device_stats(0).unwrap();
        assert!(
            s.stats.reserved.current >= 20 * MIB && s.cached >= 20 * MIB,
            "{s:?}"
        );
        // Most of the device is in small segments the other thread's cache holds.
        let big = p
            .alloc(0, 56 * MIB)
            .expect("the cache gives its blocks back");
        assert_eq!(stats(&p, 0).ooms, 0);
        p.free(big, FreeKind::Sync, Some(0));
    });
}

#[test]
fn empty_cache_takes_back_what_a_live_threads_cache_holds() {
    let p = shared_relaxed(80 << 30);
    let fill = || alloc_and_free(&p, 20, 256 << 10);
    while_a_thread_holds(&p, fill, || {
        assert!(p.device_stats(0).unwrap().cached > 0);
        p.empty_cache(0);
        let s = p.device_stats(0).unwrap();
        assert_eq!((s.stats.reserved.current, s.cached), (0, 0), "{s:?}");
        assert_eq!(p.backend().live_bytes(0), 0);
    });
}

#[test]
fn one_threads_cache_does_not_make_the_device_grow_for_another() {
    let p = shared_relaxed(80 << 30);
    let fill = || alloc_and_free(&p, 64, 64 << 10);
    while_a_thread_holds(&p, fill, || {
        let before = stats(&p, 0).reserved.current;
        let v: Vec<Addr> = (0..32).map(|_| p.alloc(0, 64 << 10).unwrap()).collect();
        assert_eq!(
            stats(&p, 0).reserved.current,
            before,
            "grew while another cache held"
        );
        for a in v {
            p.free(a, FreeKind::Sync, Some(0));
        }
    });
}

#[test]
fn a_thread_cache_keeps_at_most_its_bound() {
    let p = shared_relaxed(80 << 30);
    let bound = p.settings().thread_cache;
    let n = (2 * bound / MIB) as usize;
    let v: Vec<Addr> = (0..n).map(|_| p.alloc(0, MIB).unwrap()).collect();
    for a in v {
        p.free(a, FreeKind::Sync, Some(0));
    }
    let s = p.device_stats(0).unwrap();
    assert!(s.stats.thread_cache_returned > 0, "{s:?}");
    // What the cache holds is counted as cached and is at most its bound.
    assert!(s.cached >= bound, "{s:?}");
    p.check_settled().unwrap();
}

#[test]
fn a_release_threshold_turns_thread_caches_off_and_empties_them() {
    let p = shared_relaxed(80 << 30);
    let a = p.alloc(0, 4096).unwrap();
    p.free(a, FreeKind::Sync, Some(0));
    assert!(p.device_stats(0).unwrap().cached > 0);
    p.set_threshold(0);
    p.sync_point(0);
    assert_eq!(p.device_stats(0).unwrap().stats.reserved.current, 0);
    let hits = stats(&p, 0).thread_cache_hits;
    let b = p.alloc(0, 4096).unwrap();
    p.free(b, FreeKind::Sync, Some(0));
    assert_eq!(stats(&p, 0).thread_cache_hits, hits);
    p.check_settled().unwrap();
}

#[test]
fn a_device_reset_empties_thread_caches() {
    let p = shared_relaxed(80 << 30);
    let a = p.alloc(0, 4096).unwrap();
    let b = p.alloc(0, 4096).unwrap();
    p.free(b, FreeKind::Sync, Some(0));
    p.forget_device(0);
    p.check().unwrap();
    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::NotOurs);
    let s = p.device_stats(0).unwrap();
    assert_eq!((s.stats.allocated.current, s.cached), (0, 0));
    let c = p.alloc(0, 4096).unwrap();
    assert_eq!(p.free(c, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    p.check_settled().unwrap();
}

#[test]
fn async_frees_in_a_thread_cache_wait_for_a_barrier() {
    let p = shared_relaxed(80 << 30);
    let a = p.alloc(0, 4096).unwrap();
    p.free(
        a,
        FreeKind::Async {
            blocking: true,
            stream: 7,
        },
        Some(0),
    );
    // Not reusable from the cache: it waits to go back to the device, which needs a barrier.
    let b = p.alloc(0, 4096).unwrap();
    assert_ne!(a, b, "reused before a barrier");
    p.check_settled().unwrap();
}

/// Barriers the thread caches of device 0 took themselves.
fn own_barriers<B: Backend>(p: &Pool<B>) -> u64 {
    let slot = p.existing(0).unwrap();
    slot.caches
        .caches()
        .iter()
        .map(|c| c.state.lock().counts.barriers)
        .sum()
}

#[test]
fn in_barrier_mode_a_thread_takes_a_barrier_for_its_cache() {
    // Blocks freed into a cache wait for a barrier; a barrier costs no host wait, so a miss
    // with enough bytes waiting for one (`tcache::BARRIER_BATCH`) takes one itself, without the
    // device's lock, and reuses them.
    let p = pool_with(ReuseMode::Barrier, DeviceBytes::Unbounded, 80 << 30);
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.alloc(0, 4096).unwrap(); // caches on
    let size = 256 << 10;
    // More than a small segment's worth waits (`tcache::BARRIER_BATCH`).
    let n = SMALL_SEGMENT / size + 4;
    let v: Vec<Addr> = (0..n).map(|_| p.alloc(0, size).unwrap()).collect();
    for &a in &v {
        p.free(a, FreeKind::Sync, Some(0));
    }
    let mut reused = false;
    for _ in 0..64 {
        if v.contains(&p.alloc(0, size).unwrap()) {
            reused = true;
            break;
        }
    }
    assert!(reused);
    assert!(own_barriers(&p) >= 1, "the thread's own barrier");
    assert_eq!(
        p.backend().get(|s| s.barriers),
        stats(&p, 0).barriers,
        "counted once in the device's figures"
    );
    assert_eq!(p.backend().get(|s| s.fences), 0);
    p.check().unwrap();
}

#[test]
fn a_thread_takes_barriers_for_its_cache_in_batches_and_not_behind_a_fence() {
    // Found in review: a thread that freed and allocated one block in turn took a barrier (a
    // driver call) on every allocation.
    let p = pool_with(ReuseMode::Barrier, DeviceBytes::Unbounded, 80 << 30);
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.alloc(0, 4096).unwrap(); // caches on
    for _ in 0..2000 {
        let a = p.alloc(0, 256 << 10).unwrap();
        p.free(a, FreeKind::Sync, Some(0));
    }
    let all = p.backend().get(|s| s.barriers);
    assert!(all <= 2000 / 4, "{all} barriers for 2000 allocations");
    // A block that waits for a fence first in line (a free on a non-blocking stream): a
    // barrier would make nothing reusable, so the thread takes none.
    let q = pool_with(ReuseMode::Barrier, DeviceBytes::Unbounded, 80 << 30);
    on_thread(|| q.alloc(0, 4096).unwrap());
    q.alloc(0, 4096).unwrap();
    let f = q.alloc(0, 4096).unwrap();
    let v: Vec<Addr> = (0..16).map(|_| q.alloc(0, 256 << 10).unwrap()).collect();
    q.free(
        f,
        FreeKind::Async {
            blocking: false,
            stream: 7,
        },
        Some(0),
    );
    for &a in &v {
        q.free(a, FreeKind::Sync, Some(0));
    }
    let before = own_barriers(&q);
    for _ in 0..4 {
        q.alloc(0, 256 << 10).unwrap();
    }
    assert_eq!(own_barriers(&q), before);
    q.check().unwrap();
}

#[test]
fn thread_caches_account_exactly_with_cross_thread_frees_and_exits() {
    let p = Arc::new(pool_with(
        ReuseMode::Relaxed,
        DeviceBytes::Unbounded,
        80 << 30,
    ));
    let queue = Arc::new(Mutex::new(Vec::<(Addr, u32)>::new()));
    let handles: Vec<_> = (0..6u64)
        .map(|t| {
            let (p, queue) = (Arc::clone(&p), Arc::clone(&queue));
            std::thread::spawn(move || {
                let mut rng = crate::workloads::rng::Rng::new(t + 1);
                let mut mine = Vec::new();
                for _ in 0..1500 {
                    let dev = rng.range(0, 1) as u32;
                    let shift = rng.range(0, 12);
                    let size = rng.range(1, (32 << 20) >> shift);
                    mine.push((p.alloc(dev, size).unwrap(), dev));
                    if rng.range(0, 2) == 0 {
                        let (a, d) = mine.swap_remove(rng.range(0, mine.len() as u64 - 1) as usize);
                        if rng.range(0, 2) == 0 {
                            queue.lock().unwrap().push((a, d));
                        } else {
                            assert_eq!(p.free(a, FreeKind::Sync, Some(1 - d)), FreeOutcome::Freed);
                        }
                    }
                    let other = queue.lock().unwrap().pop();
                    if let Some((a, d)) = other {
                        assert_eq!(p.free(a, FreeKind::Sync, Some(d)), FreeOutcome::Freed);
                    }
                }
                mine
            })
        })
        .collect();
    let left: Vec<(Addr, u32)> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    p.check().unwrap();
    for d in 0..2 {
        let s = stats(&p, d);
        let live = left.iter().filter(|x| x.1 == d).count() as u64;
        let queued = queue.lock().unwrap().iter().filter(|x| x.1 == d).count() as u64;
        assert_eq!(s.blocks.current, live + queued, "device {d}: {s:?}");
        let queued = queue.lock().unwrap().iter().filter(|x| x.1 == d).count() as u64;
        assert_eq!(s.allocs - s.frees, live + queued, "device {d}");
    }
    for (a, d) in left.into_iter().chain(queue.lock().unwrap().drain(..)) {
        assert_eq!(p.free(a, FreeKind::Sync, Some(d)), FreeOutcome::Freed);
    }
    for d in 0..2 {
        let s = stats(&p, d);
        assert_eq!(
            (s.allocated.current, s.requested.current, s.blocks.current),
            (0, 0, 0),
            "device {d}: {s:?}"
        );
        assert_eq!(s.allocated.total_in, s.allocated.total_out, "device {d}");
        assert_eq!(s.requested.total_in, s.requested.total_out, "device {d}");
        assert_eq!(s.allocs, s.frees);
    }
    p.check_settled().unwrap();
}

/// Out of memory with a free block that fits only once another thread's cache gives back its
/// neighbour (found by review: the retry looked for a fit only after a fence).
fn spurious_oom(thread_cache: u64) -> Result<Addr, CudaError> {
    let p = pool_cache(2 * MIB, thread_cache);
    let mut r = None;
    while_a_thread_holds(
        &p,
        || {
            let v: Vec<Addr> = (0..3).map(|_| p.alloc(0, 512 << 10).unwrap()).collect();
            // Two adjacent blocks freed (into the cache), the third kept.
            p.free(v[0], FreeKind::Sync, Some(0));
            p.free(v[1], FreeKind::Sync, Some(0));
        },
        || {
            r = Some(p.alloc(0, MIB));
        },
    );
    r.unwrap()
}

#[test]
fn out_of_memory_uses_what_thread_caches_give_back() {
    assert!(
        spurious_oom(0).is_ok(),
        "without thread caches the request fits"
    );
    assert!(
        spurious_oom(crate::config::DEFAULT_THREAD_CACHE).is_ok(),
        "with thread caches: spurious OOM"
    );
}

/// A free by another thread of a block an exited thread's cache handed out, racing the sweep
/// that adopts that block into the live map: the free checks the live maps first, then the
/// caches; the sweep may move the block from the second to the first in between.
#[test]
fn a_free_racing_the_sweep_of_an_exited_threads_cache_succeeds() {
    let p = pool_cache(80 << 30, crate::config::DEFAULT_THREAD_CACHE);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut invalid = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                p.sync_point(0);
            }
        });
        for _ in 0..1000 {
            let kept = on_thread(|| {
                (0..16)
                    .map(|_| p.alloc(0, 4096).unwrap())
                    .collect::<Vec<_>>()
            });
            for a in kept {
                match p.free(a, FreeKind::Sync, Some(0)) {
                    FreeOutcome::Freed => {}
                    _ => invalid += 1,
                }
            }
            if invalid > 0 {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(
        invalid,
        0,
        "valid frees refused; blocks leaked: {:?}",
        stats(&p, 0).blocks.current
    );
}

/// `Pool::check` while another thread allocates through its cache: blocks between the device
/// (which lent them) and the cache (which has not recorded them yet) are allowed for.
#[test]
fn check_allows_for_blocks_on_their_way_to_a_cache() {
    let p = pool_cache(80 << 30, crate::config::DEFAULT_THREAD_CACHE);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let size = 512 << (i % 12);
                let a = p.alloc(0, size).unwrap();
                p.free(a, FreeKind::Sync, Some(0));
                i += 1;
            }
        });
        let mut err = None;
        for _ in 0..20000 {
            if let Err(e) = p.check() {
                err = Some(e);
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(err.is_none(), "{err:?}");
    });
}

/// `forget_all` moves every gauge's current value to its total out: the caches' blocks must be
/// settled first, or the totals no longer balance.
#[test]
fn a_device_reset_with_thread_caches_keeps_the_totals_balanced() {
    let p = shared_relaxed(80 << 30);
    let a = p.alloc(0, 4096).unwrap();
    p.free(a, FreeKind::Sync, Some(0));
    let before = stats(&p, 0);
    assert_eq!(
        before.allocated.total_in, before.allocated.total_out,
        "{before:?}"
    );
    p.forget_device(0);
    let s = stats(&p, 0);
    assert_eq!(
        (
            s.allocated.total_in,
            s.blocks.total_in,
            s.requested.total_in
        ),
        (
            s.allocated.total_out,
            s.blocks.total_out,
            s.requested.total_out
        ),
        "{s:?}"
    );
}

/// A reset while another thread's free is on its way from its cache to the device (the cache
/// counted the free; the device still holds the block lent): `before` sets up what the free sends
/// back. Found in review: `forget_all` counted such blocks as freed once more.
fn reset_during_a_cache_give_back(thread_cache: u64, before: impl FnOnce(&Pool<Model>) + Send) {
    let p = pool_cache(80 << 30, thread_cache);
    let (to_main, from_b) = std::sync::mpsc::channel();
    let (to_b, from_main) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let p = &p;
        let b = s.spawn(move || {
            let blocks: Vec<Addr> = (0..3).map(|_| p.alloc(0, 4096).unwrap()).collect();
            for &a in &blocks[..2] {
                assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
            }
            to_main.send(blocks[2]).unwrap();
            from_main.recv().unwrap();
            // Blocks in the device's lock, after the cache took the block out.
            assert_eq!(
                p.free(blocks[2], FreeKind::Sync, Some(0)),
                FreeOutcome::Freed
            );
        });
        let last = from_b.recv().unwrap();
        let slot = p.existing(0).unwrap();
        let mut dev = Pool::<Model>::lock(slot);
        before(p);
        to_b.send(()).unwrap();
        while slot
            .caches
            .caches()
            .iter()
            .any(|c| c.state.lock().out.contains_key(&last))
        {
            std::thread::yield_now();
        }
        Pool::<Model>::forget_locked(slot, &mut dev);
        drop(dev);
        b.join().unwrap();
    });
    let s = stats(&p, 0);
    assert_eq!((s.allocs, s.frees, s.resets), (5, 5, 1), "{s:?}");
    assert_eq!(
        (s.allocated.current, s.requested.current, s.blocks.current),
        (0, 0, 0),
        "{s:?}"
    );
    assert_eq!(
        (
            s.allocated.total_in,
            s.requested.total_in,
            s.blocks.total_in
        ),
        (
            s.allocated.total_out,
            s.requested.total_out,
            s.blocks.total_out
        ),
        "{s:?}"
    );
    assert_eq!(s.requested.total_in, 5 * 4096, "{s:?}");
    p.check_settled().unwrap();
}

#[test]
fn a_reset_during_a_free_that_gives_its_block_back_counts_it_freed_once() {
    // Caches turned off meanwhile (as a release threshold does): the free sends its block back.
    reset_during_a_cache_give_back(crate::config::DEFAULT_THREAD_CACHE, |p| {
        p.existing(0)
            .unwrap()
            .flags
            .enabled
            .store(false, Ordering::Relaxed);
    });
}

#[test]
fn a_reset_during_a_free_that_spills_a_full_cache_keeps_the_totals_balanced() {
    // Two 4 KiB blocks fill the cache: the third free sends the oldest back.
    reset_during_a_cache_give_back(8192, |_| {});
}

/// Resets racing two threads that allocate and free through their caches: whatever the
/// interleaving (a block on its way into or out of a cache), every gauge's totals stay equal
/// to its current value's history.
#[test]
fn resets_racing_thread_caches_keep_every_gauge_balanced() {
    let p = pool_cache(80 << 30, 64 << 10);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (p, stop) = (&p, &stop);
            s.spawn(move || {
                let mut rng = t + 1;
                let mut held = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    rng = rng
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let size = 512 << ((rng >> 33) % 8);
                    // A request may fail while the device resets; a block a reset forgot is
                    // no longer the pool's to free.
                    if let Ok(a) = p.alloc(0, size) {
                        held.push(a);
                    }
                    if held.len() > 4 || (rng >> 40) % 3 == 0 {
                        if let Some(a) = held.pop() {
                            p.free(a, FreeKind::Sync, Some(0));
                        }
                    }
                }
            });
        }
        for _ in 0..300 {
            std::thread::sleep(std::time::Duration::from_micros(200));
            p.forget_device(0);
        }
        stop.store(true, Ordering::Relaxed);
    });
    let s = stats(&p, 0);
    for (name, g) in [
        ("allocated", s.allocated),
        ("requested", s.requested),
        ("blocks", s.blocks),
    ] {
        assert_eq!(g.total_in - g.total_out, g.current, "{name}: {s:?}");
    }
    assert!(s.resets >= 300 && s.thread_cache_hits > 0, "{s:?}");
    p.check_settled().unwrap();
}

/// A split's remainder (stamp S) absorbs a neighbour held for the same stream but freed
/// later (stamp T > S); the merged block then waits only for a sync covering S.
#[test]
fn a_split_remainder_waits_for_the_later_free_of_a_neighbour_it_absorbs() {
    let p = relaxed();
    // One 20 MiB medium segment: x 4 | l 2 | n 4 | t 10.
    let x = p.alloc_on(0, 4 * MIB, Some(5)).unwrap();
    let l = p.alloc(0, 2 * MIB).unwrap();
    let n = p.alloc_on(0, 4 * MIB, Some(5)).unwrap();
    let _t = p.alloc(0, 10 * MIB).unwrap();
    assert_eq!((l, n), (x + 4 * MIB, x + 6 * MIB));
    // An idle segment for empty_cache to release later.
    let y = p.alloc(0, 12 * MIB).unwrap();
    p.free(y, FreeKind::Sync, None);

    // Stamp S.
    p.free(x, on(5, true), Some(0));
    // Another thread's cudaDeviceSynchronize (or a legacy-stream launch) starts here.
    let at = p.seq_before_sync(0);
    // Reusable at once: Free.
    p.free(l, FreeKind::Sync, None);
    // Stamp T, after the sync started; absorbs l.
    p.free(n, on(5, true), Some(0));
    // Stream 5 takes 2 MiB of x; the 2 MiB remainder (stamp S) absorbs l+n.
    assert_eq!(p.alloc_on(0, 2 * MIB, Some(5)).unwrap(), x);
    // Any segment release (empty_cache, or a release threshold after any alloc) drops the
    // stale queue entries that happened to sit in front of the remainder's.
    assert_eq!(p.empty_cache(0), 12 * MIB);
    // The sync completes: it covers S, not T.
    p.observe_barrier(0, at);
    let q = p.alloc(0, 8 * MIB).unwrap();
    p.check().unwrap();
    // The pool's own barrier would cover n; the program's, begun before n's free, does not.
    assert!(
        q + 8 * MIB <= n || q >= n + 4 * MIB || p.backend().get(|s| s.barriers + s.fences) > 0,
        "plain alloc {q:#x}+8MiB overlaps n {n:#x}+4MiB, freed on stream 5 after the sync began"
    );
}

/// The trace numbers streams up to 16 383; later ones share the last number (found in review:
/// past 65 535 streams the numbers wrapped round, and a debug build panicked).
#[test]
fn trace_stream_numbers_saturate_past_16383_streams() {
    let (p, sink) = traced_relaxed();
    for s in 0..65_540u64 {
        let a = p.alloc_on(0, 512, Some(1000 + s)).unwrap();
        p.free(a, FreeKind::Sync, None);
    }
    p.flush_trace();
    let records = sink.records();
    let ids: Vec<u16> = records
        .iter()
        .filter(|r| r.kind == trace::Kind::Alloc)
        .map(|r| r.aux)
        .collect();
    assert_eq!(ids.len(), 65_540);
    let wrong: Vec<(usize, u16)> = ids
        .iter()
        .enumerate()
        .filter(|&(i, &id)| usize::from(id) != (i + 1).min((1 << 14) - 1))
        .map(|(i, &id)| (i, id))
        .collect();
    assert!(
        wrong.is_empty(),
        "streams numbered wrongly: {:?}",
        &wrong[..wrong.len().min(5)]
    );
}

/// Stream-ordered reuse under random traffic (from a review): allocations and frees on up to 40
/// streams and the legacy stream, blocking and not, frees on another stream than the
/// allocation's, program barriers and fences, empty_cache and device resets. A block freed on
/// a stream goes to another stream (or a plain request) only after a barrier (blocking stream)
/// or a fence covers it; no block is handed out twice; `check()` holds after every step.
#[test]
fn random_stream_traffic_never_hands_a_block_to_another_stream_early() {
    for seed in 0..400u64 {
        let p = pool_with(ReuseMode::Relaxed, DeviceBytes::Unbounded, 4 << 30);
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        // live: addr -> (size, stream)
        let mut live: Vec<(Addr, u64, Option<StreamKey>)> = Vec::new();
        // taints: (addr, size, stream, blocking)
        let mut taints: Vec<(Addr, u64, StreamKey, bool)> = Vec::new();
        let nstreams = 1 + next() % 40;
        for step in 0..3000 {
            let before = p.backend().get(|s| (s.fences, s.barriers));
            let op = next() % 100;
            if op < 50 || live.is_empty() {
                let size = if next() % 3 == 0 {
                    (1 + next() % 30) << 20
                } else {
                    512 * (1 + next() % 2048)
                };
                let stream = (next() % 8 != 0).then(|| next() % nstreams);
                let stream = stream.map(|s| if s == 0 { LEGACY_STREAM } else { s });
                let Ok(a) = p.alloc_on(0, size, stream) else {
                    continue;
                };
                let after = p.backend().get(|s| (s.fences, s.barriers));
                if after.0 > before.0 {
                    taints.clear();
                } else if after.1 > before.1 {
                    taints.retain(|t| !t.3);
                }
                for t in &taints {
                    let overlap = a < t.0 + t.1 && t.0 < a + size;
                    assert!(
                        !overlap || stream == Some(t.2),
                        "seed {seed} step {step}: {a:#x}+{size} on {stream:?} under work of stream {} freed at {:#x}+{} blocking {} stream_hits {}",
                        t.2, t.0, t.1, t.3, stats(&p, 0).stream_hits
                    );
                }
                taints.retain(|t| !(a < t.0 + t.1 && t.0 < a + size));
                for l in &live {
                    assert!(a + size <= l.0 || l.0 + l.1 <= a, "handed out twice");
                }
                live.push((a, size, stream));
            } else if op < 90 {
                let i = (next() as usize) % live.len();
                let (a, size, s) = live.swap_remove(i);
                let blocking = next() % 4 != 0;
                let stream = match s {
                    Some(s) if next() % 5 != 0 => s,
                    _ => 1 + next() % nstreams,
                };
                if next() % 10 == 0 {
                    p.free(a, FreeKind::Sync, Some(0));
                } else {
                    p.free(a, on(stream, blocking), Some(0));
                    taints.push((a, size, stream, blocking));
                }
            } else if op < 95 {
                let at = p.seq_before_sync(0);
                p.observe_barrier(0, at);
                taints.retain(|t| !t.3);
            } else if op < 98 {
                let at = p.seq_before_sync(0);
                p.observe_fence(0, at);
                taints.clear();
            } else if op == 99 && next() % 4 == 0 {
                p.forget_device(0);
                live.clear();
                taints.clear();
            } else {
                p.empty_cache(0);
                let after = p.backend().get(|s| (s.fences, s.barriers));
                if after.0 > before.0 {
                    taints.clear();
                }
            }
            p.check()
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
        }
    }
}

/// `max_split_size` concerns large blocks only (from review): with small segments larger than
/// the smallest setting, a small segment's remainder must still serve small requests.
#[test]
fn small_requests_fill_a_small_segment_whatever_the_max_split_size() {
    for mss in [2 * MIB, 3 * MIB, 4 * MIB, 64 * MIB] {
        let mut p = relaxed();
        p.settings.policy.max_split_size = mss;
        let v: Vec<Addr> = (0..SMALL_SEGMENT / MIB)
            .map(|_| p.alloc(0, MIB).unwrap())
            .collect();
        p.check().unwrap();
        let s = stats(&p, 0);
        assert_eq!(
            (s.real_mallocs, s.reserved.current),
            (1, SMALL_SEGMENT),
            "max_split_size {mss}"
        );
        // Freed and merged whole, the segment serves small requests again.
        for a in v {
            p.free(a, FreeKind::Sync, None);
        }
        for _ in 0..2 * SMALL_SEGMENT / MIB {
            let a = p.alloc(0, 512).unwrap();
            p.free(a, FreeKind::Sync, None);
        }
        assert_eq!(stats(&p, 0).real_mallocs, 1, "max_split_size {mss}");
        p.check().unwrap();
    }
}

/// What `cudaMemGetInfo` tells the program: whole free segments count as free, also those
/// whose free blocks sit in thread caches; a segment with a live block does not; under a
/// limit the device looks the limit's size.
#[test]
fn the_program_sees_whole_free_segments_as_free_memory() {
    let p = shared_relaxed(1 << 30);
    let driver = |p: &Pool<Model>| p.backend().memory_info(0).unwrap();
    // Another thread's cache, alive, holds the free blocks of a whole small segment.
    let fill = |p: &Pool<Model>| {
        let blocks: Vec<Addr> = (0..16).map(|_| p.alloc(0, 200_000).unwrap()).collect();
        for a in blocks {
            assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
        }
    };
    beside_a_second_cache(&p, fill, || {
        let (free, total) = driver(&p);
        assert!(free < total);
        assert_eq!(p.memory_for_program(0, free, total), (total, total));
    });
    assert!(stats(&p, 0).thread_cache_borrowed > 0);
    // A live block keeps its segment: the rest of that segment is not free to the program.
    let a = p.alloc(0, 200_000).unwrap();
    let (free, total) = driver(&p);
    assert_eq!(p.memory_for_program(0, free, total), (free, total));
    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    // Under a limit: the limit's size, less what live blocks' segments hold.
    assert_eq!(
        program_memory(free, total, 4 * MIB, 0, 64 * MIB),
        (60 * MIB, 64 * MIB)
    );
    assert_eq!(
        program_memory(free, total, 4 * MIB, 4 * MIB, 64 * MIB),
        (64 * MIB, 64 * MIB)
    );
    // The driver's free memory bounds it too, and a limit above the device changes nothing.
    assert_eq!(program_memory(MIB, total, 0, 0, 64 * MIB), (MIB, 64 * MIB));
    assert_eq!(program_memory(MIB, total, 0, 0, u64::MAX - 1), (MIB, total));
}
