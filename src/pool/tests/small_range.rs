//! Small blocks in a range of their own (`device/expandable.rs`, docs/design-notes.md, "Small
//! blocks"): holes past the best fit, the reports' largest free block, a reset, both ranges
//! giving memory to each other, a refused reservation, and random traffic with refusals.

use super::expandable::{program_sync, vmm_model, vmm_pool, vmm_settings, DEVICE};
use super::*;
use crate::pool::model_driver::VMM_GRANULE;

/// Small-range holes: B1 (2.5 MiB, a whole granule unmapped inside, 0.5 MiB mapped at its
/// start) is the best fit by size; B2 (3 MiB, wholly mapped) fits too. With the device full,
/// a 768 KiB request must be served from B2, not refused.
#[test]
fn a_small_request_at_a_full_device_takes_a_mapped_hole_past_the_best_fit() {
    const K: u64 = 512 << 10;
    // Four granules: the small range's first 8 MiB, one of them later for a large block.
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, 4 * VMM_GRANULE);
    let blocks: Vec<Addr> = (0..16).map(|_| p.alloc(0, K).unwrap()).collect();
    for w in blocks.windows(2) {
        assert_eq!(w[1], w[0] + K, "packed one after another");
    }
    // B1 = blocks 3..8 ([1.5, 4) MiB), B2 = blocks 9..15 ([4.5, 7.5) MiB).
    for &a in blocks[3..8].iter().chain(&blocks[9..15]) {
        assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    }
    program_sync(&p);
    p.empty_cache(0);
    // Granule 1 (wholly inside B1) went back; 0, 2, 3 stay.
    assert_eq!(p.backend().mapped_on(0), 3 * VMM_GRANULE);
    // Another user takes the granule: the device is full.
    let big = p.alloc(0, 2 * MIB).unwrap();
    assert_eq!(p.backend().mapped_on(0), 4 * VMM_GRANULE);
    p.check().unwrap();
    // 768 KiB fits B2 ([4.5, 5.25) MiB, mapped), as it would in a classic segment.
    let r = p.alloc(0, 768 << 10);
    p.check().unwrap();
    assert!(
        r.is_ok(),
        "refused: {r:?}, with 3 MiB mapped and free in B2"
    );
    let _ = big;
}

