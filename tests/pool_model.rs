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

/// What this test checks beyond the model driver: the step that is running, per device the
/// last step in which a fence / barrier succeeded, the reference model's live blocks
/// (base → (device, rounded bytes)), to catch a segment released or a granule unmapped with a
/// live block in it, the frees no fence has covered yet (device, base, bytes, step), to catch a
/// granule unmapped under work that may still run, and the granules mapped.
#[derive(Default)]
struct Checks {
    clock: u64,
    last_fence: [u64; DEVICES as usize],
    last_barrier: [u64; DEVICES as usize],
    live: BTreeMap<Addr, (u32, u64)>,
    unfenced_frees: Vec<(u32, Addr, u64, u64)>,
    /// The memory mapped (`vmm_map`) and not unmapped: address → (device, bytes). The
    /// driver's other segments are classic ones.
    mappings: BTreeMap<Addr, (u32, u64)>,
    /// The address ranges reserved (`vmm_reserve`) and not freed: base → (device, bytes).
    ranges: BTreeMap<Addr, (u32, u64)>,
    /// The last request for memory in this step (a segment or a mapping) met a failure the
    /// test injected: the pool may pass that refusal on.
    last_request_injected: bool,
    violations: Vec<String>,
}

impl Checks {
    /// A fence on `device` in this step: every free before it is covered.
    fn fenced(&mut self, device: u32) {
        let clock = self.clock;
        self.last_fence[device as usize] = clock;
        self.unfenced_frees
            .retain(|&(d, _, _, at)| d != device || at >= clock);
    }
}

/// The pool core's model driver (a capacity per device, never-reused addresses, injected
/// failures, virtual memory when the setup turns expandable segments on), with the checks
/// above.
struct Driver {
    model: ModelDriver,
    checks: Mutex<Checks>,
}

impl Driver {
    fn new(capacity: u64, vmm: bool) -> Self {
        let model = ModelDriver::new()
            .with_capacity(capacity)
            .with_gap(GUARD_GAP);
        Driver {
            model: if vmm { model.with_vmm() } else { model },
            checks: Mutex::new(Checks::default()),
        }
    }

    /// `request`, a call for memory, noting whether it met an injected failure.
    fn requesting<E>(&self, request: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let before = self.model.delivered().len();
        let r = request();
        let injected = self.model.delivered().len() > before;
        self.with(|s| s.last_request_injected = injected);
        r
    }

