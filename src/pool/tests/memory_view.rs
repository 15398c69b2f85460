//! What the pool reports (`inspect.rs`): figures that add up under churn and thread-cache
//! traffic, the largest free block, `cudaMemGetInfo`, the structural check.

use super::*;

#[test]
fn accounting_identities_hold_under_churn() {
    let p = pool_with(ReuseMode::Strict, DeviceBytes::Bytes(64 * MIB), 2 << 30);
    let mut next = xorshift(0x2545_f491_4f6c_dd1d);
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
        assert_eq!(p.backend().reserved_on(0), snap.stats.reserved.current);
    }
}

/// The largest free block counts the reusable blocks thread caches hold; otherwise a thread's
/// cache of forty free 1 MB blocks reads as 100% fragmentation.
#[test]
fn the_largest_free_block_counts_blocks_in_thread_caches() {
    let p = classic_shared_relaxed(80 << 30);
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

/// A report that cannot read a thread cache (its lock stays busy: a thread stopped in the pool)
/// leaves the device unread. Counted without that cache, it would not agree with itself: the
/// cache's blocks missing from the live list, or its counts from the figures.
#[test]
fn a_report_that_cannot_read_a_thread_cache_leaves_the_device_unread() {
    let p = pool_cache(80 << 30, 1 << 20);
    let a = p.alloc(0, 4096).unwrap();
    let slot = p.existing(0).unwrap();
    let c = slot.caches.caches().pop().expect("this thread's cache");
    {
        let _stopped_holder = c.state.lock();
        assert!(p.device_report(0, LockWait::Brief).is_none());
        assert!(p.device_stats_with(0, LockWait::Brief).is_none());
        assert!(p.live_blocks(0, LockWait::Brief).is_none());
    }
    let (snap, live) = p.device_report(0, LockWait::Brief).unwrap();
    assert_eq!((live.len() as u64, snap.stats.blocks.current), (1, 1));
    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
}

/// Reports read while threads allocate and free through their caches: the current values are
/// what the program holds at that moment, blocks on their way between a cache and the device
/// included; counted as the program's, they once made 634 live blocks of at most 256, in 6
/// reads of 40.
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

/// What `cudaMemGetInfo` tells the program: whole free segments count as free, also those
/// whose free blocks sit in thread caches; a segment with a live block does not; under a
/// limit the device looks the limit's size.
#[test]
fn the_program_sees_whole_free_segments_as_free_memory() {
    let p = classic_shared_relaxed(1 << 30);
    let driver = |p: &Pool<ModelDriver>| p.backend().memory_info(0).unwrap();
    // Another thread's cache, alive, holds the free blocks of a whole small segment.
    let fill = |p: &Pool<ModelDriver>| {
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

/// The largest free block is the largest request the cache serves: a free block of the small
/// pool serves requests up to `SMALL_LIMIT` only, so the 3.5 MiB left of a small segment (the
/// 1.5 MiB left of a small range's granule) counts as 1 MiB. Counted whole, the report said
/// 3.5 MiB was free in one block, and a request of 3.5 MiB then took a new segment (or mapped
/// new granules).
#[test]
fn a_request_of_the_largest_free_block_needs_no_new_memory() {
    for vmm in [false, true] {
        let p = if vmm {
            super::expandable::vmm_pool(ReuseMode::Relaxed, DeviceBytes::Unbounded, 80 << 30)
        } else {
            classic_relaxed()
        };
        // One small block: the rest of its small segment (of its mapped granule) is free.
        let live = p.alloc(0, 512 << 10).unwrap();
        let before = p.device_stats(0).unwrap();
        assert_eq!(
            before.largest_free,
            crate::pool::size::SMALL_LIMIT,
            "vmm {vmm}"
        );
        let a = p.alloc(0, before.largest_free).unwrap();
        let after = stats(&p, 0);
        assert_eq!(
            (after.reserved.current, after.misses),
            (before.stats.reserved.current, before.stats.misses),
            "vmm {vmm}: a request of the largest free block took new memory"
        );
        for a in [a, live] {
            assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
        }
        assert_sound(&p);
    }
}

/// Whatever the churn, a request of the largest free block the pool reports is served from
/// the cache: no new segment, no granule mapped. With expandable segments the mapped piece
/// that counts is the one a request is placed on, at a free block's start, and only where
/// that block is the fit a request of its size gets: a larger mapped piece elsewhere in a
/// block, or in a block a smaller one comes before, maps new granules.
#[test]
fn the_largest_free_block_is_served_without_new_memory_after_churn() {
    for vmm in [false, true] {
        let p = if vmm {
            super::expandable::vmm_pool(ReuseMode::Relaxed, DeviceBytes::Unbounded, 80 << 30)
        } else {
            classic_relaxed()
        };
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let mut live: Vec<Addr> = Vec::new();
        for step in 0..3000 {
            let r = next();
            if r % 100 < 55 || live.is_empty() {
                let size = match r % 5 {
                    0 => next() % 4096 + 1,
                    1 => next() % MIB + 1,
                    2 => next() % (10 * MIB) + 1,
                    _ => next() % (40 * MIB) + 1,
                };
                live.push(p.alloc(0, size).unwrap());
            } else {
                let a = live.swap_remove((next() % live.len() as u64) as usize);
                assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
            }
            if step % 100 != 99 {
                continue;
            }
            if step % 300 == 299 {
                p.empty_cache(0);
            }
            let before = p.device_stats(0).unwrap();
            if before.largest_free == 0 {
                continue;
            }
            let a = p.alloc(0, before.largest_free).unwrap();
            let after = stats(&p, 0);
            assert_eq!(
                (after.reserved.current, after.misses, after.granules_mapped),
                (
                    before.stats.reserved.current,
                    before.stats.misses,
                    before.stats.granules_mapped
                ),
                "vmm {vmm}, step {step}: a request of the largest free block ({} bytes) took new \
                 memory",
                before.largest_free
            );
            assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
        }
        assert_sound(&p);
    }
}
