//! Giving memory back (`device/release.rs`, `control.rs`): the release threshold,
//! empty-cache, device resets, and resets racing thread caches.

use super::*;

#[test]
fn threshold_releases_whole_free_segments_at_the_next_operation() {
    let p = classic_pool_with(ReuseMode::Relaxed, DeviceBytes::Bytes(256 * MIB), 80 << 30);
    let v: Vec<Addr> = (0..16).map(|_| p.alloc(0, 64 * MIB).unwrap()).collect();
    assert_eq!(p.backend().reserved_on(0), 1024 * MIB);
    for a in v {
        p.free(a, FreeKind::Sync, None);
    }
    // Nothing released inside the frees themselves.
    assert_eq!(p.backend().reserved_on(0), 1024 * MIB);
    p.sync_point(0);
    assert_eq!(p.backend().reserved_on(0), 256 * MIB);
    let s = stats(&p, 0);
    assert_eq!(s.threshold_releases, 12);
    assert_eq!(s.threshold_released_bytes, 768 * MIB);
    assert_eq!(s.reserved.current, 256 * MIB);
    p.check().unwrap();
}

#[test]
fn without_threshold_everything_stays_cached() {
    let p = classic_relaxed();
    let v: Vec<Addr> = (0..16).map(|_| p.alloc(0, 64 * MIB).unwrap()).collect();
    for a in v {
        p.free(a, FreeKind::Sync, None);
    }
    p.sync_point(0);
    assert_eq!(p.backend().reserved_on(0), 1024 * MIB);
    assert_eq!(p.empty_cache(0), 1024 * MIB);
    assert_eq!(p.backend().reserved_on(0), 0);
    assert_eq!(stats(&p, 0).empty_cache_releases, 16);
}

#[test]
fn trim_to_keeps_at_most_what_it_was_told_of_reserved_memory() {
    let p = classic_relaxed();
    let v: Vec<Addr> = (0..16).map(|_| p.alloc(0, 64 * MIB).unwrap()).collect();
    for &a in &v[..12] {
        p.free(a, FreeKind::Sync, None);
    }
    // 1 GiB reserved, 256 MiB of it live: trimming to 512 MiB releases 8 of the 12 free
    // segments, and nothing live.
    assert_eq!(p.trim_to(0, 512 * MIB), 512 * MIB);
    assert_eq!(p.backend().reserved_on(0), 512 * MIB);
    // Below what is live, every free segment goes.
    assert_eq!(p.trim_to(0, MIB), 256 * MIB);
    assert_eq!(p.backend().reserved_on(0), 256 * MIB);
    assert_eq!(stats(&p, 0).empty_cache_releases, 12);
    p.check().unwrap();
}

#[test]
fn a_reset_peak_restarts_from_now_and_the_runs_peak_stays() {
    let p = relaxed();
    let v: Vec<Addr> = (0..4).map(|_| p.alloc(0, 64 * MIB).unwrap()).collect();
    for &a in &v[..3] {
        p.free(a, FreeKind::Sync, None);
    }
    p.reset_peak(0, false);
    let s = stats(&p, 0);
    assert_eq!(s.allocated.peak, 64 * MIB);
    assert_eq!(s.allocated.peak_ever(), 256 * MIB);
    // The reserved peak was not reset.
    assert_eq!(s.reserved.peak, 256 * MIB);
    p.empty_cache(0);
    p.reset_peak(0, true);
    p.alloc(0, 64 * MIB).unwrap();
    let s = stats(&p, 0);
    assert_eq!(
        (s.reserved.peak, s.reserved.peak_ever()),
        (128 * MIB, 256 * MIB)
    );
    assert_eq!(
        (s.allocated.peak, s.allocated.peak_ever()),
        (128 * MIB, 256 * MIB)
    );
}

