//! Model-based property tests of the pool core (`gpupool::pool`, no FFI): random sequences of
//! allocate / free / free-and-allocate-the-same-size / free-async / fence (a program
//! synchronization) / barrier (a program action on the legacy stream) / release point /
//! empty-cache / set-threshold / device-reset / `cudaMemGetInfo` / wild frees / injected
//! backend failures on three devices, run against a model driver, and checked after every step
//! against a simple reference model. Most sequences run with expandable segments (the default:
//! large blocks packed in a reserved range, mapped in 2 MiB granules; the driver offers virtual
//! memory), some of those with the mapped slack; the others with classic segments.
//!
//! - the pool's own structural check (`Pool::check`);
//! - no two live blocks overlap; every live block lies in memory the driver gave its device (one
//!   segment, or granules mapped side by side); every pointer is 512-byte aligned;
//! - reserved = the driver's segments of the device plus its mapped granules, the mapped bytes
//!   as the driver counts them, allocated = the live blocks' rounded sizes, cached = reserved −
//!   allocated ≥ pending; the pool's expandable segments are the driver's reserved ranges;
//! - what the pool says it could give back is all its live blocks leave (their segments and the
//!   granules they touch), the rest of the cache stranded; `cudaMemGetInfo` reports that as
//!   free, so the program sees what it could get;
//! - a segment is never given back, nor a granule unmapped, while a live block lies in it, nor a
//!   granule unmapped before a fence that started after every free of a block in it (checked
//!   inside the driver; a barrier is no host wait);
//! - after each release point (an allocation, a program synchronization, `sync_point`,
//!   `empty_cache` with threshold 0) and unless the driver refused a release in that step:
//!   cached ≤ threshold, or every segment and granule still holding cached memory also holds a
//!   live block (granules awaiting a fence for pending blocks may stay at an allocation's
//!   threshold, not at a synchronization's);
//! - a block freed in `strict` mode (or on a non-blocking stream, or in `barrier` mode after a
//!   non-blocking stream was seen) is not handed out again before a fence (the pool's or the
//!   program's) that started after the free; one freed in `barrier` mode (or asynchronously on a
//!   blocking stream in `relaxed` mode) not before a barrier or fence; `relaxed` synchronous
//!   frees at once; one freed by the program's own `cudaFreeAsync` (`FreeKind::Ordered`) at once
//!   on the same stream, else after a fence;
//! - an allocation fails only with an error the driver gave for a segment allocation in that
//!   step, with the driver's refusal of the pool's last request for memory, or with
//!   out-of-memory when the request (rounded, to whole granules from expandable segments) does
//!   not fit beside what the live blocks hold; a failed barrier or memory sample never fails
//!   it, a failed fence only where free granules would have had to go;
//! - a wild, interior or double free is refused and changes nothing.
//!
//! Half the sequences start with another thread allocating on every device, so that in
//! `relaxed` mode (without a threshold) the test thread's blocks go through its thread cache
//! (bounds of 1, 8 and 64 MiB); the test checks that caches served some allocations and that
//! granules were unmapped. A second test runs the same checks with 3 000 MiB devices and
//! requests of 500–1 400 MiB among the others, without a threshold or a maximum split size: the
//! segments with room to grow and the release of idle segments a larger request outgrew; it
//! checks that such releases happened. A third runs 3 000 MiB devices with expandable segments
//! and the slack always on, no threshold, and requests mostly of 1–400 MiB, so that holes stay
//! mapped until a request no hole holds; it checks that granules moved.
//!
//! Deterministic: the seed is fixed (`GPUPOOL_PROPTEST_SEED` overrides it, `PROPTEST_CASES` the
//! number of sequences); a failure prints the seed and the shortest sequence proptest shrank it
//! to.
//!
//! The wrapped driver is in `driver.rs`, the steps and setups in `ops.rs`, the reference model in
//! `model.rs`, the invariants in `check.rs`.

mod check;
mod driver;
mod model;
mod ops;

use check::*;
use driver::*;
use model::*;
use ops::*;

use std::collections::BTreeMap;
use std::sync::Mutex;

