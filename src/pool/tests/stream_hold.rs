//! Stream-ordered reuse (`device/stream_hold.rs`): in relaxed mode a block freed on a stream
//! serves that stream at once, and others only once a barrier or fence covers it.

use super::*;

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
    let p = classic_relaxed();
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
    // Each block taken from the held ones (and each merge) must not leave a queue entry that
    // only a barrier or fence clears: such a stream never needs one, and 100 000 pairs would
    // leave 300 002 entries.
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
    let p = classic_relaxed();
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
    assert_eq!(p.backend().counts().barriers, 0);
    p.check().unwrap();
}

#[test]
fn a_small_block_freed_on_a_stream_leaves_its_free_neighbours_to_everyone() {
    // Small blocks are held alone: a stream that frees and allocates small tensors in turn
    // would otherwise merge the rest of the 2 MiB segment into each freed block and split it off
    // again on the next allocation (most of the pair's cost), while other streams would need a
    // barrier for memory nobody used.
    let p = classic_relaxed();
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
    assert_eq!(p.backend().counts().barriers, 1);
    assert_eq!(stats(&p, 0).stream_hits, 0);
    p.free(a, on(6, true), Some(0));
    // Released with the rest of the cache (the held block goes with its segment).
    assert_eq!(p.empty_cache(0), 12 * MIB);
    p.check().unwrap();
}

/// A split's remainder (stamp S) absorbs a neighbour held for the same stream but freed
/// later (stamp T > S); the merged block then waits only for a sync covering S.
#[test]
fn a_split_remainder_waits_for_the_later_free_of_a_neighbour_it_absorbs() {
    let p = classic_relaxed();
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
        q + 8 * MIB <= n || q >= n + 4 * MIB || syncs(&p) > 0,
        "plain alloc {q:#x}+8MiB overlaps n {n:#x}+4MiB, freed on stream 5 after the sync began"
    );
}

