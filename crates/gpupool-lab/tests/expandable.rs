//! Policies on virtual memory (issue 20) — our pool with expandable segments, PyTorch's
//! expandable-segment rules — against classic segments and no pool at all, on the two
//! fragmentation scenarios the issue measured on a GPU: fill a device with blocks of one size;
//! then free every other block and ask for blocks twice the size; and the comparison's targets
//! on the generated workloads. (Every policy also runs every generated workload, checked after
//! each operation, in `workloads.rs`: they are in the comparison's lineup.)

use gpupool::pool::{Addr, ReuseWait};
use gpupool_lab::policies::expandable::Expandable;
use gpupool_lab::policies::ours::Ours;
use gpupool_lab::policies::simple::NoCache;
use gpupool_lab::policies::CachePolicy;

const MIB: u64 = 1 << 20;
const DEVICE: u64 = 16 << 30;

/// Blocks of `size` until the policy refuses one: their addresses.
fn fill(p: &mut dyn CachePolicy, size: u64) -> Vec<Addr> {
    std::iter::from_fn(|| p.alloc(size)).collect()
}

fn policies() -> Vec<Box<dyn CachePolicy>> {
    vec![
        Box::new(NoCache::new(Some(DEVICE))),
        Box::new(Ours::new(Some(DEVICE), u64::MAX)),
        Box::new(Ours::expandable(Some(DEVICE), u64::MAX)),
        Box::new(Expandable::torch(Some(DEVICE))),
    ]
}

/// Bytes of `size` blocks that fit on the device, per policy, as a share of what fits with no
/// pool: (name, share).
fn fill_shares(size: u64) -> Vec<(String, f64)> {
    let mut fitted = Vec::new();
    for mut p in policies() {
        let n = fill(p.as_mut(), size).len() as u64;
        fitted.push((p.name(), (n * size) as f64));
    }
    let none = fitted[0].1;
    fitted.into_iter().map(|(n, b)| (n, b / none)).collect()
}

fn share(shares: &[(String, f64)], name: &str) -> f64 {
    shares.iter().find(|(n, _)| n == name).expect(name).1
}

#[test]
fn expandable_segments_fit_a_device_filled_with_one_size_as_well_as_no_pool() {
    for (size, at_least) in [
        (7 * MIB, 0.85),
        (12 * MIB, 0.85),
        (5 * MIB + MIB / 10, 0.83),
    ] {
        let shares = fill_shares(size);
        println!("{} MiB blocks: {shares:?}", size as f64 / MIB as f64);
        let granules = share(&shares, "gpupool, expandable");
        assert!(granules >= at_least, "{size}: {granules} < {at_least}");
        // And never worse than today's segments.
        assert!(granules >= share(&shares, "gpupool") - 1e-9, "{shares:?}");
    }
}

#[test]
fn after_freeing_every_other_block_expandable_segments_give_the_holes_back_for_larger_requests() {
    let mut got = Vec::new();
    for mut p in policies() {
        let blocks = fill(p.as_mut(), 7 * MIB);
        for &a in blocks.iter().step_by(2) {
            assert!(p.free(a, ReuseWait::Nothing));
        }
        let n = fill(p.as_mut(), 14 * MIB).len() as u64;
        got.push((p.name(), n * 14 * MIB));
    }
    println!("14 MiB after the half-free: {got:?}");
    let none = got[0].1 as f64;
    let of = |name: &str| got.iter().find(|(n, _)| n == name).unwrap().1 as f64 / none;
    assert!(of("gpupool, expandable") >= 0.80, "{got:?}");
    // PyTorch's 20 MiB pages each keep a live 7 MiB block: few pages come free.
    assert!(
        of("gpupool, expandable") > of("PyTorch expandable"),
        "{got:?}"
    );
}

/// The comparison's lineup holds our real pool with expandable segments next to PyTorch's
/// expandable rules; on training and inference it reserves no more than those rules, and less
/// than our classic segments. (The 1.05 × peak requested is not met yet: 1.076 and
/// 1.089 at the default sizes, BENCHMARKS.md.)
#[test]
fn in_the_lineup_expandable_segments_reserve_no_more_than_pytorch_expandable_rules() {
    use gpupool_lab::policies::{lineup, run};
    use gpupool_lab::workloads::Kind;
    let names: Vec<String> = lineup(1 << 30, None).iter().map(|p| p.name()).collect();
    assert!(
        names.iter().any(|n| n == "gpupool, expandable"),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n.contains("plan")), "{names:?}");
    for kind in [
        Kind::Training { steps: 2 },
        Kind::Inference { requests: 40 },
    ] {
        let w = kind.generate(1);
        let peak = |name: &str| {
            let mut p = lineup(1 << 30, None)
                .into_iter()
                .find(|p| p.name() == name)
                .expect(name);
            run(p.as_mut(), &w).counters.peak_reserved
        };
        let (ours, torch, classic) = (
            peak("gpupool, expandable"),
            peak("PyTorch expandable"),
            peak("gpupool"),
        );
        let requested = w.peak_requested() as f64;
        println!(
            "{}: expandable {:.3}, PyTorch expandable {:.3}, classic {:.3} of peak requested",
            w.name,
            ours as f64 / requested,
            torch as f64 / requested,
            classic as f64 / requested
        );
        assert!(ours <= torch && ours < classic, "{}", w.name);
    }
}
