//! Thread caches (`tcache/`, `device/lend.rs`): when they start, their bounds, what one
//! thread's cache lends another, and what comes back when a thread exits.

use super::*;

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
    let p = Pool::new(model(80 << 30), settings);
    let a = p.alloc(0, 4096).unwrap();
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.free(a, FreeKind::Sync, Some(0));
    p.alloc(0, 4096).unwrap();
    assert_eq!(stats(&p, 0).thread_cache_borrowed, 0);
}

/// A trace whose file takes no records (it could not be made, or a write failed) stops
/// costing: the pool records nothing more, and thread caches start as without a trace.
#[test]
fn a_trace_that_takes_no_more_records_stops_and_thread_caches_start() {
    #[derive(Default)]
    struct Refuses {
        chunks: std::sync::atomic::AtomicU32,
    }
    // A file that failed at its first chunk.
    impl TraceSink for Refuses {
        fn write(&self, _: &[u8]) {
            self.chunks.fetch_add(1, Ordering::Relaxed);
        }
        fn on(&self) -> bool {
            self.chunks.load(Ordering::Relaxed) == 0
        }
    }
    let sink = Arc::new(Refuses::default());
    let mut settings = pool_with(ReuseMode::Relaxed, DeviceBytes::Unbounded, 1)
        .settings()
        .clone();
    settings.trace = Some(Arc::clone(&sink) as Arc<dyn TraceSink>);
    let p = Pool::new(model(80 << 30), settings);
    on_thread(|| p.alloc(0, 4096).unwrap());
    // Enough requests to fill a chunk (the file's first write) and reach a sampled allocation.
    for _ in 0..4000 {
        let a = p.alloc(0, 4096).unwrap();
        p.free(a, FreeKind::Sync, Some(0));
    }
    assert_eq!(
        sink.chunks.load(Ordering::Relaxed),
        1,
        "one chunk, then no more records"
    );
    assert!(
        stats(&p, 0).thread_cache_borrowed > 0,
        "thread caches started"
    );
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
    let turn = |p: &Pool<ModelDriver>| {
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
    let turn = |p: &Pool<ModelDriver>| {
        let a = p.alloc(0, 4096).unwrap();
        p.free(a, FreeKind::Sync, Some(0));
    };
    turn(&p);
    on_thread(|| turn(&p));
    let slot = p.existing(0).unwrap();
    for hold_ms in [20, 20, 20, 20, 80, 80, 320, 320, 1280] {
        let held = Pool::<ModelDriver>::lock(slot);
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
    // A thread that waits for the device's lock while the holder synchronizes the device under
    // it (a fence before growing) must not count the wait, or two threads that take turns
    // start caches in strict mode. The holder's time in the backend is left out.
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
        let fences = p.backend().inner.counts().fences;
        std::thread::scope(|t| {
            let waiter = t.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(30));
                let start = std::time::Instant::now();
                turn(&p);
                start.elapsed()
            });
            let again = p.alloc(0, 12 * MIB).unwrap();
            assert_eq!(p.backend().inner.counts().fences, fences + 1);
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

/// A relaxed-mode cache never holds more than its bound, also when freed blocks are larger than
/// half of it (a 4 MiB bound must not hold an 8 MiB block).
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

#[test]
fn blocks_of_an_exited_thread_keep_who_allocated_them() {
    // A thread allocates through its cache (one block served, more lent beside it) and exits
    // holding them; the next allocation makes them the device's live blocks. The reports name
    // their holder by the origin each was allocated with, before and after.
    let p = shared_relaxed(80 << 30);
    const ORIGIN: Origin = 0x7f12_3456_7000;
    let kept = on_thread(|| {
        (0..20)
            .map(|_| p.alloc_from(0, 64 << 10, None, ORIGIN).unwrap())
            .collect::<Vec<Addr>>()
    });
    let origins = |p: &Pool<ModelDriver>| {
        p.live_blocks(0, LockWait::Unbounded)
            .unwrap()
            .into_iter()
            .filter(|b| kept.contains(&b.addr))
            .map(|b| b.origin)
            .collect::<Vec<Origin>>()
    };
    assert_eq!(
        origins(&p),
        vec![ORIGIN; 20],
        "held by the exited thread's cache"
    );
    p.alloc(0, 1 << 20).unwrap();
    assert!(stats(&p, 0).thread_cache_borrowed > 1, "extras were lent");
    assert_eq!(origins(&p), vec![ORIGIN; 20], "adopted by the device");
    p.check().unwrap();
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
fn a_miss_takes_blocks_of_its_size_from_another_threads_cache_and_nothing_else() {
    // The device has no 4 MiB block left; another thread's cache keeps five reusable, besides
    // blocks of other sizes and blocks still waiting for a fence. A miss of 4 MiB takes half of
    // the five (no growth, no fence) and leaves the rest of that cache as it was.
    // Classic segments: an expandable one always has address space left, and maps it rather
    // than take the blocks back (the ignored test of this in expandable.rs).
    let mut p = classic_pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
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
            let fences = p.backend().counts().fences;
            let a = p.alloc(0, 4 * MIB).unwrap();
            assert!(theirs.lock().unwrap().contains(&a));
            assert_eq!(stats(&p, 0).reserved.current, reserved, "no growth");
            assert_eq!(p.backend().counts().fences, fences, "no fence");
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