/// Stream-ordered reuse under random traffic: allocations and frees on up to 40
/// streams and the legacy stream, blocking and not, frees on another stream than the
/// allocation's, program barriers and fences, empty_cache and device resets. A block freed on
/// a stream goes to another stream (or a plain request) only after a barrier (blocking stream)
/// or a fence covers it; no block is handed out twice; `check()` holds after every step.
#[test]
fn random_stream_traffic_never_hands_a_block_to_another_stream_early() {
    // 200 seeds of 3 000 steps, `check()` after each: still the suite's longest test.
    for seed in 0..200u64 {
        let p = pool_with(ReuseMode::Relaxed, DeviceBytes::Unbounded, 4 << 30);
        let mut next = xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        // live: addr -> (size, stream)
        let mut live: Vec<(Addr, u64, Option<StreamKey>)> = Vec::new();
        // taints: (addr, size, stream, blocking)
        let mut taints: Vec<(Addr, u64, StreamKey, bool)> = Vec::new();
        let nstreams = 1 + next() % 40;
        for step in 0..3000 {
            let before = p.backend().counts();
            let op = next() % 100;
            if op < 50 || live.is_empty() {
                let size = if next().is_multiple_of(3) {
                    (1 + next() % 30) << 20
                } else {
                    512 * (1 + next() % 2048)
                };
                let stream = (!next().is_multiple_of(8)).then(|| next() % nstreams);
                let stream = stream.map(|s| if s == 0 { LEGACY_STREAM } else { s });
                let Ok(a) = p.alloc_on(0, size, stream) else {
                    continue;
                };
                let after = p.backend().counts();
                if after.fences > before.fences {
                    taints.clear();
                } else if after.barriers > before.barriers {
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
                let blocking = !next().is_multiple_of(4);
                let stream = match s {
                    Some(s) if !next().is_multiple_of(5) => s,
                    _ => 1 + next() % nstreams,
                };
                if next().is_multiple_of(10) {
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
            } else if op == 99 && next().is_multiple_of(4) {
                p.forget_device(0);
                live.clear();
                taints.clear();
            } else {
                p.empty_cache(0);
                let after = p.backend().counts();
                if after.fences > before.fences {
                    taints.clear();
                }
            }
            p.check()
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
        }
    }
}

/// The stats of device 0 without the times the backend took, which differ from run to run.
fn untimed(p: &Pool<ModelDriver>) -> DeviceStats {
    let mut s = stats(p, 0);
    (s.real_malloc_ns, s.real_free_ns, s.fence_ns) = (0, 0, 0);
    s
}

/// The hit path serves blocks held for a stream (`DevicePool::alloc_hit`) as the general path
/// does: the same traffic through `alloc_on` and through `alloc_general` alone (which never
/// tries the hit) hands out the same addresses with the same stats and backend calls, in
/// `strict` mode with the runtime's own stream-ordered frees (`cudaMallocAsync`'s route) and in
/// `relaxed` mode, with program fences and barriers between.
#[test]
fn held_blocks_served_by_the_hit_path_are_those_the_general_path_serves() {
    for (reuse, seed) in [ReuseMode::Strict, ReuseMode::Relaxed]
        .into_iter()
        .flat_map(|r| (0..40u64).map(move |s| (r, s)))
    {
        let hit = pool_with(reuse, DeviceBytes::Unbounded, 4 << 30);
        let general = pool_with(reuse, DeviceBytes::Unbounded, 4 << 30);
        let mut next = xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut live: Vec<(Addr, StreamKey)> = Vec::new();
        for step in 0..2000 {
            let op = next() % 100;
            if op < 50 || live.is_empty() {
                // Sizes repeat, some large: most requests find a held block, some split one.
                let size = match next() % 4 {
                    0 => (1 + next() % 6) << 20,
                    _ => 512 << (next() % 11),
                };
                let stream = if next().is_multiple_of(3) {
                    7
                } else {
                    LEGACY_STREAM
                };
                let a = hit.alloc_on(0, size, Some(stream));
                let b = general.alloc_general(0, size, Some(stream), 0);
                assert_eq!(a, b, "{reuse:?} seed {seed} step {step}: {size} bytes");
                if let Ok(a) = a {
                    live.push((a, stream));
                }
            } else if op < 94 {
                let (a, stream) = live.swap_remove((next() as usize) % live.len());
                let kind = match reuse {
                    ReuseMode::Relaxed => on(stream, next().is_multiple_of(2)),
                    _ => FreeKind::Ordered { stream },
                };
                assert_eq!(hit.free(a, kind, Some(0)), FreeOutcome::Freed);
                assert_eq!(general.free(a, kind, Some(0)), FreeOutcome::Freed);
            } else if op < 97 {
                for p in [&hit, &general] {
                    let at = p.seq_before_sync(0);
                    p.observe_barrier(0, at);
                }
            } else {
                for p in [&hit, &general] {
                    let at = p.seq_before_sync(0);
                    p.observe_fence(0, at);
                }
            }
            assert_eq!(untimed(&hit), untimed(&general), "seed {seed} step {step}");
            assert_eq!(hit.backend().counts(), general.backend().counts());
        }
        assert!(stats(&hit, 0).stream_hits > 0);
        hit.check().unwrap();
    }
}

#[test]
fn a_runtime_stream_ordered_free_serves_its_stream_at_once_with_thread_caches_on() {
    // `cudaMallocAsync` names its stream in every mode, and its `cudaFreeAsync` promises stream
    // order: the stream's next request takes the block back at once, as without thread caches.
    // A thread cache holds no block for a stream: such requests go to the device.
    for reuse in [ReuseMode::Strict, ReuseMode::Barrier] {
        let p = pool_cache_in(reuse, 80 << 30, crate::config::DEFAULT_THREAD_CACHE);
        for _ in 0..100 {
            let a = p.alloc_on(0, 4096, Some(5)).unwrap();
            p.free(a, FreeKind::Ordered { stream: 5 }, Some(0));
            assert_eq!(p.alloc_on(0, 4096, Some(5)).unwrap(), a, "{reuse:?}");
            p.free(a, FreeKind::Ordered { stream: 5 }, Some(0));
        }
        assert_eq!(syncs(&p), 0, "{reuse:?}");
        p.check().unwrap();
    }
}