    fn with<T>(&self, f: impl FnOnce(&mut Checks) -> T) -> T {
        f(&mut self.checks.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl AsRef<ModelDriver> for Driver {
    fn as_ref(&self) -> &ModelDriver {
        &self.model
    }
}

impl ModelWrapper for Driver {
    fn alloc_segment(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        let mut addr = 0;
        self.requesting(|| {
            addr = self.model.alloc_segment(device, bytes)?;
            Ok(())
        })?;
        Ok(addr)
    }

    fn free_segment(&self, device: u32, addr: Addr) -> Result<(), CudaError> {
        let segment = self.model.release(device, addr)?;
        self.with(|s| {
            if let Some((b, _)) = s.live.range(addr..addr + segment.bytes).next() {
                let bytes = segment.bytes;
                s.violations.push(format!(
                    "released segment {addr:#x}+{bytes} with live block {b:#x} in it"
                ));
            }
        });
        Ok(())
    }

    fn fence(&self, device: u32) -> Result<(), CudaError> {
        self.model.fence(device)?;
        self.with(|s| s.fenced(device));
        Ok(())
    }

    fn barrier(&self, device: u32) -> Result<(), CudaError> {
        self.model.barrier(device)?;
        self.with(|s| s.last_barrier[device as usize] = s.clock);
        Ok(())
    }

    fn vmm_reserve(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        let addr = self.model.vmm_reserve(device, bytes)?;
        self.with(|s| s.ranges.insert(addr, (device, bytes)));
        Ok(addr)
    }

    fn vmm_free_reservation(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        self.model.vmm_free_reservation(device, addr, bytes)?;
        self.with(|s| s.ranges.remove(&addr));
        Ok(())
    }

    fn vmm_map(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        self.requesting(|| self.model.vmm_map(device, addr, bytes))?;
        self.with(|s| s.mappings.insert(addr, (device, bytes)));
        Ok(())
    }

    /// `cuMemUnmap` waits for nothing: the granule must hold no live block, and no block
    /// freed since the last fence (a kernel issued before the free may still run on it; a
    /// barrier is no host wait).
    fn vmm_unmap(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        let end = addr + bytes;
        self.with(|s| {
            // Live blocks do not overlap: only the last one starting before `end` can reach in.
            if let Some((&b, &(d, len))) = s.live.range(..end).next_back() {
                if b + len > addr {
                    s.violations.push(format!(
                        "unmapped {addr:#x}+{bytes} in step {} under live {b:#x}+{len} (device \
                         {d})",
                        (s.clock - 1) / 2
                    ));
                }
            }
            if let Some(&(_, b, len, at)) = s
                .unfenced_frees
                .iter()
                .find(|&&(d, b, len, _)| d == device && b < end && addr < b + len)
            {
                s.violations.push(format!(
                    "unmapped {addr:#x}+{bytes} in step {} over {b:#x}+{len}, freed in step {} \
                     and no fence since",
                    (s.clock - 1) / 2,
                    (at - 1) / 2
                ));
            }
        });
        self.model.vmm_unmap(device, addr, bytes)?;
        self.with(|s| s.mappings.remove(&addr));
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
enum Wild {
    /// Inside a live block, not its start.
    Interior,
    /// A block already freed (and not handed out again).
    Double,
    /// An address no one handed out.
    Random,
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        dev: u32,
        size: u64,
    },
    /// An allocation for use on stream `stream` (`gpupool_malloc_async`).
    AllocOn {
        dev: u32,
        size: u64,
        stream: u64,
    },
    /// Free the `pick`-th live block (modulo their number) with `current` the current device.
    Free {
        pick: usize,
        current: u32,
    },
    FreeAsync {
        pick: usize,
        current: u32,
        blocking: bool,
        stream: u64,
    },
    /// The program's own `cudaFreeAsync` in `strict` or `barrier` mode (`FreeKind::Ordered`).
    FreeOrdered {
        pick: usize,
        current: u32,
        stream: u64,
    },
    /// The program's `cudaDeviceSynchronize` on `dev`.
    Fence {
        dev: u32,
    },
    /// A program action on `dev`'s legacy stream (a kernel launch).
    Barrier {
        dev: u32,
    },
    /// Another thread's legacy-stream action starts (its sequence is read) ...
    BarrierBegin {
        dev: u32,
    },
    /// ... and completes, covering what was freed before it started.
    BarrierEnd {
        dev: u32,
    },
    /// A program stream/event synchronization: the release threshold applies.
    Release {
        dev: u32,
    },
    EmptyCache {
        dev: u32,
    },
    SetThreshold {
        bytes: u64,
    },
    SetDeviceThreshold {
        dev: u32,
        bytes: u64,
    },
    Reset {
        dev: u32,
    },
    NonBlockingStream,
    /// The program asks `cudaMemGetInfo` on `dev`.
    MemoryInfo {
        dev: u32,
    },
    WildFree {
        how: Wild,
        pick: usize,
    },
    /// The next call of this kind fails with `code`.
    Fail {
        call: Call,
        code: i32,
    },
    /// Free a live block (its device current) and allocate its size again on its device, as a
    /// program does with a tensor of the same shape each step.
    Again {
        pick: usize,
    },
}

#[derive(Clone, Debug)]
struct Setup {
    reuse: ReuseMode,
    threshold: DeviceBytes,
    /// The pool's limit (`GPUPOOL_LIMIT`): reserved never exceeds it, and out-of-memory is
    /// allowed only when the request does not fit within it either.
    limit: DeviceBytes,
    max_split_size: u64,
    fence_bytes: u64,
    /// Another thread allocated on every device first, so in `relaxed` mode (without a
    /// threshold) this thread's small blocks go through its own cache, of this bound.
    shared: bool,
    thread_cache: u64,
    capacity: u64,
    /// Large blocks come from expandable segments (the driver then offers virtual memory),
    /// with the mapped slack (`mapped_slack_permille`) if set.
    expandable: bool,
    slack: Option<u32>,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![
            Just(ReuseMode::Strict),
            Just(ReuseMode::Barrier),
            Just(ReuseMode::Relaxed)
        ],
        prop_oneof![
            Just(DeviceBytes::Unbounded),
            Just(DeviceBytes::Bytes(0)),
            Just(DeviceBytes::Bytes(4 * MIB)),
            Just(DeviceBytes::Bytes(40 * MIB)),
            Just(DeviceBytes::Fraction(0.25)),
        ],
        prop_oneof![Just(u64::MAX), Just(2 * MIB), Just(16 * MIB)],
        prop_oneof![Just(0), Just(MIB), Just(4 * MIB), Just(64 * MIB)],
        (
            any::<bool>(),
            prop_oneof![Just(MIB), Just(8 * MIB), Just(64 * MIB)],
            prop_oneof![
                4 => Just(DeviceBytes::Unbounded),
                1 => Just(DeviceBytes::Bytes(100 * MIB)),
                1 => Just(DeviceBytes::Fraction(0.5)),
            ],
        ),
        // Expandable segments are the default: most sequences run with them.
        (
            prop_oneof![2 => Just(false), 3 => Just(true)],
            prop_oneof![Just(None), Just(Some(0)), Just(Some(40)), Just(Some(200))],
        ),
    )
        .prop_map(
            |(
                reuse,
                threshold,
                max_split_size,
                fence_bytes,
                (shared, thread_cache, limit),
                (expandable, slack),
            )| {
                Setup {
                    reuse,
                    threshold,
                    limit,
                    max_split_size,
                    fence_bytes,
                    shared,
                    thread_cache,
                    capacity: CAPACITY,
                    expandable,
                    slack: slack.filter(|_| expandable),
                }
            },
        )
}

/// Devices large enough for requests above 512 MiB, without the settings that turn the growth
/// rules off (a threshold, a maximum split size).
fn big_setup() -> impl Strategy<Value = Setup> {
    setup().prop_map(|s| Setup {
        threshold: DeviceBytes::Unbounded,
        max_split_size: u64::MAX,
        capacity: BIG_CAPACITY,
        ..s
    })
}

/// Devices large enough that few requests fail, with expandable segments and the mapped slack
/// always on and no threshold: holes stay mapped until a request no hole holds moves them.
fn slack_setup() -> impl Strategy<Value = Setup> {
    (setup(), prop_oneof![Just(0), Just(40), Just(200)]).prop_map(|(s, permille)| Setup {
        threshold: DeviceBytes::Unbounded,
        capacity: BIG_CAPACITY,
        expandable: true,
        slack: Some(permille),
        ..s
    })
}

/// The requests a test's sequences make.
#[derive(Clone, Copy, Debug)]
enum Sizes {
    /// From 1 byte to 200 MiB, and sizes that cannot be served.
    Common,
    /// `Common`, and 500–1400 MiB.
    Big,
    /// Mostly 1–400 MiB: holes of many sizes in the mapped range.
    Slack,
}

/// Sizes at the edges that matter to expandable segments: around whole granules (a block
/// that ends one byte into a granule maps it) and a split remainder of 1 MiB.
fn granule_edge() -> impl Strategy<Value = u64> {
    let deltas = [0, 1, 512, MIB - 512, MIB, MIB + 512];
    (1..=40u64, 0..deltas.len(), any::<bool>()).prop_map(move |(k, d, below)| {
        let at = k * VMM_GRANULE;
        if below {
            at - deltas[d].max(512)
        } else {
            at + deltas[d]
        }
    })
}

fn size(sizes: Sizes) -> BoxedStrategy<u64> {
    let common = prop_oneof![
        6 => 1..=MIB,
        2 => prop_oneof![Just(512u64), Just(4096), Just(65536), Just(MIB)],
        3 => MIB + 1..=10 * MIB,
        2 => granule_edge(),
        2 => 10 * MIB + 1..=64 * MIB,
        1 => 100 * MIB..=200 * MIB,
        1 => prop_oneof![Just(u64::MAX), Just(u64::MAX - 511), Just(u64::MAX - 4096), Just(1 << 62)],
    ];
    match sizes {
        Sizes::Common => common.boxed(),
        Sizes::Big => prop_oneof![6 => common, 1 => 500 * MIB..=1400 * MIB].boxed(),
        Sizes::Slack => prop_oneof![
            1 => 1..=MIB,
            4 => MIB + 1..=64 * MIB,
            2 => granule_edge(),
            2 => 64 * MIB + 1..=400 * MIB,
        ]
        .boxed(),
    }
}

fn threshold_bytes() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0), Just(2 * MIB), Just(30 * MIB), Just(u64::MAX)]
}

