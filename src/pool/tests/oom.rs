//! The out-of-memory ladder (`device/grow.rs`): release, fence, retry, the exact size, what
//! thread caches give back, and the report.

use super::*;
use crate::pool::model_driver::Call;

#[test]
fn an_out_of_memory_report_counts_what_the_outgrown_release_gave_back() {
    // The report must say what was released before the failure.
    let p = classic_pool_with(ReuseMode::Relaxed, DeviceBytes::Unbounded, 1800 * MIB);
    let a = p.alloc(0, 600 * MIB).unwrap(); // 768 MiB segment
    let _k = p.alloc(0, 700 * MIB).unwrap();
    p.free(a, FreeKind::Sync, None);
    // A record: the idle 768 MiB segment goes back, and 1 200 MiB still does not fit.
    assert!(p.alloc(0, 1200 * MIB).is_err());
    let d = p.device_stats(0).unwrap();
    assert_eq!(d.stats.outgrown_released_bytes, 768 * MIB);
    assert_eq!(
        d.last_oom.expect("an out-of-memory event").released,
        768 * MIB
    );
}

#[test]
fn out_of_memory_releases_cache_and_retries() {
    // Strict mode: freed blocks wait for a fence, so recovery must fence, release, retry.
    let p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 64 * MIB);
    let v: Vec<Addr> = (0..56).map(|_| p.alloc(0, MIB).unwrap()).collect();
    for a in v {
        p.free(a, FreeKind::Sync, None);
    }
    assert_eq!(p.backend().reserved_on(0), 56 * MIB);
    let big = p.alloc(0, 40 * MIB).unwrap();
    assert!(big > 0);
    let s = stats(&p, 0);
    assert_eq!(s.oom_retries, 1);
    assert_eq!(s.oom_recovered, 1);
    assert_eq!(s.ooms, 0);
    assert!(s.fences >= 1);
    assert_eq!(s.oom_released_bytes, 56 * MIB);
    assert_eq!(p.backend().reserved_on(0), 40 * MIB);
    p.check().unwrap();
}

#[test]
fn out_of_memory_is_reported_and_the_pool_stays_usable() {
    let p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 64 * MIB);
    let a = p.alloc(0, 32 * MIB).unwrap();
    assert_eq!(p.alloc(0, 48 * MIB), Err(CudaError::MEMORY_ALLOCATION));
    assert_eq!(stats(&p, 0).ooms, 1);
    p.check().unwrap();
    p.free(a, FreeKind::Sync, None);
    assert!(p.alloc(0, 48 * MIB).is_ok());
    p.check().unwrap();
}

#[test]
fn exact_size_fallback_when_the_segment_would_not_fit() {
    // 3 MiB capacity: a 1.5 MiB request would take a 20 MiB medium segment; only the exact size
    // fits.
    let p = classic_pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 3 * MIB);
    assert!(p.alloc(0, 3 * MIB / 2).is_ok());
    assert_eq!(stats(&p, 0).reserved.current, 3 * MIB / 2);
}

#[test]
fn other_errors_pass_through_without_retry() {
    let p = classic_relaxed();
    p.backend().fail_next(Call::Malloc, 35);
    assert_eq!(p.alloc(0, 512), Err(CudaError(35)));
    assert_eq!(stats(&p, 0).oom_retries, 0);
    assert!(p.alloc(0, 512).is_ok());
    p.check().unwrap();
}

#[test]
fn sizes_near_the_maximum_are_out_of_memory() {
    let p = relaxed();
    for size in [u64::MAX, u64::MAX - 511, u64::MAX - (1 << 21), 1 << 62] {
        assert_eq!(p.alloc(0, size), Err(CudaError::MEMORY_ALLOCATION));
    }
    p.check().unwrap();
}

#[test]
fn out_of_memory_takes_back_what_a_live_threads_cache_holds() {
    let p = shared_relaxed(64 * MIB);
    let fill = || alloc_and_free(&p, 40, 512 << 10);
    while_a_thread_holds(&p, fill, || {
        let s = p.device_stats(0).unwrap();
        assert!(
            s.stats.reserved.current >= 20 * MIB && s.cached >= 20 * MIB,
            "{s:?}"
        );
        // Most of the device is in small segments the other thread's cache holds.
        let big = p
            .alloc(0, 56 * MIB)
            .expect("the cache gives its blocks back");
        assert_eq!(stats(&p, 0).ooms, 0);
        p.free(big, FreeKind::Sync, Some(0));
    });
}

/// Out of memory with a free block that fits only once another thread's cache gives back its
/// neighbour: the retry must look for a fit before it fences, too.
fn spurious_oom(thread_cache: u64) -> Result<Addr, CudaError> {
    let p = pool_cache(2 * MIB, thread_cache);
    let mut r = None;
    while_a_thread_holds(
        &p,
        || {
            let v: Vec<Addr> = (0..3).map(|_| p.alloc(0, 512 << 10).unwrap()).collect();
            // Two adjacent blocks freed (into the cache), the third kept.
            p.free(v[0], FreeKind::Sync, Some(0));
            p.free(v[1], FreeKind::Sync, Some(0));
        },
        || {
            r = Some(p.alloc(0, MIB));
        },
    );
    r.unwrap()
}

#[test]
fn out_of_memory_uses_what_thread_caches_give_back() {
    assert!(
        spurious_oom(0).is_ok(),
        "without thread caches the request fits"
    );
    assert!(
        spurious_oom(crate::config::DEFAULT_THREAD_CACHE).is_ok(),
        "with thread caches: spurious OOM"
    );
}
