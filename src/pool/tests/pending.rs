//! Reuse safety (`device/pending.rs`): freed blocks wait for a fence or a barrier, by reuse
//! mode; the fence budget.

use super::*;

#[test]
fn strict_mode_never_reuses_before_a_fence() {
    let p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    let a = p.alloc(0, 4096).unwrap();
    p.free(a, FreeKind::Sync, None);
    let b = p.alloc(0, 4096).unwrap();
    assert_ne!(a, b, "reused a block no fence covered");
    assert_eq!(p.backend().counts().fences, 0);
    // The program synchronizes the device: everything freed before is safe.
    let seq = p.seq_before_sync(0);
    p.observe_fence(0, seq);
    let c = p.alloc(0, 4096).unwrap();
    assert_eq!(c, a);
    assert_eq!(stats(&p, 0).observed_fences, 1);
    p.check().unwrap();
}

#[test]
fn strict_mode_fences_once_pending_memory_reaches_the_budget() {
    let p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    // 64 MiB of frees wait for a fence, then the next miss takes one and reuses.
    let v: Vec<Addr> = (0..8).map(|_| p.alloc(0, 8 * MIB).unwrap()).collect();
    for a in &v {
        p.free(*a, FreeKind::Sync, None);
    }
    let before = stats(&p, 0).real_mallocs;
    let x = p.alloc(0, 8 * MIB).unwrap();
    assert!(v.contains(&x));
    assert_eq!(p.backend().counts().fences, 1);
    assert_eq!(stats(&p, 0).real_mallocs, before);
    p.check().unwrap();
}

#[test]
fn a_fence_does_not_cover_frees_made_after_it_started() {
    let p = pool_with(ReuseMode::Strict, DeviceBytes::Unbounded, 80 << 30);
    let a = p.alloc(0, 4096).unwrap();
    let seq = p.seq_before_sync(0);
    p.free(a, FreeKind::Sync, None);
    p.observe_fence(0, seq);
    assert_ne!(p.alloc(0, 4096).unwrap(), a);
}

#[test]
fn barrier_mode_issues_one_barrier_for_many_blocks() {
    let p = classic_pool_with(ReuseMode::Barrier, DeviceBytes::Unbounded, 80 << 30);
    // 12 MiB blocks each have a segment of their own.
    let v: Vec<Addr> = (0..4).map(|_| p.alloc(0, 12 * MIB).unwrap()).collect();
    for a in &v {
        p.free(*a, FreeKind::Sync, None);
    }
    for _ in 0..4 {
        assert!(v.contains(&p.alloc(0, 12 * MIB).unwrap()));
    }
    assert_eq!(p.backend().counts().barriers, 1);
    assert_eq!(stats(&p, 0).real_mallocs, 4);
    // The program's own legacy-stream launch is a barrier too.
    let w = p.alloc(0, 12 * MIB).unwrap();
    let mut seq = p.seq_before_sync(0);
    seq.freed += 1;
    p.free(w, FreeKind::Sync, None);
    p.observe_barrier(0, seq);
    assert_eq!(p.alloc(0, 12 * MIB).unwrap(), w);
    assert_eq!(p.backend().counts().barriers, 1);
}

#[test]
fn barrier_mode_falls_back_to_fences_after_a_nonblocking_stream() {
    let p = pool_with(ReuseMode::Barrier, DeviceBytes::Unbounded, 80 << 30);
    p.note_work_beyond_barriers();
    let a = p.alloc(0, 4096).unwrap();
    p.free(a, FreeKind::Sync, None);
    assert_ne!(p.alloc(0, 4096).unwrap(), a);
    assert_eq!(p.backend().counts().barriers, 0);
}

#[test]
fn relaxed_mode_reuses_at_once_but_not_async_frees_on_nonblocking_streams() {
    let p = relaxed();
    let a = p.alloc(0, 4096).unwrap();
    p.free(a, FreeKind::Sync, None);
    assert_eq!(p.alloc(0, 4096).unwrap(), a);
    p.free(
        a,
        FreeKind::Async {
            blocking: false,
            stream: 7,
        },
        None,
    );
    assert_ne!(p.alloc(0, 4096).unwrap(), a);
    p.check().unwrap();
}