fn op(sizes: Sizes) -> impl Strategy<Value = Op> {
    let dev = 0..DEVICES;
    prop_oneof![
        12 => (dev.clone(), size(sizes)).prop_map(|(dev, size)| Op::Alloc { dev, size }),
        8 => (any::<usize>(), dev.clone()).prop_map(|(pick, current)| Op::Free { pick, current }),
        4 => (dev.clone(), size(sizes), 0..STREAMS)
            .prop_map(|(dev, size, stream)| Op::AllocOn { dev, size, stream }),
        5 => (any::<usize>(), dev.clone(), any::<bool>(), 0..STREAMS).prop_map(
            |(pick, current, blocking, stream)| Op::FreeAsync {
                pick,
                current,
                blocking,
                stream
            }
        ),
        3 => (any::<usize>(), dev.clone(), 0..STREAMS).prop_map(|(pick, current, stream)| {
            Op::FreeOrdered {
                pick,
                current,
                stream,
            }
        }),
        2 => dev.clone().prop_map(|dev| Op::Fence { dev }),
        2 => dev.clone().prop_map(|dev| Op::Barrier { dev }),
        2 => dev.clone().prop_map(|dev| Op::BarrierBegin { dev }),
        2 => dev.clone().prop_map(|dev| Op::BarrierEnd { dev }),
        2 => dev.clone().prop_map(|dev| Op::Release { dev }),
        1 => dev.clone().prop_map(|dev| Op::EmptyCache { dev }),
        1 => threshold_bytes().prop_map(|bytes| Op::SetThreshold { bytes }),
        1 => (dev.clone(), threshold_bytes())
            .prop_map(|(dev, bytes)| Op::SetDeviceThreshold { dev, bytes }),
        1 => dev.clone().prop_map(|dev| Op::Reset { dev }),
        1 => Just(Op::NonBlockingStream),
        1 => dev.clone().prop_map(|dev| Op::MemoryInfo { dev }),
        1 => (
            prop_oneof![Just(Wild::Interior), Just(Wild::Double), Just(Wild::Random)],
            any::<usize>()
        )
            .prop_map(|(how, pick)| Op::WildFree { how, pick }),
        2 => (
            prop_oneof![
                Just(Call::Malloc),
                Just(Call::Free),
                Just(Call::Fence),
                Just(Call::Barrier),
                Just(Call::MemoryInfo),
                Just(Call::Reserve),
                Just(Call::Map)
            ],
            prop_oneof![Just(1), Just(2), Just(3), Just(100), Just(700), Just(999)]
        )
            .prop_map(|(call, code)| Op::Fail { call, code }),
        3 => any::<usize>().prop_map(|pick| Op::Again { pick }),
    ]
}

