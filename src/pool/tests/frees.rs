//! Frees (`free.rs`): on any device, from any thread's cache; wild, interior and double frees
//! refused.

use super::*;

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
