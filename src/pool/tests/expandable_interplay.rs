//! Expandable segments with the rest of the pool (`device/expandable.rs`): thread caches that
//! lend mapped blocks, the figures and reports, a reset, the split cap, and blocks taken from
//! another thread's cache before mapping more.

use super::expandable::{fill, program_sync, vmm_model, vmm_pool, vmm_settings, DEVICE};
use super::*;
use crate::pool::model_driver::{Call, VMM_GRANULE};

#[test]
fn thread_caches_lend_mapped_blocks_and_give_them_back() {
    let mut s = vmm_settings(ReuseMode::Strict, DeviceBytes::Unbounded);
    s.thread_cache = crate::config::DEFAULT_THREAD_CACHE;
    let p = Pool::new(vmm_model(DEVICE), s);
    let a = p.alloc(0, 4096).unwrap();
    on_thread(|| alloc_and_free(&p, 64, 5 * MIB));
    alloc_and_free(&p, 64, 5 * MIB);
    p.free(a, FreeKind::Sync, Some(0));
    assert!(p.backend().counts().maps > 0);
    p.check().unwrap();
    program_sync(&p);
    p.empty_cache(0);
    assert!(p.backend().mapped_on(0) <= 2 * VMM_GRANULE);
    assert_sound(&p);
}

/// The figures the reports show of device 0 (`DeviceSnapshot::figures`).
fn figures<B: Backend>(p: &Pool<B>) -> (crate::pool::CacheFigures, DeviceSnapshot) {
    let snap = p.device_stats(0).unwrap();
    (snap.figures, snap)
}

/// `cudaMemGetInfo` (`memory_for_program`) counts as free the mapped granules no live block
/// touches, as it counts whole free segments: the program that freed everything sees the
/// device as without the pool, before its synchronization too (out of memory fences and
/// unmaps them), and it can have that memory. A live 7 MiB block keeps at most one granule more
/// than its size. The reports' figures add up to the cached bytes.
#[test]
fn free_mapped_granules_count_as_free_memory() {
    let driver = |p: &Pool<ModelDriver>| p.backend().memory_info(0).unwrap();
    let sizes = [
        7 * MIB,
        3 * MIB + 512,
        12 * MIB,
        5 * MIB + MIB / 10,
        40 * MIB,
        4096,
    ];
    for reuse in [ReuseMode::Strict, ReuseMode::Barrier, ReuseMode::Relaxed] {
        let p = vmm_pool(reuse, DeviceBytes::Unbounded, DEVICE);
        let blocks: Vec<Addr> = (0..300)
            .map(|i| p.alloc(0, sizes[i % sizes.len()]).unwrap())
            .collect();
        for &a in &blocks {
            p.free(a, FreeKind::Sync, Some(0));
        }
        let (free, total) = driver(&p);
        assert!(
            free + 1000 * MIB < total,
            "{reuse:?}: the granules stay mapped"
        );
        assert_eq!(
            p.memory_for_program(0, free, total),
            (total, total),
            "{reuse:?}: freed, not synchronized"
        );
        program_sync(&p);
        let (f, snap) = figures(&p);
        assert_eq!(p.memory_for_program(0, free, total), (total, total));
        // One range for the small blocks (4096 B), one for the large ones.
        assert_eq!(
            (f.ranges, f.range_bytes, f.granule),
            (2, 4 * DEVICE, VMM_GRANULE)
        );
        assert_eq!(f.mapped, p.backend().mapped_on(0));
        assert_eq!((f.releasable, f.stranded), (snap.cached, 0), "{reuse:?}");
        // The largest free block is mapped memory, not the range's unused address space.
        assert!(f.largest_free <= f.mapped, "{reuse:?}: {f:?}");

        // One 7 MiB block live: its last granule is shared with free space, nothing more.
        let a = p.alloc(0, 7 * MIB).unwrap();
        let (free, total) = driver(&p);
        let (seen, _) = p.memory_for_program(0, free, total);
        assert!(seen + 7 * MIB <= total, "{reuse:?}: {seen}");
        assert!(seen + 7 * MIB + VMM_GRANULE >= total, "{reuse:?}: {seen}");
        let (f, snap) = figures(&p);
        assert_eq!(f.releasable + f.stranded, snap.cached, "{reuse:?}: {f:?}");
        assert!(
            f.stranded > 0 && f.stranded < VMM_GRANULE,
            "{reuse:?}: {f:?}"
        );
        assert_eq!(f.stranded_in_granules, f.stranded, "{reuse:?}");
        assert_eq!(p.releasable(0), f.releasable);

        // It can have what it was told: 1 GiB blocks fill the device but for that block's.
        let big = fill(&p, 1 << 30);
        assert_eq!(big.len() as u64, (seen >> 30), "{reuse:?}");
        for x in big.into_iter().chain([a]) {
            p.free(x, FreeKind::Sync, Some(0));
        }
        // Given back: the counters of granules mapped and unmapped agree with the driver.
        program_sync(&p);
        p.empty_cache(0);
        let s = stats(&p, 0);
        assert!(s.granules_unmapped > 0, "{reuse:?}");
        assert_eq!(
            (s.granules_mapped - s.granules_unmapped) * VMM_GRANULE,
            p.backend().mapped_on(0),
            "{reuse:?}"
        );
        let (f, _) = figures(&p);
        assert_eq!((f.mapped, f.releasable, f.stranded), (0, 0, 0), "{reuse:?}");
        assert_sound(&p);
    }
}