/// What a freed block waits for, as the README states the reuse modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    Nothing,
    Barrier,
    Fence,
}

fn wait_for(reuse: ReuseMode, kind: FreeKind, nonblocking_seen: bool) -> Wait {
    match (reuse, kind) {
        (ReuseMode::Strict, _)
        | (_, FreeKind::Ordered { .. })
        | (
            _,
            FreeKind::Async {
                blocking: false, ..
            },
        ) => Wait::Fence,
        (ReuseMode::Barrier, _) if nonblocking_seen => Wait::Fence,
        (ReuseMode::Barrier, _) | (ReuseMode::Relaxed, FreeKind::Async { .. }) => Wait::Barrier,
        (ReuseMode::Relaxed, FreeKind::Sync) => Wait::Nothing,
    }
}

#[derive(Clone, Copy, Debug)]
struct Dirty {
    dev: u32,
    addr: Addr,
    len: u64,
    freed_at: u64,
    wait: Wait,
    /// Freed on this stream: in `relaxed` mode, an allocation on the same stream may reuse it
    /// at once (stream order covers it).
    stream: Option<u64>,
    /// Freed by the program's own `cudaFreeAsync`: the same stream may reuse it at once in
    /// every mode.
    ordered: bool,
}

/// The reference model.
struct Reference {
    setup: Setup,
    /// Live blocks: base → (device, rounded, requested).
    live: BTreeMap<Addr, (u32, u64, u64)>,
    /// Freed ranges not yet covered by what their reuse waits for.
    dirty: Vec<Dirty>,
    /// Addresses freed and not handed out since (for double frees).
    freed: Vec<Addr>,
    nonblocking_seen: bool,
    /// A barrier begun per device: (its sequence, the step it began).
    begun: [Option<(gpupool::pool::SyncSeq, u64)>; DEVICES as usize],
}

fn round(size: u64) -> Option<u64> {
    size.max(1).checked_add(511).map(|v| v & !511)
}

fn fail(msg: String) -> Result<(), String> {
    Err(msg)
}

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
        nonblocking_seen: false,
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

/// What a step's release point must have given back (`check`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Released {
    /// An allocation: down to the threshold, but for the granules pending blocks keep.
    Threshold,
    /// A program synchronization: down to the threshold, the granules pending blocks kept too
    /// (the pool fences for them, as a classic segment's `cudaFree` waits).
    Synchronized,
    /// Empty-cache: everything free.
    All,
}

