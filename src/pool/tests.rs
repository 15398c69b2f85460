//! Unit tests of the pool algorithm against a model backend.

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

fn pool_with(reuse: ReuseMode, threshold: Threshold, capacity: u64) -> Pool<Model> {
    Pool::new(
        Model::with_capacity(capacity),
        Settings {
            reuse,
            threshold,
            policy: Policy {
                max_split_size: u64::MAX,
                fence_bytes: 64 * MIB,
            },
            trace: None,
        },
    )
}

fn relaxed() -> Pool<Model> {
    pool_with(ReuseMode::Relaxed, Threshold::KeepAll, 80 << 30)
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
    for _ in 0..4 {
        p.alloc(0, 512 * 1024).unwrap();
    }
    let s = stats(&p, 0);
    assert_eq!(s.real_mallocs, 1);
    assert_eq!(s.reserved.current, 2 * MIB);
    assert_eq!(s.allocated.current, 2 * MIB);
    assert_eq!(s.hits, 3);
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
    let v: Vec<Addr> = (0..4).map(|_| p.alloc(0, 512 << 10).unwrap()).collect();
    for a in &v {
        p.free(*a, FreeKind::Sync, None);
    }
    p.check().unwrap();
    // The same size comes straight back, last freed first.
    assert_eq!(p.alloc(0, 512 << 10).unwrap(), v[3]);
    p.free(v[3], FreeKind::Sync, None);
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
    // A new record: 1 GiB.
    let d = p.alloc(0, 900 * MIB).unwrap();
    assert_eq!(stats(&p, 0).reserved.current, (768 + 702 + 1024) * MIB);
    for x in [b, c, d] {
        p.free(x, FreeKind::Sync, None);
    }
    p.check().unwrap();
    // With a release threshold, segments are never rounded up for growth.
    let t = pool_with(ReuseMode::Relaxed, Threshold::Bytes(1 << 40), 80 << 30);
    t.alloc(0, 600 * MIB).unwrap();
    assert_eq!(stats(&t, 0).reserved.current, 600 * MIB);
    // Nor with a maximum split size.
    let m = Pool::new(
        Model::with_capacity(80 << 30),
        Settings {
            reuse: ReuseMode::Relaxed,
            threshold: Threshold::KeepAll,
            policy: Policy {
                max_split_size: 256 * MIB,
                fence_bytes: 64 * MIB,
            },
            trace: None,
        },
    );
    m.alloc(0, 600 * MIB).unwrap();
    assert_eq!(stats(&m, 0).reserved.current, 600 * MIB);
    // Near the capacity, a refused rounded segment is asked for again at the exact size
    // before anything cached is released.
    let q = pool_with(ReuseMode::Relaxed, Threshold::KeepAll, 700 * MIB);
    let s = q.alloc(0, 10 * MIB).unwrap();
    q.free(s, FreeKind::Sync, None);
    q.alloc(0, 600 * MIB).unwrap();
    let st = stats(&q, 0);
    assert_eq!(st.reserved.current, 620 * MIB);
    assert_eq!((st.real_mallocs, st.oom_retries), (3, 0));
    q.check().unwrap();
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
    let p = pool_with(ReuseMode::Relaxed, Threshold::Bytes(256 * MIB), 80 << 30);
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
    let p = pool_with(ReuseMode::Relaxed, Threshold::Fraction(0.25), 1 << 30);
    p.alloc(0, 512).unwrap();
    assert_eq!(p.device_stats(0).unwrap().threshold, 256 * MIB);
}

#[test]
fn out_of_memory_releases_cache_and_retries() {
    // Strict mode: freed blocks wait for a fence, so recovery must fence, release, retry.
    let p = pool_with(ReuseMode::Strict, Threshold::KeepAll, 64 * MIB);
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
    let p = pool_with(ReuseMode::Strict, Threshold::KeepAll, 64 * MIB);
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
    let p = pool_with(ReuseMode::Strict, Threshold::KeepAll, 3 * MIB);
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
    let p = pool_with(ReuseMode::Strict, Threshold::KeepAll, 80 << 30);
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
    let p = pool_with(ReuseMode::Strict, Threshold::KeepAll, 80 << 30);
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
    let p = pool_with(ReuseMode::Strict, Threshold::KeepAll, 80 << 30);
    let a = p.alloc(0, 4096).unwrap();
    let seq = p.seq_before_sync(0);
    p.free(a, FreeKind::Sync, None);
    p.observe_fence(0, seq);
    assert_ne!(p.alloc(0, 4096).unwrap(), a);
}

#[test]
fn barrier_mode_issues_one_barrier_for_many_blocks() {
    let p = pool_with(ReuseMode::Barrier, Threshold::KeepAll, 80 << 30);
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
    let seq = p.seq_before_sync(0) + 1;
    p.free(w, FreeKind::Sync, None);
    p.observe_barrier(0, seq);
    assert_eq!(p.alloc(0, 12 * MIB).unwrap(), w);
    assert_eq!(p.backend().get(|s| s.barriers), 1);
}

#[test]
fn barrier_mode_falls_back_to_fences_after_a_nonblocking_stream() {
    let p = pool_with(ReuseMode::Barrier, Threshold::KeepAll, 80 << 30);
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
    p.free(a, FreeKind::Async { blocking: false }, None);
    assert_ne!(p.alloc(0, 4096).unwrap(), a);
    p.check().unwrap();
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
    let p = pool_with(ReuseMode::Strict, Threshold::Bytes(64 * MIB), 2 << 30);
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
    let p = Arc::new(pool_with(ReuseMode::Relaxed, Threshold::KeepAll, 80 << 30));
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
    let p = pool_with(ReuseMode::Relaxed, Threshold::Bytes(8 * MIB), 1 << 30);
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