#[test]
fn the_reports_say_why_expandable_segments_are_off() {
    use crate::pool::Expandable;
    let on = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, DEVICE);
    on.alloc(0, 4096).unwrap();
    assert_eq!(on.device_stats(0).unwrap().expandable, Expandable::On);
    let no_vmm = Pool::new(
        classic_model(DEVICE),
        vmm_settings(ReuseMode::Strict, DeviceBytes::Unbounded),
    );
    no_vmm.alloc(0, 4096).unwrap();
    assert_eq!(
        no_vmm.device_stats(0).unwrap().expandable,
        Expandable::Unavailable
    );
    let mut s = vmm_settings(ReuseMode::Strict, DeviceBytes::Unbounded);
    s.expandable = false;
    let off = Pool::new(vmm_model(DEVICE), s);
    off.alloc(0, 4096).unwrap();
    assert_eq!(off.device_stats(0).unwrap().expandable, Expandable::Off);
    // A refused reservation is counted: the request got a classic segment.
    on.backend()
        .fail_next(Call::Reserve, CudaError::MEMORY_ALLOCATION.0);
    on.alloc(0, 7 * MIB).unwrap();
    assert_eq!(stats(&on, 0).ranges_refused, 1);
    // A driver that refuses virtual memory: off since, with the driver's code.
    let refused = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, DEVICE);
    refused
        .backend()
        .fail_next(Call::Map, CudaError::NOT_SUPPORTED.0);
    refused.alloc(0, 7 * MIB).unwrap();
    assert_eq!(
        refused.device_stats(0).unwrap().expandable,
        Expandable::Refused(CudaError::NOT_SUPPORTED)
    );
    // Virtual memory, but a visible device cannot reach this one's: classic segments.
    struct NoPeers(ModelDriver);
    impl AsRef<ModelDriver> for NoPeers {
        fn as_ref(&self) -> &ModelDriver {
            &self.0
        }
    }
    impl ModelWrapper for NoPeers {
        fn vmm_peers(&self, _device: u32) -> Option<crate::pool::backend::DeviceSet> {
            None
        }
    }
    let lonely = Pool::new(
        NoPeers(vmm_model(DEVICE)),
        vmm_settings(ReuseMode::Strict, DeviceBytes::Unbounded),
    );
    lonely.alloc(0, 7 * MIB).unwrap();
    let snap = lonely.device_stats(0).unwrap();
    assert_eq!(snap.expandable, Expandable::NoPeerAccess);
    assert_eq!(lonely.backend().0.counts().mallocs, 1);
}

/// Through a random workload, what the figures call releasable is what an empty-cache gives
/// back, in every reuse mode, with blocks live, pending and free: the free mapped granules no
/// live block touches and the idle small segments.
#[test]
fn what_the_figures_call_releasable_is_what_empty_cache_gives_back() {
    for reuse in [ReuseMode::Strict, ReuseMode::Barrier, ReuseMode::Relaxed] {
        let p = vmm_pool(reuse, DeviceBytes::Unbounded, 4 << 30);
        let mut rng = crate::rng::Rng::new(11);
        let mut live: Vec<Addr> = Vec::new();
        for step in 0..4000u64 {
            if live.len() > 60 || (!live.is_empty() && rng.percent(45)) {
                let a = live.swap_remove(rng.range(0, live.len() as u64 - 1) as usize);
                p.free(a, FreeKind::Sync, Some(0));
            } else {
                let n = if rng.percent(20) {
                    rng.range(1, 64) * 4096
                } else {
                    rng.range(1, 30) * MIB + rng.range(0, 7) * 512
                };
                live.push(p.alloc(0, n).unwrap());
            }
            let (f, snap) = figures(&p);
            assert!(f.releasable <= snap.cached, "{reuse:?} {step}: {f:?}");
            assert!(
                f.stranded_in_granules <= f.stranded,
                "{reuse:?} {step}: {f:?}"
            );
            assert_eq!(f.mapped, p.backend().mapped_on(0), "{reuse:?} {step}");
            if step % 250 == 249 {
                let before = p.releasable(0);
                assert_eq!(before, figures(&p).0.releasable);
                let released = p.empty_cache(0);
                assert_eq!(released, before, "{reuse:?} {step}");
                let (f, _) = figures(&p);
                assert_eq!(f.releasable, 0, "{reuse:?} {step}: {f:?}");
                p.check().unwrap();
            }
        }
        assert_sound(&p);
    }
}