/// Runs one step against the pool and the model; returns the device whose release point must
/// hold afterwards, and what it gives back.
fn apply(
    pool: &Pool<Driver>,
    m: &mut Reference,
    op: &Op,
    clock: u64,
) -> Result<Option<(u32, Released)>, String> {
    let driver = pool.backend();
    let pick_live = |m: &Reference, pick: usize| -> Option<(Addr, u32, u64)> {
        let n = m.live.len();
        (n > 0).then(|| {
            let (&a, &(d, len, _)) = m.live.iter().nth(pick % n).expect("in range");
            (a, d, len)
        })
    };
    match *op {
        Op::Again { pick } => {
            let Some((addr, dev, _)) = pick_live(m, pick) else {
                return Ok(None);
            };
            let size = m.live[&addr].2;
            apply(pool, m, &Op::Free { pick, current: dev }, clock)?;
            driver.with(|s| s.clock = clock + 1);
            return apply(pool, m, &Op::Alloc { dev, size }, clock + 1);
        }
        Op::Alloc { dev, size } | Op::AllocOn { dev, size, .. } => {
            let on = match *op {
                Op::AllocOn { stream, .. } => Some(stream),
                _ => None,
            };
            let r = pool.alloc_on(dev, size, on);
            let delivered = driver.model.delivered();
            match r {
                Ok(addr) => {
                    let rounded = round(size).ok_or("a size that does not round was served")?;
                    // The block may be larger than the request when the rest is too small to
                    // split off (or `max_split_size` keeps it whole).
                    let (bdev, block) = pool.live_block(addr).ok_or("not a live block")?;
                    let len = block.size;
                    if bdev != dev || len < rounded || block.requested != size {
                        return Err(format!(
                            "{addr:#x}: block of {len} bytes on device {bdev} for {size} on {dev}"
                        ));
                    }
                    if addr % 512 != 0 {
                        return Err(format!("{addr:#x} is not 512-byte aligned"));
                    }
                    if let Some((&b, &(bd, blen, _))) = m.live.range(..addr + len).next_back() {
                        if b + blen > addr {
                            return Err(format!(
                                "{addr:#x}+{len} overlaps live {b:#x}+{blen} (device {bd})"
                            ));
                        }
                    }
                    reuse_allowed(driver, m, dev, addr, len, clock, on)?;
                    m.live.insert(addr, (dev, len, size));
                    m.freed.retain(|&f| f < addr || f >= addr + len);
                    driver.with(|s| s.live.insert(addr, (dev, len)));
                }
                Err(CudaError::MEMORY_ALLOCATION) => {
                    let Some(len) = round(size) else {
                        return Ok(Some((dev, Released::Threshold)));
                    };
                    let refused_release = delivered.iter().any(|d| d.0 == Call::Free);
                    let used = held_for_live(&driver.model.segments(), m)[dev as usize];
                    let capacity = m
                        .setup
                        .limit
                        .resolve(m.setup.capacity)
                        .min(m.setup.capacity);
                    let mapped = pool
                        .device_stats(dev)
                        .is_some_and(|s| s.expandable == Expandable::On);
                    // From expandable segments, whole granules: the fewest a hole between
                    // live blocks needs, or all of a new placement's.
                    let need = if mapped && len > SMALL_LIMIT {
                        least_to_map(driver, m, dev, len).map(|(least, fresh)| least.min(fresh))
                    } else {
                        Some(len)
                    };
                    // The driver refused the pool's last request for memory: its answer (a
                    // refused mapping is out of memory once mappings worked).
                    let refused_last = driver.with(|s| s.last_request_injected);
                    // Free granules go back only after a fence: a failed one may leave the
                    // request unserved. Classic segments need none (`cudaFree` waits).
                    let refused_unmap = mapped && delivered.iter().any(|d| d.0 == Call::Fence);
                    let fits = need.and_then(|n| used.checked_add(n));
                    let excused = refused_release || refused_last || refused_unmap;
                    if !excused && fits.is_some_and(|t| t <= capacity) {
                        return Err(format!(
                            "out of memory for {len} bytes (needing {need:?}) with {used} of \
                             {capacity} held for live blocks"
                        ));
                    }
                }
                Err(CudaError(code)) => {
                    if !delivered.contains(&(Call::Malloc, code)) {
                        return Err(format!(
                            "failed with {code}; the driver's failures in this step: {delivered:?}"
                        ));
                    }
                }
            }
            return Ok(Some((dev, Released::Threshold)));
        }
        Op::Free { pick, current }
        | Op::FreeAsync { pick, current, .. }
        | Op::FreeOrdered { pick, current, .. } => {
            let Some((addr, dev, len)) = pick_live(m, pick) else {
                return Ok(None);
            };
            let kind = match *op {
                Op::FreeAsync {
                    blocking, stream, ..
                } => FreeKind::Async { blocking, stream },
                Op::FreeOrdered { stream, .. } => FreeKind::Ordered { stream },
                _ => FreeKind::Sync,
            };
            let out = pool.free(addr, kind, Some(current));
            if out != FreeOutcome::Freed {
                return Err(format!("free of live {addr:#x} gave {out:?}"));
            }
            m.live.remove(&addr);
            driver.with(|s| {
                s.live.remove(&addr);
                s.unfenced_frees.push((dev, addr, len, clock));
            });
            m.freed.push(addr);
            let wait = wait_for(m.setup.reuse, kind, m.nonblocking_seen);
            if wait != Wait::Nothing {
                m.dirty.push(Dirty {
                    dev,
                    addr,
                    len,
                    freed_at: clock,
                    wait,
                    stream: match kind {
                        FreeKind::Async { stream, .. } | FreeKind::Ordered { stream } => {
                            Some(stream)
                        }
                        FreeKind::Sync => None,
                    },
                    ordered: matches!(kind, FreeKind::Ordered { .. }),
                });
            }
        }
        Op::Fence { dev } => {
            // The program's synchronization is over before the pool hears of it.
            let seq = pool.seq_before_sync(dev);
            driver.with(|s| s.fenced(dev));
            pool.observe_fence(dev, seq);
            return Ok(Some((dev, Released::Synchronized)));
        }
        Op::Barrier { dev } => {
            let seq = pool.seq_before_sync(dev);
            pool.observe_barrier(dev, seq);
            driver.with(|s| s.last_barrier[dev as usize] = clock);
        }
        Op::BarrierBegin { dev } => {
            if m.begun[dev as usize].is_none() {
                m.begun[dev as usize] = Some((pool.seq_before_sync(dev), clock));
            }
        }
        Op::BarrierEnd { dev } => {
            if let Some((seq, began)) = m.begun[dev as usize].take() {
                pool.observe_barrier(dev, seq);
                driver.with(|s| {
                    let b = &mut s.last_barrier[dev as usize];
                    *b = (*b).max(began);
                });
            }
        }
        Op::Release { dev } => {
            pool.sync_point(dev);
            return Ok(Some((dev, Released::Synchronized)));
        }
        Op::EmptyCache { dev } => {
            pool.empty_cache(dev);
            return Ok(Some((dev, Released::All)));
        }
        Op::SetThreshold { bytes } => {
            pool.set_threshold(bytes);
            for d in pool.used_devices() {
                if pool.threshold(d) != bytes {
                    return Err(format!("device {d}'s threshold is {}", pool.threshold(d)));
                }
            }
        }
        Op::SetDeviceThreshold { dev, bytes } => {
            pool.set_device_threshold(dev, bytes);
            if pool.threshold(dev) != bytes {
                return Err(format!("threshold is {}", pool.threshold(dev)));
            }
        }
        Op::Reset { dev } => {
            // The reset waited for the device's work and freed what `cudaMalloc` gave, not
            // mapped memory: the pool unmaps its granules, then forgets the device.
            driver.with(|s| {
                s.live.retain(|_, v| v.0 != dev);
                s.fenced(dev);
            });
            if !pool.release_mappings_after_reset(dev) {
                pool.forget_device(dev);
            }
            let kept = driver.model.mapped_on(dev);
            if kept > 0 {
                return Err(format!("{kept} bytes still mapped after the reset"));
            }
            driver.model.forget_device(dev);
            m.begun[dev as usize] = None;
            m.live.retain(|_, v| v.0 != dev);
            m.dirty.retain(|d| d.dev != dev);
        }
        Op::MemoryInfo { dev } => {
            if !pool.used_devices().contains(&dev) {
                return Ok(None);
            }
            // The driver's own figures, then the pool's: what it could give back counts as
            // free, so the program sees all it could get, and no more.
            let total = m.setup.capacity;
            let driver_free = total - driver.model.reserved_on(dev);
            let (free, _) = pool.memory_for_program(dev, driver_free, total);
            let room = total.min(pool.limit(dev));
            let could_get =
                room.saturating_sub(held_for_live(&driver.model.segments(), m)[dev as usize]);
            if free != could_get {
                return Err(format!(
                    "reports {free} bytes free; the program could get {could_get} ({room} less \
                     what its live blocks hold)"
                ));
            }
        }
        Op::NonBlockingStream => {
            pool.note_nonblocking_stream();
            m.nonblocking_seen = true;
        }
        Op::WildFree { how, pick } => {
            let addr = match how {
                Wild::Interior => match pick_live(m, pick) {
                    Some((a, _, len)) if len > 512 => {
                        a + 512 * (1 + (pick as u64 % (len / 512 - 1)))
                    }
                    _ => return Ok(None),
                },
                Wild::Double => match m.freed.len() {
                    0 => return Ok(None),
                    n => m.freed[pick % n],
                },
                Wild::Random => 0x7000_0000 + (pick as u64 % 4096) * 512,
            };
            if m.live.contains_key(&addr) {
                return Ok(None);
            }
            let kind = if pick % 2 == 0 {
                FreeKind::Sync
            } else {
                FreeKind::Async {
                    blocking: true,
                    stream: 0,
                }
            };
            let out = pool.free(addr, kind, Some((pick % DEVICES as usize) as u32));
            if out == FreeOutcome::Freed {
                return Err(format!("{how:?} free of {addr:#x} was accepted"));
            }
        }
        Op::Fail { call, code } => {
            driver.model.fail_next(call, code);
        }
    }
    Ok(None)
}

