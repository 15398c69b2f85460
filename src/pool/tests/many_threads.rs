//! Many threads on one or two devices: no block handed out twice, every figure exact.

use super::*;

#[test]
fn threads_share_a_pool_without_handing_out_a_block_twice() {
    let p = Arc::new(pool_with(
        ReuseMode::Relaxed,
        DeviceBytes::Unbounded,
        80 << 30,
    ));
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
fn two_threads_on_one_device_never_share_a_block_and_account_exactly() {
    let p = Arc::new(shared_relaxed(80 << 30));
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let p = Arc::clone(&p);
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                let mut freed = 0u64;
                for i in 0..3000u64 {
                    let size = 512 << ((i * 7 + t * 3) % 14);
                    mine.push((p.alloc(0, size).unwrap(), size));
                    if i % 3 != 0 {
                        let (a, _) = mine.swap_remove((i as usize * 31) % mine.len());
                        assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
                        freed += 1;
                    }
                }
                p.check().unwrap();
                (mine, freed)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut spans: Vec<(Addr, u64)> = results.iter().flat_map(|r| r.0.clone()).collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "live blocks overlap: {w:?}");
    }
    let s = stats(&p, 0);
    assert!(s.thread_cache_hits > 1000, "{s:?}");
    assert_eq!(s.allocs, 2 + 4 * 3000);
    let freed: u64 = results.iter().map(|r| r.1).sum();
    assert_eq!(s.frees, 2 + freed);
    assert_eq!(s.blocks.current, spans.len() as u64);
    assert_eq!(
        s.requested.current,
        spans.iter().map(|&(_, n)| n).sum::<u64>(),
        "requested bytes of the live blocks"
    );
    // The leak list shows every live block, whichever way it was served.
    let mut live: Vec<Addr> = p
        .live_blocks(0, LockWait::Unbounded)
        .unwrap()
        .iter()
        .map(|b| b.addr)
        .collect();
    live.sort();
    assert_eq!(live, spans.iter().map(|s| s.0).collect::<Vec<_>>());
    p.check_settled().unwrap();
}

#[test]
fn thread_caches_account_exactly_with_cross_thread_frees_and_exits() {
    let p = Arc::new(pool_with(
        ReuseMode::Relaxed,
        DeviceBytes::Unbounded,
        80 << 30,
    ));
    let queue = Arc::new(Mutex::new(Vec::<(Addr, u32)>::new()));
    let handles: Vec<_> = (0..6u64)
        .map(|t| {
            let (p, queue) = (Arc::clone(&p), Arc::clone(&queue));
            std::thread::spawn(move || {
                let mut rng = crate::rng::Rng::new(t + 1);
                let mut mine = Vec::new();
                for _ in 0..1500 {
                    let dev = rng.range(0, 1) as u32;
                    let shift = rng.range(0, 12);
                    let size = rng.range(1, (32 << 20) >> shift);
                    mine.push((p.alloc(dev, size).unwrap(), dev));
                    if rng.range(0, 2) == 0 {
                        let (a, d) = mine.swap_remove(rng.range(0, mine.len() as u64 - 1) as usize);
                        if rng.range(0, 2) == 0 {
                            queue.lock().unwrap().push((a, d));
                        } else {
                            assert_eq!(p.free(a, FreeKind::Sync, Some(1 - d)), FreeOutcome::Freed);
                        }
                    }
                    let other = queue.lock().unwrap().pop();
                    if let Some((a, d)) = other {
                        assert_eq!(p.free(a, FreeKind::Sync, Some(d)), FreeOutcome::Freed);
                    }
                }
                mine
            })
        })
        .collect();
    let left: Vec<(Addr, u32)> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    p.check().unwrap();
    for d in 0..2 {
        let s = stats(&p, d);
        let live = left.iter().filter(|x| x.1 == d).count() as u64;
        let queued = queue.lock().unwrap().iter().filter(|x| x.1 == d).count() as u64;
        assert_eq!(s.blocks.current, live + queued, "device {d}: {s:?}");
        let queued = queue.lock().unwrap().iter().filter(|x| x.1 == d).count() as u64;
        assert_eq!(s.allocs - s.frees, live + queued, "device {d}");
    }
    for (a, d) in left.into_iter().chain(queue.lock().unwrap().drain(..)) {
        assert_eq!(p.free(a, FreeKind::Sync, Some(d)), FreeOutcome::Freed);
    }
    for d in 0..2 {
        let s = stats(&p, d);
        assert_eq!(
            (s.allocated.current, s.requested.current, s.blocks.current),
            (0, 0, 0),
            "device {d}: {s:?}"
        );
        assert_eq!(s.allocated.total_in, s.allocated.total_out, "device {d}");
        assert_eq!(s.requested.total_in, s.requested.total_out, "device {d}");
        assert_eq!(s.allocs, s.frees);
    }
    p.check_settled().unwrap();
}
