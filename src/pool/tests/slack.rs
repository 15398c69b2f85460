//! The mapped slack (`device/slack.rs`, `GPUPOOL_EXPANDABLE_SLACK`): free granules move to a
//! block that needs mapping instead of the pool growing, never under work in flight, within
//! their share of the bytes allocated.

use super::expandable::{program_sync, vmm_model, vmm_settings, InFlight, DEVICE};
use super::*;
use crate::pool::model_driver::VMM_GRANULE;

/// Expandable segments with a slack of `permille` thousandths (`None`: off).
fn slack_settings(reuse: ReuseMode, permille: Option<u32>) -> Settings {
    let mut s = vmm_settings(reuse, DeviceBytes::Unbounded);
    s.policy.mapped_slack_permille = permille;
    s
}

/// 100 MiB blocks `a` and `b`, then 64 MiB allocated and freed `rounds` times after them
/// (traffic that maps nothing new), then `a` freed: a 100 MiB hole, mapped. Then a 150 MiB
/// request, which no hole holds. Returns the bytes mapped on the device after it.
fn hole_then_larger_request<B: Backend + AsRef<ModelDriver>>(p: &Pool<B>, rounds: u32) -> u64 {
    let a = p.alloc(0, 100 * MIB).unwrap();
    let b = p.alloc(0, 100 * MIB).unwrap();
    for _ in 0..rounds {
        let x = p.alloc(0, 64 * MIB).unwrap();
        p.free(x, FreeKind::Sync, Some(0));
    }
    p.free(a, FreeKind::Sync, Some(0));
    let d = p.alloc(0, 150 * MIB).unwrap();
    let mapped = p.backend().as_ref().mapped_on(0);
    assert_eq!(
        stats(p, 0).reserved.current,
        mapped,
        "the pool counts what is mapped"
    );
    for x in [b, d] {
        p.free(x, FreeKind::Sync, Some(0));
    }
    assert_sound(p);
    mapped
}

#[test]
fn a_request_no_hole_holds_takes_the_free_granules_instead_of_mapping_more() {
    let without = Pool::new(vmm_model(DEVICE), slack_settings(ReuseMode::Strict, None));
    // 100 MiB hole + 100 MiB + 150 MiB.
    assert_eq!(hole_then_larger_request(&without, 40), 350 * MIB);
    let fences_without = stats(&without, 0).fences;

    let p = Pool::new(
        vmm_model(DEVICE),
        slack_settings(ReuseMode::Strict, Some(40)),
    );
    let mapped = hole_then_larger_request(&p, 40);
    let st = stats(&p, 0);
    // The peak allocated was a, b and one 64 MiB block; the slack adds at least 32 MiB.
    let budget = 264 * MIB + 32 * MIB;
    assert_eq!(mapped, budget, "the hole gave what the slack did not allow");
    assert_eq!(st.slack_unmapped_granules * VMM_GRANULE, 350 * MIB - budget);
    // The fence the fit took before carving the range's end (`better_fit`) covered every
    // free: the move needed none of its own.
    assert_eq!(
        (st.slack_moves, st.fences),
        (1, fences_without),
        "one move, no fence more"
    );
    // The hole's address space is still the pool's: a 100 MiB request maps it again.
    let again = p.alloc(0, 100 * MIB).unwrap();
    p.free(again, FreeKind::Sync, Some(0));
    assert_sound(&p);
}

#[test]
fn moves_stay_within_a_32th_of_the_bytes_allocated() {
    // Without the 64 MiB traffic, 200 MiB allocated before the request allow 6.25 MiB of
    // moves: 3 granules.
    let p = Pool::new(
        vmm_model(DEVICE),
        slack_settings(ReuseMode::Strict, Some(40)),
    );
    let mapped = hole_then_larger_request(&p, 0);
    let st = stats(&p, 0);
    assert_eq!(st.slack_unmapped_granules, 3);
    assert_eq!(mapped, 350 * MIB - 3 * VMM_GRANULE);
}

#[test]
fn no_granule_moves_while_work_issued_before_its_free_may_run() {
    for reuse in [ReuseMode::Strict, ReuseMode::Barrier, ReuseMode::Relaxed] {
        let p = Pool::new(InFlight::new(DEVICE), slack_settings(reuse, Some(20)));
        let d = p.backend();
        let mut live: Vec<(Addr, u64)> = Vec::new();
        let mut rng = crate::rng::Rng::new(11);
        for step in 0..4000u64 {
            if live.len() > 40 || (!live.is_empty() && rng.percent(45)) {
                let (a, n) = live.swap_remove(rng.range(0, live.len() as u64 - 1) as usize);
                // A kernel on the block, still running when it is freed.
                d.launch(a, n);
                p.free(a, FreeKind::Sync, Some(0));
            } else {
                let n = rng.range(2, 96) * MIB + rng.range(0, 3) * 512;
                live.push((p.alloc(0, n).unwrap(), n));
            }
            if step % 700 == 300 {
                d.program_fence();
                program_sync(&p);
            }
        }
        let st = stats(&p, 0);
        println!(
            "{reuse:?}: {} granules moved in {} moves",
            st.slack_unmapped_granules, st.slack_moves
        );
        assert!(st.slack_moves > 0, "{reuse:?}: nothing moved");
        let bad = d.unmaps_under_work.lock().unwrap().clone();
        assert!(bad.is_empty(), "{reuse:?}: unmapped under work: {bad:x?}");
        assert!(
            st.slack_unmapped_granules * VMM_GRANULE <= st.allocated.total_in / 32,
            "{reuse:?}: moves beyond their share"
        );
        for (a, _) in live {
            p.free(a, FreeKind::Sync, Some(0));
        }
        assert_sound(&p);
    }
}

#[test]
fn a_fence_that_merges_the_chosen_block_leaves_the_request_served_from_what_took_it_in() {
    let p = Pool::new(
        vmm_model(DEVICE),
        slack_settings(ReuseMode::Strict, Some(40)),
    );
    for _ in 0..40 {
        let x = p.alloc(0, 64 * MIB).unwrap();
        p.free(x, FreeKind::Sync, Some(0));
        program_sync(&p);
    }
    let [a, b, c] = [0; 3].map(|_| p.alloc(0, 100 * MIB).unwrap());
    p.free(a, FreeKind::Sync, Some(0));
    program_sync(&p);
    // `c`, just below the range's unused end, waits for a fence: the request's fit is that end,
    // and the move's fence merges `c` into it.
    p.free(c, FreeKind::Sync, Some(0));
    let fences = stats(&p, 0).fences;
    let d = p.alloc(0, 250 * MIB).unwrap();
    let st = stats(&p, 0);
    assert_eq!(st.fences, fences + 1, "the move fenced");
    assert_eq!(d, c, "served from `c` and the end it merged with");
    assert!(st.slack_unmapped_granules > 0, "the hole moved");
    assert_eq!(st.reserved.current, p.backend().mapped_on(0));
    assert_sound(&p);
    for x in [b, d] {
        p.free(x, FreeKind::Sync, Some(0));
    }
    assert_sound(&p);
}