/// A block handed out at `[addr, addr+len)` on `dev` must not overlap a freed range whose wait
/// is not over; ranges it takes over are no longer dirty.
fn reuse_allowed(
    driver: &Driver,
    m: &mut Reference,
    dev: u32,
    addr: Addr,
    len: u64,
    clock: u64,
    on: Option<u64>,
) -> Result<(), String> {
    let stream_order = m.setup.reuse == ReuseMode::Relaxed;
    let (fence, barrier) =
        driver.with(|s| (s.last_fence[dev as usize], s.last_barrier[dev as usize]));
    let end = addr + len;
    let mut kept = Vec::new();
    for d in m.dirty.drain(..) {
        if d.dev != dev || d.addr + d.len <= addr || end <= d.addr {
            kept.push(d);
            continue;
        }
        let covered = match d.wait {
            _ if (stream_order || d.ordered) && on.is_some() && d.stream == on => true,
            Wait::Nothing => true,
            Wait::Barrier => fence.max(barrier) > d.freed_at,
            Wait::Fence => fence > d.freed_at,
        };
        if !covered {
            return Err(format!(
                "handed out {addr:#x}+{len} in step {}, overlapping {:#x}+{} freed in step {} \
                 and waiting for a {:?} (last fence {fence}, last barrier {barrier})",
                clock - 1,
                d.addr,
                d.len,
                d.freed_at - 1,
                d.wait
            ));
        }
        if d.addr < addr {
            kept.push(Dirty {
                len: addr - d.addr,
                ..d
            });
        }
        if d.addr + d.len > end {
            kept.push(Dirty {
                addr: end,
                len: d.addr + d.len - end,
                ..d
            });
        }
    }
    m.dirty = kept;
    Ok(())
}