#[test]
fn after_a_reset_every_granule_and_range_goes_back() {
    for reuse in [ReuseMode::Strict, ReuseMode::Relaxed] {
        let p = vmm_pool(reuse, DeviceBytes::Unbounded, DEVICE);
        let live = p.alloc(0, 64 * MIB).unwrap();
        let cached = p.alloc(0, 96 * MIB).unwrap();
        p.free(cached, FreeKind::Sync, Some(0));
        assert!(p.backend().mapped_on(0) >= 160 * MIB);
        assert!(p.release_mappings_after_reset(0));
        // The pool forgot the device: the live block is no longer its own.
        assert_eq!(p.backend().mapped_on(0), 0, "{reuse:?}");
        assert_eq!(p.backend().reservations(), 0, "{reuse:?}");
        assert_eq!(stats(&p, 0).reserved.current, 0);
        assert!(p.live_block(live).is_none());
        // Nothing to give back a second time: the caller forgets as before.
        assert!(!p.release_mappings_after_reset(0));
        let again = p.alloc(0, 64 * MIB).unwrap();
        p.free(again, FreeKind::Sync, Some(0));
        assert_sound(&p);
    }
}

/// Free blocks a live thread's cache holds count as free to give back in the figures, as
/// `cudaMemGetInfo` counts them (they come back first): with nothing live, nothing is
/// stranded, with classic and with expandable segments.
#[test]
fn free_blocks_in_thread_caches_are_not_stranded() {
    for expandable in [false, true] {
        let mut s = vmm_settings(ReuseMode::Relaxed, DeviceBytes::Unbounded);
        s.expandable = expandable;
        let p = Pool::new(vmm_model(DEVICE), s);
        let a = p.alloc(0, 4096).unwrap();
        on_thread(|| alloc_and_free(&p, 8, 4096));
        p.free(a, FreeKind::Sync, Some(0));
        beside_a_second_cache(
            &p,
            |p| alloc_and_free(p, 64, 3 * MIB),
            || {
                let (f, snap) = figures(&p);
                assert!(snap.cached > 0 && snap.stats.thread_cache_borrowed > 0);
                assert_eq!(f.stranded, 0, "expandable {expandable}: {f:?}");
                assert_eq!(f.releasable, snap.cached, "expandable {expandable}: {f:?}");
                let (free, total) = p.backend().memory_info(0).unwrap();
                assert_eq!(p.memory_for_program(0, free, total), (total, total));
            },
        );
        p.check().unwrap();
    }
}

/// A split cap (`GPUPOOL_MAX_SPLIT_SIZE`) keeps big cached blocks of classic segments whole; a
/// range's blocks have none: its unused address space serves requests below and above the cap
/// (with no `OVERSIZE_SLACK` bound), and a freed big block serves smaller requests from the
/// memory it has mapped, as without a cap.
#[test]
fn a_split_cap_leaves_large_requests_served_from_the_range() {
    for cap in [32 * MIB, 128 * MIB, 1 << 30] {
        let mut s = vmm_settings(ReuseMode::Strict, DeviceBytes::Unbounded);
        s.policy.max_split_size = cap;
        let p = Pool::new(vmm_model(DEVICE), s);
        let blocks: Vec<Addr> = [7 * MIB, 100 * MIB, 2 << 30]
            .into_iter()
            .map(|size| {
                p.alloc(0, size)
                    .unwrap_or_else(|e| panic!("cap {cap}: {size}: {e:?}"))
            })
            .collect();
        assert_eq!(
            p.backend().counts().mallocs,
            0,
            "cap {cap}: no classic segment"
        );
        assert_eq!(p.backend().reservations(), 1, "cap {cap}: one range");
        let mapped = p.backend().mapped_on(0);
        assert!(mapped < (2 << 30) + 110 * MIB, "cap {cap}: {mapped}");
        // The freed 2 GiB block serves 100 MiB and 7 MiB requests with what it has mapped.
        p.free(blocks[2], FreeKind::Sync, Some(0));
        program_sync(&p);
        let again: Vec<Addr> = [100 * MIB, 7 * MIB]
            .into_iter()
            .map(|size| p.alloc(0, size).unwrap())
            .collect();
        assert_eq!(again[0], blocks[2], "cap {cap}");
        assert_eq!(
            p.backend().mapped_on(0),
            mapped,
            "cap {cap}: nothing mapped"
        );
        for a in blocks[..2].iter().chain(&again) {
            p.free(*a, FreeKind::Sync, Some(0));
        }
        assert_sound(&p);
    }
}