/// A small-range hole whose first granule went back holds mapped memory only at its end, where
/// a live block shares a granule with it: H = [2, 5.5) MiB, granule 1 ([2, 4) MiB) unmapped,
/// [4, 5.5) MiB mapped and free. With the pool at its limit (or the device full) and nothing
/// else free, a 1 MiB request fits H's mapped end as it would with the granule mapped again;
/// packing it at H's start needs that granule, which the limit refuses. Seen in `race 6 3 600 1
/// 4 edsmuwfbo` under `GPUPOOL_LIMIT=24MiB`.
#[test]
fn a_small_request_at_the_limit_takes_the_mapped_end_of_a_hole() {
    const K: u64 = 512 << 10;
    for limited in [true, false] {
        let mut s = vmm_settings(ReuseMode::Strict, DeviceBytes::Unbounded);
        let capacity = if limited {
            s.limit = DeviceBytes::Bytes(4 * VMM_GRANULE);
            DEVICE
        } else {
            4 * VMM_GRANULE
        };
        let p = Pool::new(vmm_model(capacity), s);
        let blocks: Vec<Addr> = (0..16).map(|_| p.alloc(0, K).unwrap()).collect();
        // H = blocks 4..11 ([2, 5.5) MiB); blocks 11..16 ([5.5, 8) MiB) stay live.
        for &a in &blocks[4..11] {
            assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
        }
        program_sync(&p);
        p.empty_cache(0);
        assert_eq!(
            p.backend().mapped_on(0),
            3 * VMM_GRANULE,
            "granule 1 went back"
        );
        // A large block takes the granule: the pool is at its limit, the device full.
        let big = p.alloc(0, 2 * MIB).unwrap();
        assert_eq!(p.backend().mapped_on(0), 4 * VMM_GRANULE);
        p.check().unwrap();
        let r = p.alloc(0, MIB);
        p.check().unwrap();
        let a = r.unwrap_or_else(|e| {
            panic!("limited {limited}: refused ({e:?}) with 1.5 MiB mapped and free in H")
        });
        assert!(
            a >= blocks[0] + 4 * MIB && a + MIB <= blocks[11],
            "limited {limited}: served at {a:#x}, not in H's mapped end"
        );
        assert_eq!(p.backend().mapped_on(0), 4 * VMM_GRANULE);
        for x in blocks[..4].iter().chain(&blocks[11..]).chain([&big, &a]) {
            assert_eq!(p.free(*x, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
        }
        program_sync(&p);
        p.empty_cache(0);
        assert_eq!(p.backend().mapped_on(0), 0, "limited {limited}");
        p.check().unwrap();
    }
}

/// The reports' largest free block is "in an expandable segment, the largest mapped piece of a
/// free block" (`CacheFigures::largest_free`): a 4 MiB hole of the small range whose middle
/// granule went back holds at most 1.5 MiB mapped in one piece.
#[test]
fn the_largest_free_block_is_a_mapped_piece_of_a_small_hole() {
    const K: u64 = 512 << 10;
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, 64 * MIB);
    let blocks: Vec<Addr> = (0..16).map(|_| p.alloc(0, K).unwrap()).collect();
    // Blocks 3..11: the hole [1.5, 5.5) MiB; granule 1 ([2, 4) MiB) wholly inside it.
    for &a in &blocks[3..11] {
        assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    }
    program_sync(&p);
    p.empty_cache(0);
    assert_eq!(p.backend().mapped_on(0), 3 * VMM_GRANULE);
    p.check().unwrap();
    let snap = p.device_stats(0).unwrap();
    // Mapped pieces: [1.5, 2) and [4, 5.5) MiB.
    assert!(
        snap.largest_free <= 3 * MIB / 2,
        "largest free {} MiB, figures.largest_free {} MiB",
        snap.largest_free as f64 / MIB as f64,
        snap.figures.largest_free as f64 / MIB as f64
    );
}

/// After a reset whose unmap of a small range's granule is refused, the kept range comes back
/// as a small range: small requests served over its unready granule get it mapped afresh, and
/// large ones never come from it.
#[test]
fn a_small_range_kept_after_a_reset_comes_back_as_a_small_range() {
    use crate::pool::backend::DeviceSet;
    use crate::pool::model_driver::Call;
    for reuse in [ReuseMode::Strict, ReuseMode::Relaxed] {
        let p = vmm_pool(reuse, DeviceBytes::Unbounded, 64 * MIB);
        let d = p.backend();
        let small: Vec<Addr> = (0..8).map(|_| p.alloc(0, 512 << 10).unwrap()).collect();
        let _large = p.alloc(0, 8 * MIB).unwrap();
        // The first unmap is the small range's first granule (ranges in reservation order).
        d.fail_next(Call::Unmap, 999);
        assert!(p.release_mappings_after_reset(0));
        assert_eq!(d.mapped_on(0), VMM_GRANULE, "{reuse:?}");
        assert_sound(&p);
        let again: Vec<Addr> = (0..8).map(|_| p.alloc(0, 512 << 10).unwrap()).collect();
        for &a in &again {
            assert!(
                d.usable(0, a, a + (512 << 10), DeviceSet::default()),
                "{a:#x}"
            );
        }
        let big = p.alloc(0, 8 * MIB).unwrap();
        assert!(d.usable(0, big, big + 8 * MIB, DeviceSet::default()));
        assert!(
            again
                .iter()
                .all(|&a| a + (512 << 10) <= big || a >= big + 8 * MIB),
            "{reuse:?}: overlap"
        );
        let _ = small;
        assert_eq!(stats(&p, 0).reserved.current, d.mapped_on(0), "{reuse:?}");
        assert_sound(&p);
        assert_eq!(p.device_stats(0).unwrap().figures.ranges, 2, "{reuse:?}");
    }
}

/// What `cudaMemGetInfo` counts as free after every small block was freed is what a large
/// request then gets.
#[test]
fn freed_small_blocks_give_their_granules_to_a_large_request() {
    for reuse in [ReuseMode::Strict, ReuseMode::Barrier, ReuseMode::Relaxed] {
        let p = vmm_pool(reuse, DeviceBytes::Unbounded, 64 * MIB);
        let blocks = super::expandable::fill(&p, 600 << 10);
        for &a in &blocks {
            p.free(a, FreeKind::Sync, Some(0));
        }
        let (free, total) = p.backend().memory_info(0).unwrap();
        let (shown, _) = p.memory_for_program(0, free, total);
        assert_eq!(shown, total, "{reuse:?}");
        let r = p.alloc(0, 64 * MIB);
        assert!(r.is_ok(), "{reuse:?}: {r:?}");
        assert_sound(&p);
    }
}

/// The reverse: a device full of freed large blocks serves small requests.
#[test]
fn freed_large_blocks_give_their_granules_to_small_requests() {
    for reuse in [ReuseMode::Strict, ReuseMode::Barrier, ReuseMode::Relaxed] {
        let p = vmm_pool(reuse, DeviceBytes::Unbounded, 64 * MIB);
        let blocks = super::expandable::fill(&p, 8 * MIB);
        assert_eq!(blocks.len(), 8);
        for &a in &blocks {
            p.free(a, FreeKind::Sync, Some(0));
        }
        let small = super::expandable::fill(&p, 600 << 10);
        assert!(small.len() >= 100, "{reuse:?}: {}", small.len());
        assert_sound(&p);
    }
}

/// Random mixed traffic against a small device with work in flight, refusals injected, streams,
/// releases: every block handed out is usable and overlaps no live one, no unmap under work,
/// the structure holds after each step, and everything goes back at the end.
fn random_traffic(reuse: ReuseMode, threshold: DeviceBytes, seed: u64, slack: bool, tcache: bool) {
    use super::expandable::{vmm_settings, InFlight};
    use crate::pool::backend::DeviceSet;
    use crate::pool::model_driver::Call;
    let mut s = vmm_settings(reuse, threshold);
    if slack {
        s.policy.mapped_slack_permille = Some(40);
    }
    s.policy.fence_bytes = 4 * MIB;
    if tcache {
        s.thread_cache = crate::config::DEFAULT_THREAD_CACHE;
        s.cache_contention = 0;
    }
    let p = Pool::new(InFlight::new(160 * MIB), s);
    if tcache {
        let a = p.alloc(0, 4096).unwrap();
        on_thread(|| {
            let b = p.alloc(0, 4096).unwrap();
            p.free(b, FreeKind::Sync, Some(0));
        });
        p.free(a, FreeKind::Sync, Some(0));
    }
    let d = p.backend();
    let peers = if seed % 2 == 1 {
        p.add_peer(0, 1).unwrap();
        DeviceSet::one(1)
    } else {
        DeviceSet::default()
    };
    let mut rng = crate::rng::Rng::new(seed);
    let mut live: BTreeMap<Addr, (u64, Option<StreamKey>)> = BTreeMap::new();
    for step in 0..2000u64 {
        let ctx = format!("{reuse:?} {threshold:?} seed {seed} slack {slack} step {step}");
        if live.len() > 120 || (!live.is_empty() && rng.percent(45)) {
            let k = rng.range(0, live.len() as u64 - 1) as usize;
            let (&a, &(n, stream)) = live.iter().nth(k).unwrap();
            live.remove(&a);
            d.launch(a, n);
            let kind = match stream {
                Some(st) if rng.percent(70) => on(st, true),
                _ => FreeKind::Sync,
            };
            assert_eq!(p.free(a, kind, Some(0)), FreeOutcome::Freed, "{ctx}");
        } else {
            let n = match rng.range(0, 9) {
                0..=5 => rng.range(1, 2048) * 512,
                6 => rng.range(1, 8) * 512 * 1024 - rng.range(0, 3) * 512,
                7 => rng.range(1, 12) * MIB + rng.range(0, 3) * 512,
                _ => rng.range(1, 1000) * 1024,
            };
            let stream = (reuse == ReuseMode::Relaxed && rng.percent(50)).then(|| rng.range(1, 3));
            if rng.percent(3) {
                let call =
                    [Call::Map, Call::Access, Call::Unmap, Call::Reserve][rng.range(0, 3) as usize];
                let code = if rng.percent(50) { 2 } else { 999 };
                d.inner.fail_next_times(call, code, rng.range(1, 3) as u32);
            }
            if let Ok(a) = p.alloc_on(0, n, stream) {
                let ok = if p.mapped_run(a).is_some() {
                    d.inner.usable(0, a, a + n, peers)
                } else {
                    d.inner.covers(a, a + n)
                };
                assert!(ok, "{ctx}: {a:#x}+{n} not usable");
                if let Some((&b, &(m, _))) = live.range(..a + n).next_back() {
                    assert!(b + m <= a, "{ctx}: {a:#x}+{n} overlaps {b:#x}+{m}");
                }
                live.insert(a, (n, stream));
            }
            d.inner.clear_armed();
        }
        match rng.range(0, 99) {
            0 => {
                d.program_fence();
                program_sync(&p);
            }
            1 => {
                let at = p.seq_before_sync(0);
                p.observe_barrier(0, at);
            }
            2 => {
                p.empty_cache(0);
            }
            _ => {}
        }
        if let Err(e) = p.check() {
            panic!("{ctx}: {e}");
        }
        let bad = d.unmaps_under_work.lock().unwrap().clone();
        assert!(bad.is_empty(), "{ctx}: unmapped under work: {bad:x?}");
        let misuses = d.inner.misuses();
        assert!(misuses.is_empty(), "{ctx}: {misuses:?}");
        assert_eq!(
            stats(&p, 0).reserved.current,
            d.inner.reserved_on(0),
            "{ctx}"
        );
    }
    for (a, _) in std::mem::take(&mut live) {
        p.free(a, FreeKind::Sync, Some(0));
    }
    d.program_fence();
    program_sync(&p);
    p.empty_cache(0);
    assert_eq!(
        d.inner.mapped_on(0),
        0,
        "{reuse:?} seed {seed}: all unmapped"
    );
    assert_eq!(stats(&p, 0).reserved.current, 0, "{reuse:?} seed {seed}");
    p.check().unwrap();
}

#[test]
fn random_traffic_with_refusals_hands_out_only_usable_blocks_and_gives_all_back() {
    for seed in 1..=3 {
        for reuse in [ReuseMode::Strict, ReuseMode::Barrier, ReuseMode::Relaxed] {
            for threshold in [
                DeviceBytes::Unbounded,
                DeviceBytes::Bytes(0),
                DeviceBytes::Bytes(32 * MIB),
            ] {
                random_traffic(reuse, threshold, seed, seed % 2 == 0, seed % 3 == 0);
            }
        }
    }
}

/// `a_reservation_refused_for_want_of_virtual_memory_is_not_asked_again` with one small request
/// first (the small range reserved): the large range's reservation, refused as not supported,
/// is not asked again; large blocks keep classic segments, the small range stays.
#[test]
fn a_large_range_refused_after_the_small_one_is_not_asked_again() {
    use crate::pool::model_driver::Call;
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, DEVICE);
    let s = p.alloc(0, 4096).unwrap();
    p.backend().clear_delivered();
    p.backend()
        .fail_next_times(Call::Reserve, CudaError::NOT_SUPPORTED.0, u32::MAX);
    let blocks: Vec<Addr> = (0..20).map(|_| p.alloc(0, 30 * MIB).unwrap()).collect();
    let refused = p.backend().delivered().len();
    assert_eq!(p.existing(0).unwrap().pool.lock().expandable_refused, None);
    assert_eq!(refused, 1, "one reservation asked, none after the refusal");
    for a in blocks.into_iter().chain([s]) {
        p.free(a, FreeKind::Sync, Some(0));
    }
    p.check().unwrap();
}