/// Whether a live block of the model lies in `[addr, addr + bytes)` or reaches into it.
fn touched(m: &Reference, addr: Addr, bytes: u64) -> bool {
    // Live blocks do not overlap: only the last one starting before the end can reach in.
    m.live
        .range(..addr + bytes)
        .next_back()
        .is_some_and(|(&b, &(_, len, _))| b + len > addr)
}

/// Per device, the bytes the driver must hold for the model's live blocks: the classic
/// segments they lie in and the granules they touch. Everything else the pool can give back.
fn held_for_live(segments: &BTreeMap<Addr, Segment>, m: &Reference) -> [u64; DEVICES as usize] {
    let mut held = [0; DEVICES as usize];
    // Both in address order, and live blocks do not overlap: one walk over the two.
    let mut live = m.live.iter().peekable();
    for (&a, seg) in segments {
        while live.next_if(|(&b, &(_, len, _))| b + len <= a).is_some() {}
        if live.peek().is_some_and(|(&b, _)| b < a + seg.bytes) {
            held[seg.device as usize] += seg.bytes;
        }
    }
    held
}

/// What an expandable segment of `dev` must map to serve `len` bytes once every free granule
/// went back: the fewest bytes a block at the start or the end of some hole between live blocks
/// needs (the granules it touches that no live block touches; the whole hole if the rest would
/// be too small to split off), and the whole granules of a new placement.
fn least_to_map(driver: &Driver, m: &Reference, dev: u32, len: u64) -> Option<(u64, u64)> {
    let g = VMM_GRANULE;
    let fresh = len.checked_next_multiple_of(g)?;
    let ranges = driver.with(|s| s.ranges.clone());
    let mut least = fresh;
    for (&base, &(_, bytes)) in ranges.iter().filter(|(_, r)| r.0 == dev) {
        let end = base + bytes;
        let mut lives = m.live.range(base..end).map(|(&b, &(_, n, _))| (b, n));
        // The holes: from the range's start or a live block's end to the next live block.
        let mut from = base;
        loop {
            let next = lives.next();
            let to = next.map_or(end, |(b, _)| b);
            if to - from >= len {
                let rest = to - from - len;
                let take = if rest > LARGE_SPLIT_REMAINDER {
                    len
                } else {
                    to - from
                };
                // The granules the live blocks around the hole touch.
                let before = (from != base).then(|| (from - 1 - base) / g);
                let after = (to != end).then(|| (to - base) / g);
                for at in [from, to - take] {
                    let (first, last) = ((at - base) / g, (at + take - 1 - base) / g);
                    let shared = (first..=last)
                        .filter(|&k| before == Some(k) || after == Some(k))
                        .count() as u64;
                    least = least.min((last - first + 1 - shared) * g);
                }
            }
            match next {
                Some((b, n)) => from = b + n,
                None => break,
            }
        }
    }
    Some((least, fresh))
}

/// Whether `[addr, addr + len)` lies in segments of `dev` that follow one another without a
/// hole: one classic segment, or granules mapped side by side.
fn covered(segments: &BTreeMap<Addr, Segment>, dev: u32, addr: Addr, len: u64) -> bool {
    let Some((&first, _)) = segments.range(..=addr).next_back() else {
        return false;
    };
    let mut at = first;
    for (&s, seg) in segments.range(first..) {
        if s != at || seg.device != dev {
            return false;
        }
        at = s + seg.bytes;
        if at >= addr + len {
            return true;
        }
    }
    false
}