/// Where a reservation was refused and a classic segment served instead, the cap keeps that
/// segment's block whole, and a smaller request is carved from the range beside it rather than
/// reserving another range.
#[test]
fn under_a_split_cap_a_classic_block_kept_whole_leaves_the_request_to_the_range() {
    let mut s = vmm_settings(ReuseMode::Strict, DeviceBytes::Unbounded);
    s.policy.max_split_size = 128 * MIB;
    let p = Pool::new(vmm_model(DEVICE), s);
    p.backend()
        .fail_next(Call::Reserve, CudaError::MEMORY_ALLOCATION.0);
    let classic = p.alloc(0, 200 * MIB).unwrap();
    assert_eq!(p.backend().counts().mallocs, 1, "a classic segment");
    let ranged = p.alloc(0, 300 * MIB).unwrap();
    assert_eq!(p.backend().reservations(), 1);
    p.free(classic, FreeKind::Sync, Some(0));
    program_sync(&p);
    let small = p.alloc(0, 50 * MIB).unwrap();
    assert_ne!(small, classic, "the cap keeps the classic block whole");
    assert_eq!(p.backend().reservations(), 1, "no second range");
    assert_eq!(p.backend().counts().mallocs, 1);
    // The classic block still serves a request its own size.
    assert_eq!(p.alloc(0, 200 * MIB).unwrap(), classic);
    for a in [classic, ranged, small] {
        p.free(a, FreeKind::Sync, Some(0));
    }
    assert_sound(&p);
}

/// A miss takes blocks of its size back from another thread's cache before it maps new
/// memory, as it does before it grows with classic segments (`refill`, step 2).
#[test]
fn a_miss_takes_blocks_of_its_size_from_another_threads_cache_before_mapping() {
    let mut s = vmm_settings(ReuseMode::Strict, DeviceBytes::Unbounded);
    s.thread_cache = crate::config::DEFAULT_THREAD_CACHE;
    s.policy.fence_bytes = 1 << 30;
    let p = Pool::new(vmm_model(DEVICE), s);
    on_thread(|| p.alloc(0, 4096).unwrap());
    p.alloc(0, 4096).unwrap(); // caches on
    let theirs = Mutex::new(Vec::new());
    beside_a_second_cache(
        &p,
        |p| {
            let big: Vec<Addr> = (0..5).map(|_| p.alloc(0, 4 * MIB).unwrap()).collect();
            for &a in &big {
                p.free(a, FreeKind::Sync, Some(0));
            }
            program_sync(p);
            // A miss of another size makes what the fence covered reusable in this cache.
            let w = p.alloc(0, 8192).unwrap();
            p.free(w, FreeKind::Sync, Some(0));
            *theirs.lock().unwrap() = big;
        },
        || {
            let mapped = p.backend().mapped_on(0);
            let a = p.alloc(0, 4 * MIB).unwrap();
            assert!(theirs.lock().unwrap().contains(&a), "{a:#x}");
            assert_eq!(p.backend().mapped_on(0), mapped, "nothing mapped");
        },
    );
    assert_sound(&p);
}

/// A barrier taken to fit better (`better_fit`) can merge the chosen block into a neighbour
/// whose granules went back: no cached block fits then, and the request maps the merged
/// block's granules, rather than taking the block the merge removed.
#[test]
fn a_fit_merged_away_by_its_barrier_leaves_the_request_to_the_mapping() {
    let p = vmm_pool(ReuseMode::Barrier, DeviceBytes::Unbounded, DEVICE);
    let barrier = |p: &Pool<ModelDriver>| {
        let at = p.seq_before_sync(0);
        p.observe_barrier(0, at);
    };
    // Packed one after another: x, q, b, i, y.
    let [x, q, b, i, y] = [3, 9, 12, 40, 3].map(|mib| p.alloc(0, mib * MIB).unwrap());
    // q's whole granules go back; i stays mapped and free: the best fit for 10 MiB.
    p.free(q, FreeKind::Sync, Some(0));
    barrier(&p);
    p.empty_cache(0);
    p.free(i, FreeKind::Sync, Some(0));
    barrier(&p);
    // b waits for a barrier, and is larger than the request: `better_fit` takes one, and b
    // merges q, itself and i into one block whose start is unmapped.
    p.free(b, FreeKind::Sync, Some(0));
    let mapped = p.backend().mapped_on(0);
    let a = p.alloc(0, 10 * MIB).unwrap();
    assert_eq!(a, q, "carved at the merged block's start");
    assert!(
        p.backend().mapped_on(0) > mapped,
        "q's granules mapped again"
    );
    assert_sound(&p);
    for z in [x, a, y] {
        p.free(z, FreeKind::Sync, Some(0));
    }
    assert_sound(&p);
}