/// The same layout with room on the device: the 768 KiB request must not map B1's granule
/// again (2 MiB more reserved) while B2, wholly mapped, fits it.
#[test]
fn a_small_request_takes_a_mapped_hole_past_the_best_fit_before_mapping() {
    const K: u64 = 512 << 10;
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, DEVICE);
    let blocks: Vec<Addr> = (0..16).map(|_| p.alloc(0, K).unwrap()).collect();
    for &a in blocks[3..8].iter().chain(&blocks[9..15]) {
        assert_eq!(p.free(a, FreeKind::Sync, Some(0)), FreeOutcome::Freed);
    }
    program_sync(&p);
    p.empty_cache(0);
    assert_eq!(p.backend().mapped_on(0), 3 * VMM_GRANULE);
    let maps = p.backend().counts().maps;
    let a = p.alloc(0, 768 << 10).unwrap();
    assert!(a >= blocks[9], "served from B2: {a:#x}");
    assert_eq!(
        p.backend().counts().maps,
        maps,
        "mapped a granule while B2 (mapped) fits"
    );
    assert_sound(&p);
}

#[test]
fn peers_reach_small_blocks() {
    use crate::pool::backend::DeviceSet;
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, DEVICE);
    p.add_peer(0, 1).unwrap();
    let a = p.alloc(0, 4096).unwrap();
    assert_eq!(p.backend().peers_at(a), DeviceSet::one(1));
}