fn check(
    pool: &Pool<Driver>,
    m: &Reference,
    release: Option<(u32, Released)>,
) -> Result<(), String> {
    pool.check_settled()?;
    let driver = pool.backend();
    let segments = driver.model.segments();
    let delivered = driver.model.delivered();
    let mut violations = driver.model.misuses();
    violations.extend(driver.with(|s| s.violations.clone()));
    if let Some(v) = violations.first() {
        return fail(v.clone());
    }
    for (&addr, &(dev, len, _)) in &m.live {
        if !covered(&segments, dev, addr, len) {
            return fail(format!(
                "live {addr:#x}+{len} (device {dev}) is not in memory the driver gave its \
                 device"
            ));
        }
    }
    // Per device: the driver's bytes, and those of them mapped into reserved ranges.
    let mut held = [(0u64, 0u64); DEVICES as usize];
    for seg in segments.values() {
        held[seg.device as usize].0 += seg.bytes;
    }
    driver.with(|s| {
        for &(dev, bytes) in s.mappings.values() {
            held[dev as usize].1 += bytes;
        }
    });
    let live_held = held_for_live(&segments, m);
    let mut ranges = 0;
    for dev in pool.used_devices() {
        let snap = pool.device_stats(dev).ok_or("no statistics")?;
        let (reserved, mapped) = held[dev as usize];
        let allocated: u64 = m.live.values().filter(|v| v.0 == dev).map(|v| v.1).sum();
        let requested: u64 = m.live.values().filter(|v| v.0 == dev).map(|v| v.2).sum();
        let st = &snap.stats;
        if st.reserved.current != reserved
            || snap.figures.mapped != mapped
            || st.allocated.current != allocated
            || st.requested.current != requested
        {
            return fail(format!(
                "device {dev}: pool says reserved {} (mapped {}) allocated {} requested {}, \
                 model {reserved} (mapped {mapped}, classic {}) {allocated} {requested}",
                st.reserved.current,
                snap.figures.mapped,
                st.allocated.current,
                st.requested.current,
                reserved - mapped
            ));
        }
        ranges += snap.figures.ranges;
        // A percentage the driver could not resolve (an injected failure) leaves no limit.
        let limit = pool.limit(dev);
        let expected = m.setup.limit.resolve(m.setup.capacity);
        let unresolved = matches!(m.setup.limit, DeviceBytes::Fraction(_)) && limit == u64::MAX;
        if reserved > limit || (limit != expected && !unresolved) {
            return fail(format!(
                "device {dev}: reserved {reserved} with the limit {limit} (configured {expected})"
            ));
        }
        // What the pool could give back now is everything its live blocks do not hold (free
        // blocks thread caches keep count: they come back first); the rest of the cache is
        // stranded beside live blocks.
        let f = &snap.figures;
        let releasable = reserved - live_held[dev as usize];
        if f.releasable != releasable || f.releasable + f.stranded != snap.cached {
            return fail(format!(
                "device {dev}: figures say releasable {} stranded {} of cached {}; the live \
                 blocks leave {releasable} releasable",
                f.releasable, f.stranded, snap.cached
            ));
        }
        if snap.cached != reserved - allocated || snap.pending > snap.cached {
            return fail(format!(
                "device {dev}: cached {} pending {} with reserved {reserved} allocated {allocated}",
                snap.cached, snap.pending
            ));
        }
    }
    if ranges != driver.model.reservations() as u64 {
        return fail(format!(
            "the pools have {ranges} expandable segments, the driver {} reserved ranges",
            driver.model.reservations()
        ));
    }
    if let Some((dev, released)) = release {
        let refused = delivered.iter().any(|d| d.0 == Call::Free);
        let fence_failed = delivered.iter().any(|d| d.0 == Call::Fence);
        let Some(snap) = pool.device_stats(dev) else {
            return Ok(());
        };
        let mappings = driver.with(|s| s.mappings.clone());
        // Granules go only after a fence; at an allocation's threshold the pool takes none for
        // pending blocks (empty-cache and a program synchronization do), so the granules those
        // touch may stay.
        let granules_go = !fence_failed && (released != Released::Threshold || snap.pending == 0);
        let keep = if released == Released::All {
            0
        } else {
            snap.threshold
        };
        if !refused && snap.cached > keep {
            for (&s, seg) in segments.iter().filter(|(_, seg)| seg.device == dev) {
                let (slen, granule) = (seg.bytes, mappings.contains_key(&s));
                if touched(m, s, slen) || (granule && !granules_go) {
                    continue;
                }
                let what = if granule { "granule" } else { "segment" };
                return fail(format!(
                    "device {dev}: cached {} above {keep}, yet {what} {s:#x}+{slen} holds no \
                     live block (pending {})",
                    snap.cached, snap.pending
                ));
            }
        }
    }
    Ok(())
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
