//! New segments (`device/grow.rs`): room to grow for a record request, the idle segments it
//! outgrew, a barrier or fence before growing.

use super::*;
use crate::pool::size::SMALL_SEGMENT;

#[test]
fn a_new_largest_request_gets_room_to_grow() {
    let p = classic_relaxed();
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
    let t = classic_pool_with(ReuseMode::Relaxed, DeviceBytes::Bytes(1 << 40), 80 << 30);
    t.alloc(0, 600 * MIB).unwrap();
    assert_eq!(stats(&t, 0).reserved.current, 600 * MIB);
    // Nor with a maximum split size.
    let mut split_capped = Settings::for_tests(ReuseMode::Relaxed, DeviceBytes::Unbounded, false);
    split_capped.policy.max_split_size = 256 * MIB;
    let m = Pool::new(classic_model(80 << 30), split_capped);
    m.alloc(0, 600 * MIB).unwrap();
    assert_eq!(stats(&m, 0).reserved.current, 600 * MIB);
    // Near the capacity, a refused rounded segment is asked for again at the exact size
    // before anything cached is released.
    let q = classic_pool_with(ReuseMode::Relaxed, DeviceBytes::Unbounded, 700 * MIB);
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
    let p = classic_relaxed();
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
    assert_eq!(s.reserved.peak_ever(), (700 + 200 + 1000) * MIB);
    assert_eq!(
        (s.outgrown_releases, s.outgrown_released_bytes),
        (1, 768 * MIB)
    );
    assert_eq!((s.real_mallocs, s.real_frees), (4, 1));
    assert_eq!(p.backend().reserved_on(0), s.reserved.current);
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
    let mut q = classic_pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
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
    let t = classic_pool_with(ReuseMode::Relaxed, DeviceBytes::Bytes(1 << 40), 80 << 30);
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
    let p = classic_relaxed();
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
        s.reserved.peak_ever(),
        (200 + 768) * MIB,
        "never the old and the new at once"
    );
    p.check().unwrap();
}

#[test]
fn free_blocks_in_thread_caches_do_not_keep_an_outgrown_segment() {
    // Medium blocks carved from a big segment's room and cached by a thread must not keep the
    // segment busy, or the record behind them releases nothing.
    let p = classic_relaxed();
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
fn the_first_large_request_leaves_thread_caches_alone() {
    // With nothing of 512 MiB or more to outgrow, the first such request has no reason to
    // empty every thread cache.
    let p = classic_relaxed();
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
    // The barrier the pool issues before growing puts the block in its bin: the fit that
    // follows must look there, or the pool grows beside it. The same with a fence in strict
    // mode (a budget the one block reaches).
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
        let counts = p.backend().counts();
        let syncs = (counts.barriers, counts.fences);
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
