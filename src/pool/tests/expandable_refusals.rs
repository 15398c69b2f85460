//! Expandable segments when the driver refuses: a mapping, its access, its undoing unmap, a
//! reservation. The pool falls back to classic segments while no mapping ever worked, undoes a
//! block's mappings all or nothing, and never hands out a granule left unready.

use super::expandable::{fill, program_sync, vmm_pool, DEVICE};
use super::*;
use crate::pool::backend::DeviceSet;
use crate::pool::model_driver::{Call, VMM_GRANULE};

/// Whether the block at `addr` of `size` bytes lies on memory device 0 mapped for it, with
/// access for device 0 and for `peers`: what a kernel using it needs.
fn usable(p: &Pool<ModelDriver>, addr: Addr, size: u64, peers: DeviceSet) -> bool {
    p.backend().usable(0, addr, addr + size, peers)
}

#[test]
fn a_refused_mapping_is_undone_and_the_request_recovers() {
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, DEVICE);
    let a = p.alloc(0, 7 * MIB).unwrap();
    let mapped = p.backend().mapped_on(0);
    p.backend().fail_next(Call::Map, 2);
    // The second granule of this block's mapping is refused once: what it mapped goes back,
    // and the retry after the release maps it whole.
    let b = p.alloc(0, 9 * MIB).unwrap();
    assert!(p.backend().mapped_on(0) > mapped);
    assert_eq!(stats(&p, 0).oom_recovered, 1);
    assert_eq!(stats(&p, 0).reserved.current, p.backend().mapped_on(0));
    for x in [a, b] {
        p.free(x, FreeKind::Sync, Some(0));
    }
    assert_sound(&p);
}

/// A mapping refused for want of memory whose undoing unmap is refused too (and again at the
/// recovery's release and its retry): the granule it had mapped stays mapped and counted, and
/// the block later served over it has the peer's access like every other block.
#[test]
fn a_granule_left_mapped_by_a_refused_mapping_gets_its_peers_before_use() {
    // Five granules' capacity.
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, 10 * MIB);
    let d = p.backend();
    p.add_peer(0, 1).unwrap();
    let a = p.alloc(0, 7 * MIB).unwrap();
    d.fail_next_times(Call::Unmap, 999, 3);
    // The fifth granule maps, the sixth is refused: the device is full.
    assert_eq!(p.alloc(0, 9 * MIB), Err(CudaError::MEMORY_ALLOCATION));
    assert_eq!(stats(&p, 0).reserved.current, d.mapped_on(0));
    assert_eq!(d.mapped_on(0), 10 * MIB);
    p.free(a, FreeKind::Sync, Some(0));
    // Over the five granules, all mapped already.
    let b = p.alloc(0, 10 * MIB).unwrap();
    assert!(usable(&p, b, 10 * MIB, DeviceSet::one(1)), "{b:#x}");
    assert_eq!(stats(&p, 0).reserved.current, d.mapped_on(0));
    p.free(b, FreeKind::Sync, Some(0));
    program_sync(&p);
    p.empty_cache(0);
    assert_eq!((stats(&p, 0).reserved.current, d.mapped_on(0)), (0, 0));
    assert_sound(&p);
}

/// A mapping refused its access whose undoing unmap is refused too: the driver holds the
/// memory, so the pool counts it, and the request is served once the granule was unmapped and
/// mapped again with access, never over it as it was.
#[test]
fn a_mapping_left_without_access_is_counted_and_never_handed_out() {
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, DEVICE);
    let d = p.backend();
    let a = p.alloc(0, 7 * MIB).unwrap();
    d.fail_next(Call::Access, 999);
    d.fail_next(Call::Unmap, 999);
    let b = p.alloc(0, 9 * MIB).unwrap();
    assert_eq!(stats(&p, 0).reserved.current, d.mapped_on(0));
    let mut live = vec![(a, 7 * MIB), (b, 9 * MIB)];
    for n in [3, 12, 5, 20] {
        live.push((p.alloc(0, n * MIB).unwrap(), n * MIB));
    }
    for &(x, n) in &live {
        assert!(usable(&p, x, n, DeviceSet::default()), "{x:#x}+{n}");
    }
    assert_eq!(stats(&p, 0).reserved.current, d.mapped_on(0));
    for (x, _) in live {
        p.free(x, FreeKind::Sync, Some(0));
    }
    program_sync(&p);
    p.empty_cache(0);
    assert_eq!((stats(&p, 0).reserved.current, d.mapped_on(0)), (0, 0));
    assert_sound(&p);
}

