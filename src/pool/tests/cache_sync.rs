//! When thread caches fence and take barriers themselves (`cache_policy.rs`): what they keep
//! reusable, their fence share, barrier batches.

use super::*;
use crate::pool::size::SMALL_SEGMENT;

#[test]
fn a_threads_own_fence_is_not_counted_as_a_program_sync() {
    // The summary's "program syncs used" must not count the caches' own fences.
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
    assert_eq!(p.backend().counts().fences, 1);
    p.alloc(0, 12 * MIB).unwrap();
    assert_eq!(stats(&p, 0).observed_fences, 0);
    p.check().unwrap();
}

#[test]
fn a_strict_thread_cache_keeps_at_most_its_bound_of_reusable_blocks() {
    // Blocks a fence made reusable go to the ready lists only within a bound: up to twice the
    // bound or the thread's fence share, whichever is larger (`Pool::cache_keep`).
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

#[test]
fn a_fence_budget_of_none_with_thread_caches_does_not_overflow() {
    // `GPUPOOL_FENCE_BYTES=none` (u64::MAX), doubled in the cache's keep and give-back
    // bounds, must not overflow (a panic in a debug build, every cached call failing).
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
    assert_eq!(p.backend().counts().fences, 0);
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
    let before = p.backend().counts().fences;
    // 2 MiB wait in this thread's cache: the next miss fences without the device's lock and
    // serves from what the fence made reusable.
    let again = p.alloc(0, 512 << 10).unwrap();
    assert!(v.contains(&again));
    assert_eq!(p.backend().counts().fences, before + 1);
    assert_eq!(
        stats(&p, 0).fences,
        before + 1,
        "counted in the device's figures"
    );
    p.check().unwrap();
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
    let fences = || p.backend().counts().fences;
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
        p.backend().counts().barriers,
        stats(&p, 0).barriers,
        "counted once in the device's figures"
    );
    assert_eq!(p.backend().counts().fences, 0);
    p.check().unwrap();
}

#[test]
fn a_thread_takes_barriers_for_its_cache_in_batches_and_not_behind_a_fence() {
    // A thread that frees and allocates one block in turn must not take a barrier (a driver
    // call) on every allocation.
    let p = pool_with(ReuseMode::Barrier, DeviceBytes::Unbounded, 80 << 30);
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.alloc(0, 4096).unwrap(); // caches on
    for _ in 0..2000 {
        let a = p.alloc(0, 256 << 10).unwrap();
        p.free(a, FreeKind::Sync, Some(0));
    }
    let all = p.backend().counts().barriers;
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