use gpupool::config::{DeviceBytes, ReuseMode};
use gpupool::pool::model_driver::{Call, ModelDriver, Segment, GUARD_GAP, VMM_GRANULE};
use gpupool::pool::model_wrapper::ModelWrapper;
use gpupool::pool::size::{LARGE_SPLIT_REMAINDER, SMALL_LIMIT};
use gpupool::pool::{
    Addr, Backend, CudaError, Expandable, FreeKind, FreeOutcome, Policy, Pool, Settings,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

const DEVICES: u32 = 3;
const MIB: u64 = 1 << 20;
/// Streams the model frees and allocates on.
const STREAMS: u64 = 3;
/// The devices' capacity; `BIG_CAPACITY` for the test with requests above 512 MiB.
const CAPACITY: u64 = 160 * MIB;
const BIG_CAPACITY: u64 = 3000 * MIB;

fn run(setup: &Setup, ops: &[Op]) -> Result<(), String> {
    let pool = Pool::new(
        Driver::new(setup.capacity, setup.expandable),
        Settings {
            reuse: setup.reuse,
            threshold: setup.threshold,
            limit: setup.limit,
            policy: Policy {
                max_split_size: setup.max_split_size,
                fence_bytes: setup.fence_bytes,
                mapped_slack_permille: setup.slack,
            },
            trace: None,
            thread_cache: setup.thread_cache,
            // Caches from the second thread on, in every mode: the sequences have no contention.
            cache_contention: 0,
            expandable: setup.expandable,
        },
    );
    if setup.shared {
        // A second thread: the next allocation here turns thread caches on (relaxed mode).
        std::thread::scope(|t| {
            t.spawn(|| {
                for dev in 0..DEVICES {
                    let a = pool.alloc(dev, 4096).expect("first allocation");
                    pool.free(a, FreeKind::Sync, Some(dev));
                }
            });
        });
    }
    let driver = pool.backend();
    let mut m = Reference {
        setup: setup.clone(),
        live: BTreeMap::new(),
        dirty: Vec::new(),
        freed: Vec::new(),
        beyond_barriers: false,
        begun: [None; DEVICES as usize],
    };
    for (step, op) in ops.iter().enumerate() {
        // Odd: `Again` runs its allocation at the next (even) tick, after its free.
        let clock = 2 * step as u64 + 1;
        driver.with(|s| {
            s.clock = clock;
            s.last_request_injected = false;
        });
        driver.model.clear_delivered();
        let release_point =
            apply(&pool, &mut m, op, clock).map_err(|e| format!("step {step} {op:?}: {e}"))?;
        check(&pool, &m, release_point).map_err(|e| format!("after step {step} {op:?}: {e}"))?;
    }
    for dev in 0..DEVICES {
        // The granules this test saw mapped are the driver's mappings.
        let seen: u64 = driver.with(|s| {
            s.mappings
                .values()
                .filter(|m| m.0 == dev)
                .map(|m| m.1)
                .sum()
        });
        let mapped = driver.model.mapped_on(dev);
        if seen != mapped {
            return Err(format!(
                "device {dev}: {seen} bytes seen mapped, the driver {mapped}"
            ));
        }
        if let Some(s) = pool.device_stats(dev) {
            SEEN.with(|c| {
                let mut seen = c.get();
                seen.thread_cache_hits += s.stats.thread_cache_hits;
                seen.outgrown_releases += s.stats.outgrown_releases;
                seen.slack_moves += s.stats.slack_moves;
                c.set(seen)
            });
        }
    }
    SEEN.with(|c| {
        let mut seen = c.get();
        seen.unmaps += driver.model.counts().unmaps;
        c.set(seen)
    });
    Ok(())
}

/// Over the sequences a test ran (on its own thread): allocations thread caches served, idle
/// segments released because a larger request outgrew them, granules unmapped, and moves the
/// mapped slack made; the tests check that the mechanisms they are after were used.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    thread_cache_hits: u64,
    outgrown_releases: u64,
    unmaps: u64,
    slack_moves: u64,
}

thread_local! {
    static SEEN: std::cell::Cell<Seen> = const {
        std::cell::Cell::new(Seen {
            thread_cache_hits: 0,
            outgrown_releases: 0,
            unmaps: 0,
            slack_moves: 0,
        })
    };
}

/// Runs `cases` sequences (`PROPTEST_CASES` overrides) of setups from `setups`, with requests
/// of `sizes`. Returns what they used.
fn check_sequences(setups: impl Strategy<Value = Setup>, sizes: Sizes, cases: u32) -> Seen {
    SEEN.with(|c| c.set(Seen::default()));
    let seed: u64 = std::env::var("GPUPOOL_PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x6770_7570_6f6f_6c21);
    let cases: u32 = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(cases);
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 20_000,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key));
    let strategy = (setups, proptest::collection::vec(op(sizes), 1..120));
    let result = runner.run(&strategy, |(setup, ops)| {
        run(&setup, &ops).map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, (setup, ops))) => panic!(
            "pool model check failed (seed {seed}; rerun with GPUPOOL_PROPTEST_SEED={seed}): \
             {why}\nminimal reproduction ({} steps):\n{setup:?}\n{}",
            ops.len(),
            ops.iter()
                .enumerate()
                .map(|(i, o)| format!("  {i}: {o:?}"))
                .collect::<Vec<_>>()
                .join("\n")
        ),
        Err(e) => panic!("seed {seed}: {e}"),
    }
    let seen = SEEN.with(|c| c.get());
    println!("{seen:?}");
    seen
}

#[test]
fn random_sequences_keep_every_invariant() {
    let seen = check_sequences(setup(), Sizes::Common, 350);
    assert!(
        seen.thread_cache_hits > 0,
        "no sequence went through a thread cache"
    );
    assert!(seen.unmaps > 0, "no sequence unmapped a granule");
}

