//! Fitting and the arena (`device/fit.rs`, `device/arena.rs`): size bins, best fit, splits
//! and merges, the maximum split size.

use super::*;
use crate::pool::size::SMALL_SEGMENT;

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
    let p = classic_relaxed();
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
    let p = classic_relaxed();
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
    let p = classic_relaxed();
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
    let p = classic_relaxed();
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
fn max_split_size_keeps_big_blocks_whole() {
    // Classic segments: under a split cap expandable ones serve no large request (see
    // `a_split_cap_leaves_large_requests_served_from_the_range`).
    let mut p = classic_relaxed();
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
    let p = classic_relaxed();
    // Four 4 MiB blocks and a 4 MiB free tail in one 20 MiB segment.
    let v: Vec<Addr> = (0..4).map(|_| p.alloc(0, 4 * MIB).unwrap()).collect();
    let largest = |p: &Pool<ModelDriver>| p.device_stats(0).unwrap().largest_free;
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

/// Under `GPUPOOL_MAX_SPLIT_SIZE`, a request just below the cap gets a segment rounded up to
/// it: that block serves the same size again. Otherwise 127.5 MiB under a 128 MiB cap takes a
/// new segment per cycle until out of memory.
#[test]
fn a_request_just_under_the_split_cap_reuses_its_own_segment() {
    for reuse in [ReuseMode::Strict, ReuseMode::Relaxed] {
        // Classic segments, as in `max_split_size_keeps_big_blocks_whole`.
        let mut s = classic_pool_with(reuse, DeviceBytes::Unbounded, 1)
            .settings()
            .clone();
        s.policy.max_split_size = 128 * MIB;
        let p = Pool::new(classic_model(1 << 30), s);
        let req = 127 * MIB + MIB / 2;
        for _ in 0..12 {
            let a = p.alloc(0, req).unwrap();
            assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
            let at = p.seq_before_sync(0);
            p.observe_fence(0, at);
        }
        let st = stats(&p, 0);
        assert_eq!(
            (st.real_mallocs, st.reserved.peak_ever(), st.oom_retries),
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

/// `max_split_size` concerns large blocks only: with small segments larger than
/// the smallest setting, a small segment's remainder must still serve small requests.
#[test]
fn small_requests_fill_a_small_segment_whatever_the_max_split_size() {
    for mss in [2 * MIB, 3 * MIB, 4 * MIB, 64 * MIB] {
        let mut p = classic_relaxed();
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
