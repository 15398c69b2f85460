//! Threads on one device against in-flight work (`Hazard`): no block handed out while a
//! "kernel" still uses it, in strict and barrier mode.

use super::*;

/// Allocations per thread and round in the hazard stress.
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
                    let mut rng = crate::rng::Rng::new(round * 100 + t + 1);
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