#[test]
fn random_sequences_with_the_mapped_slack_keep_every_invariant() {
    let seen = check_sequences(slack_setup(), Sizes::Slack, 80);
    assert!(
        seen.slack_moves > 0,
        "no sequence moved granules to stay within its slack"
    );
}

#[test]
fn random_sequences_with_requests_above_512_mib_keep_every_invariant() {
    let seen = check_sequences(big_setup(), Sizes::Big, 200);
    assert!(
        seen.outgrown_releases > 0,
        "no sequence released a segment a larger request outgrew"
    );
    assert!(seen.unmaps > 0, "no sequence unmapped a granule");
}

/// A split remainder of a block freed on stream 5 absorbs a neighbour freed on stream 5 after a
/// barrier began; that barrier's end does not cover the neighbour, so a plain allocation must
/// not get it yet.
#[test]
fn a_split_remainder_keeps_its_neighbours_later_free() {
    let setup = Setup {
        reuse: ReuseMode::Relaxed,
        threshold: DeviceBytes::Unbounded,
        limit: DeviceBytes::Unbounded,
        max_split_size: u64::MAX,
        fence_bytes: 64 * MIB,
        shared: false,
        thread_cache: 0,
        capacity: CAPACITY,
        expandable: false,
        slack: None,
    };
    let free_async = |pick| Op::FreeAsync {
        pick,
        current: 0,
        blocking: true,
        stream: 5,
    };
    let ops = [
        Op::AllocOn {
            dev: 0,
            size: 4 * MIB,
            stream: 5,
        }, // x
        Op::Alloc {
            dev: 0,
            size: 2 * MIB,
        }, // l
        Op::AllocOn {
            dev: 0,
            size: 4 * MIB,
            stream: 5,
        }, // n
        Op::Alloc {
            dev: 0,
            size: 10 * MIB,
        }, // t
        Op::Alloc {
            dev: 0,
            size: 12 * MIB,
        }, // y, a segment of its own
        Op::Free {
            pick: 4,
            current: 0,
        }, // y
        free_async(0), // x
        Op::BarrierBegin { dev: 0 },
        Op::Free {
            pick: 0,
            current: 0,
        }, // l
        free_async(0), // n
        Op::AllocOn {
            dev: 0,
            size: 2 * MIB,
            stream: 5,
        }, // 2 MiB of x
        Op::EmptyCache { dev: 0 },
        Op::BarrierEnd { dev: 0 },
        Op::Alloc {
            dev: 0,
            size: 8 * MIB,
        },
    ];
    run(&setup, &ops).unwrap();
}

/// A block freed between a hole and a live block must serve again at the limit. At the hole's
/// start it would map one granule more than where it was, at the hole's end, whose last granule
/// the live neighbour maps; the retry after a refused mapping takes the room that maps the
/// fewest (`DevicePool::cheapest_room`). Found by the model sequences (seed 401 of the slack
/// test, before a fit that maps granules waited for the ladder's cheaper steps).
#[test]
fn a_block_that_fits_where_it_was_is_not_refused_at_the_limit() {
    let pool = Pool::new(
        Driver::new(BIG_CAPACITY, true),
        Settings {
            reuse: ReuseMode::Strict,
            threshold: DeviceBytes::Unbounded,
            limit: DeviceBytes::Bytes(98 * MIB),
            policy: Policy {
                max_split_size: u64::MAX,
                fence_bytes: 0,
                mapped_slack_permille: None,
            },
            trace: None,
            thread_cache: MIB,
            cache_contention: 0,
            expandable: true,
        },
    );
    let granule = VMM_GRANULE;
    // a in granule 0; b in granules 1 to 20, the last shared with c.
    let a = pool.alloc(0, granule).unwrap();
    let size_b = 20 * granule - 512 * 1024;
    let b = pool.alloc(0, size_b).unwrap();
    assert_eq!(b, a + granule);
    pool.free(a, FreeKind::Sync, Some(0));
    // c maps granules 21 to 49 once a's granule went back for it: 98 MiB mapped.
    let c = pool.alloc(0, 30 * granule - 512 * 1024 - granule).unwrap();
    assert_eq!(c, b + size_b);
    assert_eq!(pool.backend().model.mapped_on(0), 98 * MIB);
    pool.free(b, FreeKind::Sync, Some(0));
    // c holds 30 granules: b's place needs the 19 the limit leaves, the hole's start 20.
    let again = pool.alloc(0, size_b);
    assert_eq!(again, Ok(b), "with c holding 60 MiB of a 98 MiB limit");
    assert!(pool.backend().model.mapped_on(0) <= 98 * MIB);
    for x in [b, c] {
        pool.free(x, FreeKind::Sync, Some(0));
    }
    pool.check().unwrap();
}