#[test]
fn percentage_threshold_uses_device_memory() {
    let p = pool_with(ReuseMode::Relaxed, DeviceBytes::Fraction(0.25), 1 << 30);
    p.alloc(0, 512).unwrap();
    assert_eq!(p.device_stats(0).unwrap().threshold, 256 * MIB);
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

#[test]
fn a_threshold_for_an_unused_device_waits_for_it_and_the_users_outranks_the_programs() {
    let p = pool_with(ReuseMode::Relaxed, DeviceBytes::Bytes(8 * MIB), 1 << 30);
    // The program's threshold on an unused device: no pool made for it, so no CUDA call.
    assert!(p.adopt_program_threshold(2, 3 * MIB));
    assert!(p.used_devices().is_empty());
    assert_eq!(p.threshold(2), 3 * MIB);
    let a = p.alloc(2, MIB).unwrap();
    assert_eq!(p.threshold(2), 3 * MIB, "the device started with it");
    // The user's choice for one device outranks the program's from then on.
    assert!(p.set_device_threshold(2, 0));
    assert!(!p.adopt_program_threshold(2, u64::MAX));
    assert_eq!(p.threshold(2), 0);
    assert!(p.adopt_program_threshold(1, u64::MAX), "another device");
    // The user's choice for every device replaces the earlier ones and outranks the program's.
    p.set_threshold(5 * MIB);
    assert_eq!(
        (p.threshold(1), p.threshold(2), p.threshold(7)),
        (5 * MIB, 5 * MIB, 5 * MIB)
    );
    assert!(!p.adopt_program_threshold(7, 0));
    assert!(!p.adopt_program_threshold(MAX_DEVICES as u32, 0));
    assert_eq!(p.free(a, FreeKind::Sync, None), FreeOutcome::Freed);
    p.check().unwrap();
}

#[test]
fn a_program_threshold_bounds_the_reserved_bytes_and_the_users_the_cached_ones() {
    // Device 1's threshold is set before its first use: it starts with CUDA's meaning.
    let p = classic_relaxed();
    assert!(p.adopt_program_threshold(1, 128 * MIB));
    for d in [0, 1] {
        let v: Vec<Addr> = (0..4).map(|_| p.alloc(d, 64 * MIB).unwrap()).collect();
        for &a in &v[1..] {
            p.free(a, FreeKind::Sync, None);
        }
    }
    assert!(p.adopt_program_threshold(0, 128 * MIB));
    p.sync_point(0);
    // 64 MiB in use: as CUDA's pool, each keeps 64 MiB of cache, 128 MiB reserved.
    for d in [0, 1] {
        assert_eq!(p.backend().reserved_on(d), 128 * MIB, "device {d}");
    }
    // The user's threshold counts the cache alone: 128 MiB of it beside the block in use.
    let a = p.alloc(0, 64 * MIB).unwrap();
    p.free(a, FreeKind::Sync, None);
    assert!(p.set_device_threshold(0, 128 * MIB));
    let b = p.alloc(0, 64 * MIB).unwrap();
    let c = p.alloc(0, 64 * MIB).unwrap();
    p.free(b, FreeKind::Sync, None);
    p.free(c, FreeKind::Sync, None);
    p.sync_point(0);
    assert_eq!(p.backend().reserved_on(0), 192 * MIB);
    // Live bytes past the program's threshold: no cache kept at all.
    assert!(p.adopt_program_threshold(1, 32 * MIB));
    p.sync_point(1);
    assert_eq!(p.backend().reserved_on(1), 64 * MIB);
    p.check().unwrap();
}

/// A threshold the program set waits for a synchronization, as CUDA's pool does: allocations
/// that take the bytes in use past it give nothing back in between (each segment given back
/// is a `cudaFree` that waits for the device, inside the program's allocation).
#[test]
fn a_program_threshold_gives_back_at_synchronizations_only() {
    let p = classic_relaxed();
    assert!(p.adopt_program_threshold(0, 128 * MIB));
    let v: Vec<Addr> = (0..4).map(|_| p.alloc(0, 64 * MIB).unwrap()).collect();
    p.free(v[0], FreeKind::Sync, None);
    p.free(v[1], FreeKind::Sync, None);
    let frees = p.backend().counts().frees;
    let w = p.alloc(0, MIB).unwrap();
    assert_eq!(
        p.backend().counts().frees,
        frees,
        "a segment went back inside an allocation"
    );
    p.sync_point(0);
    assert!(p.backend().counts().frees > frees);
    p.free(w, FreeKind::Sync, None);
    p.check().unwrap();
}

#[test]
fn device_reset_forgets_without_freeing() {
    let p = relaxed();
    let a = p.alloc(0, MIB).unwrap();
    let b = p.alloc(1, MIB).unwrap();
    p.forget_device(0);
    assert_eq!(p.backend().counts().frees, 0);
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

/// A free of memory a reset took back asks the driver what starts there now. Nothing: the free
/// is refused, as CUDA refuses it (passed on, it would free what the driver gives there next:
/// the pool's next segment, whose blocks other threads then hold, and which the driver gives
/// again). An allocation of another allocator: CUDA's to free.
#[test]
fn a_free_of_memory_a_reset_took_back_never_reaches_what_the_driver_put_there_since() {
    let p = relaxed();
    let a = p.alloc(0, 25 * MIB).unwrap();
    let b = p.alloc(0, 25 * MIB).unwrap();
    p.reset_device(0, || {
        p.backend().forget_device(0);
        true
    });
    assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Invalid);
    assert_eq!(p.backend().counts().frees, 0);
    // The driver says an allocation starts there: another allocator's, CUDA's to free.
    struct Taken(ModelDriver);
    impl AsRef<ModelDriver> for Taken {
        fn as_ref(&self) -> &ModelDriver {
            &self.0
        }
    }
    impl ModelWrapper for Taken {
        fn allocation_starts_at(&self, _addr: Addr) -> Option<bool> {
            Some(true)
        }
    }
    let q = Pool::new(
        Taken(model_of(80 << 30, expandable_on())),
        Settings::for_tests(ReuseMode::Relaxed, DeviceBytes::Unbounded, expandable_on()),
    );
    let c = q.alloc(0, 25 * MIB).unwrap();
    q.forget_device(0);
    assert_eq!(q.free(c, FreeKind::Sync, Some(0)), FreeOutcome::NotOurs);
    // After the reset the pool's blocks are its own again; another dead one stays refused.
    let d = p.alloc(0, 25 * MIB).unwrap();
    assert_eq!(p.free(d, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    assert_eq!(p.free(b, FreeKind::Sync, Some(0)), FreeOutcome::Invalid);
    p.check().unwrap();
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
        assert_eq!(p.backend().reserved_on(0), 0);
    });
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
/// back. `forget_all` must not count such blocks as freed once more.
fn reset_during_a_cache_give_back(
    thread_cache: u64,
    before: impl FnOnce(&Pool<ModelDriver>) + Send,
) {
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
        let mut dev = Pool::<ModelDriver>::lock(slot);
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
        p.forget_locked(slot, &mut dev);
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
        p.existing(0).unwrap().flags.set_enabled(false);
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