#[test]
fn a_driver_that_refuses_virtual_memory_leaves_classic_segments() {
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, DEVICE);
    // Not supported, before any granule was mapped: the range goes back, the request and
    // every later one get classic segments, and nothing tells the program.
    p.backend().fail_next(Call::Map, CudaError::NOT_SUPPORTED.0);
    let blocks = fill(&p, 7 * MIB);
    assert!(!blocks.is_empty());
    let counts = p.backend().counts();
    assert_eq!(counts.maps, 1, "one refused map, none after");
    assert!(counts.mallocs >= 1);
    assert_eq!(p.backend().reservations(), 0);
    assert_eq!(p.backend().mapped_on(0), 0);
    let slot = p.existing(0).unwrap();
    assert_eq!(
        slot.pool.lock().expandable_refused,
        Some(CudaError::NOT_SUPPORTED)
    );
    for a in blocks {
        p.free(a, FreeKind::Sync, Some(0));
    }
    assert_sound(&p);

    // Once mapping worked, a refusal is the driver's lack of memory: the ladder retries.
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, DEVICE);
    let a = p.alloc(0, 7 * MIB).unwrap();
    p.backend().fail_next(Call::Map, CudaError::NOT_SUPPORTED.0);
    let b = p.alloc(0, 9 * MIB).unwrap();
    assert_eq!(p.backend().counts().mallocs, 0);
    assert!(p
        .existing(0)
        .unwrap()
        .pool
        .lock()
        .expandable_refused
        .is_none());
    for x in [a, b] {
        p.free(x, FreeKind::Sync, Some(0));
    }
    p.check().unwrap();
}

/// The first mapping's access refused, and its undoing unmap too: no mapping worked yet, so
/// the refusal is virtual memory missing, not memory. The unready granule is unmapped, and
/// classic segments serve, as when the access alone is refused; never an out-of-memory.
#[test]
fn a_first_mapping_left_unready_still_falls_back_to_classic_segments() {
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, DEVICE);
    let d = p.backend();
    d.fail_next_times(Call::Access, 999, u32::MAX);
    d.fail_next(Call::Unmap, 999);
    let mut blocks = vec![p.alloc(0, 7 * MIB).expect("served by a classic segment")];
    blocks.extend(fill(&p, 7 * MIB));
    assert!(d.counts().mallocs >= 1);
    assert_eq!((d.reservations(), d.mapped_on(0)), (0, 0));
    let slot = p.existing(0).unwrap();
    assert_eq!(slot.pool.lock().expandable_refused, Some(CudaError(999)));
    for a in blocks {
        p.free(a, FreeKind::Sync, Some(0));
    }
    assert_sound(&p);
}

#[test]
fn a_reservation_refused_for_want_of_virtual_memory_is_not_asked_again() {
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, DEVICE);
    p.backend()
        .fail_next(Call::Reserve, CudaError::NOT_SUPPORTED.0);
    let blocks: Vec<Addr> = (0..20).map(|_| p.alloc(0, 30 * MIB).unwrap()).collect();
    let refused = p.backend().delivered().len();
    assert_eq!(refused, 1, "one reservation asked, none after the refusal");
    assert_eq!(p.backend().counts().maps, 0);
    assert_eq!(p.backend().reservations(), 0);
    assert_eq!(
        p.existing(0).unwrap().pool.lock().expandable_refused,
        Some(CudaError::NOT_SUPPORTED)
    );
    for a in blocks {
        p.free(a, FreeKind::Sync, Some(0));
    }
    p.check().unwrap();
}

#[test]
fn a_request_that_fits_a_cached_block_but_cannot_map_it_is_no_hit() {
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Bytes(0), 64 * MIB);
    let a = p.alloc(0, 32 * MIB).unwrap();
    p.free(a, FreeKind::Sync, Some(0));
    program_sync(&p);
    assert_eq!(
        p.backend().mapped_on(0),
        0,
        "the zero threshold unmapped it"
    );
    // Another user of the device takes its memory: the cached range fits, mapping it cannot.
    let other = p.backend().alloc_segment(0, 64 * MIB).unwrap();
    let hits = stats(&p, 0).hits;
    assert_eq!(p.alloc(0, 32 * MIB), Err(CudaError::MEMORY_ALLOCATION));
    assert_eq!(stats(&p, 0).hits, hits);
    p.backend().free_segment(0, other).unwrap();
    p.check().unwrap();
}

#[test]
fn a_refusal_after_mapping_once_worked_is_no_reason_to_stop() {
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, DEVICE);
    let a = p.alloc(0, 7 * MIB).unwrap();
    p.free(a, FreeKind::Sync, Some(0));
    program_sync(&p);
    p.empty_cache(0);
    assert_eq!(p.backend().mapped_on(0), 0, "nothing mapped now");
    // Mapping has worked on this device: the refusal is out of memory, retried, not a driver
    // without virtual memory.
    p.backend().fail_next(Call::Map, CudaError::NOT_SUPPORTED.0);
    let b = p.alloc(0, 7 * MIB).unwrap();
    assert!(p
        .existing(0)
        .unwrap()
        .pool
        .lock()
        .expandable_refused
        .is_none());
    assert_eq!(p.backend().counts().mallocs, 0, "no classic segment");
    p.free(b, FreeKind::Sync, Some(0));
    p.check().unwrap();
}

#[test]
fn a_request_served_after_a_refused_mapping_counts_once() {
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, DEVICE);
    let a = p.alloc(0, 7 * MIB).unwrap();
    p.backend().fail_next(Call::Map, 2);
    let b = p.alloc(0, 9 * MIB).unwrap();
    let st = stats(&p, 0);
    assert_eq!(st.oom_recovered, 1);
    assert_eq!(
        st.hits + st.misses,
        2,
        "two requests: {} hits, {} misses",
        st.hits,
        st.misses
    );
    for x in [a, b] {
        p.free(x, FreeKind::Sync, Some(0));
    }
    p.check().unwrap();
}

/// A granule a refused mapping left mapped (its undoing unmap refused too) lies in a free
/// block that no free made: the next release gives it back, as the figures count it
/// releasable, also when the device was never given a block back before.
#[test]
fn a_granule_left_mapped_by_a_refused_mapping_goes_back_at_the_next_release() {
    // Five granules' capacity.
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, 10 * MIB);
    let d = p.backend();
    let a = p.alloc(0, 7 * MIB).unwrap();
    // The undoing unmap, and the next one.
    d.fail_next_times(Call::Unmap, 999, 2);
    assert_eq!(p.alloc(0, 9 * MIB), Err(CudaError::MEMORY_ALLOCATION));
    assert_eq!(stats(&p, 0).reserved.current, d.mapped_on(0));
    let releasable = p.releasable(0);
    assert_eq!(
        p.empty_cache(0),
        releasable,
        "what the figures call releasable"
    );
    assert_eq!(d.mapped_on(0), 8 * MIB, "a's granules alone");
    assert_eq!(stats(&p, 0).reserved.current, d.mapped_on(0));
    p.free(a, FreeKind::Sync, Some(0));
    assert_sound(&p);
}

/// A granule whose unmap the driver refuses after a reset stays the pool's: counted, given back
/// at the next release, and its range is not freed while it is mapped (as a segment whose
/// `cudaFree` failed is kept and released later).
#[test]
fn a_granule_whose_unmap_is_refused_after_a_reset_is_kept_and_given_back_later() {
    for reuse in [ReuseMode::Strict, ReuseMode::Relaxed] {
        let p = vmm_pool(reuse, DeviceBytes::Unbounded, DEVICE);
        let d = p.backend();
        let live = p.alloc(0, 64 * MIB).unwrap();
        let cached = p.alloc(0, 96 * MIB).unwrap();
        p.free(cached, FreeKind::Sync, Some(0));
        d.fail_next(Call::Unmap, 999);
        assert!(p.release_mappings_after_reset(0));
        assert!(
            p.live_block(live).is_none(),
            "{reuse:?}: the device is forgotten"
        );
        assert_eq!(
            d.mapped_on(0),
            VMM_GRANULE,
            "{reuse:?}: the granule refused"
        );
        assert_eq!(stats(&p, 0).reserved.current, d.mapped_on(0), "{reuse:?}");
        assert_sound(&p);
        p.empty_cache(0);
        assert_eq!(d.mapped_on(0), 0, "{reuse:?}");
        assert_eq!(stats(&p, 0).reserved.current, 0, "{reuse:?}");
        // The range serves again.
        let again = p.alloc(0, 64 * MIB).unwrap();
        assert!(d.usable(0, again, again + 64 * MIB, DeviceSet::default()));
        p.free(again, FreeKind::Sync, Some(0));
        assert_sound(&p);
    }
}

/// A refused mapping whose retry serves from a block the fence freed: that block may lie over
/// a granule a refused mapping left unready (counted as mapped). It is mapped afresh before
/// use, with the device's and its peers' access, as on every other path.
#[test]
fn a_block_the_fence_frees_at_out_of_memory_is_never_served_over_an_unready_granule() {
    // Five granules' capacity.
    let p = vmm_pool(ReuseMode::Strict, DeviceBytes::Unbounded, 10 * MIB);
    let d = p.backend();
    p.add_peer(0, 1).unwrap();
    let a = p.alloc(0, 7 * MIB).unwrap();
    // The fifth granule maps, the sixth is refused, and the unmap that would undo the fifth
    // is refused, as are those of the recovery: the fifth stays mapped, unready.
    d.fail_next_times(Call::Unmap, 999, 3);
    assert_eq!(p.alloc(0, 9 * MIB), Err(CudaError::MEMORY_ALLOCATION));
    // `a` waits for a fence. The next request finds the unready granule at the frontier and
    // its unmap refused once more: the out-of-memory retry fences, and `a`'s block, merged
    // with the frontier, holds the request over the granules already counted mapped.
    p.free(a, FreeKind::Sync, Some(0));
    d.fail_next(Call::Unmap, 999);
    let b = p.alloc(0, 9 * MIB).unwrap();
    assert!(usable(&p, b, 9 * MIB, DeviceSet::one(1)), "{b:#x}");
    assert_eq!(stats(&p, 0).reserved.current, d.mapped_on(0));
    p.free(b, FreeKind::Sync, Some(0));
    assert_sound(&p);
}
