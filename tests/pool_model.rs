//! Model-based property tests of the pool core (`gpupool::pool`, no FFI): random sequences of
//! allocate / free / free-and-allocate-the-same-size / free-async / fence (a program synchronization) / barrier (a program action
//! on the legacy stream) / release point / empty-cache / set-threshold / device-reset / wild
//! frees / injected backend failures on three devices, run against a model driver, and checked
//! after every step against a simple reference model:
//!
//! - the pool's own structural check (`Pool::check`);
//! - no two live blocks overlap; every live block lies inside a segment the driver handed out to
//!   that device; every pointer is 512-byte aligned;
//! - reserved = the driver's segments of the device, allocated = the live blocks' rounded sizes,
//!   cached = reserved − allocated ≥ pending;
//! - a segment is never given back while a live block lies in it (checked inside the driver);
//! - after each release point (an allocation, a program synchronization, `sync_point`,
//!   `empty_cache` with threshold 0) and unless the driver refused a release in that step:
//!   cached ≤ threshold, or every segment still holding cached memory also holds a live block
//!   (the pool releases whole segments only: this is exactly what it guarantees);
//! - a block freed in `strict` mode (or on a non-blocking stream, or in `barrier` mode after a
//!   non-blocking stream was seen) is not handed out again before a fence (the pool's or the
//!   program's) that started after the free; one freed in `barrier` mode (or asynchronously on a
//!   blocking stream in `relaxed` mode) not before a barrier or fence; `relaxed` synchronous
//!   frees at once; one freed by the program's own `cudaFreeAsync` (`FreeKind::Ordered`) at once
//!   on the same stream, else after a fence;
//! - an allocation fails only with an error the driver gave for a segment allocation in that
//!   step, or with out-of-memory when the request (rounded) does not fit beside the segments
//!   that still hold live blocks; a failed fence, barrier or memory sample never fails it;
//! - a wild, interior or double free is refused and changes nothing.
//!
//! Half the sequences start with another thread allocating on every device, so that in
//! `relaxed` mode (without a threshold) the test thread's blocks go through its thread cache
//! (bounds of 1, 8 and 64 MiB); the test checks that caches served some allocations. A second
//! test runs the same checks with 3 000 MiB devices and requests of 500–1 400 MiB among the
//! others, without a threshold or a maximum split size: the segments with room to grow and
//! the release of idle segments a larger request outgrew; it checks that such releases
//! happened.
//!
//! Deterministic: the seed is fixed (`GPUPOOL_PROPTEST_SEED` overrides it, `PROPTEST_CASES` the
//! number of sequences); a failure prints the seed and the shortest sequence proptest shrank it
//! to.

use std::collections::BTreeMap;
use std::sync::Mutex;

use gpupool::config::{DeviceBytes, ReuseMode};
use gpupool::pool::model_driver::{Call, ModelDriver, GUARD_GAP};
use gpupool::pool::{Addr, Backend, CudaError, FreeKind, FreeOutcome, Policy, Pool, Settings};
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
/// last step in which a fence / barrier succeeded, and the reference model's live blocks
/// (base → (device, rounded bytes)), to catch a segment released with a live block in it.
#[derive(Default)]
struct Checks {
    clock: u64,
    last_fence: [u64; DEVICES as usize],
    last_barrier: [u64; DEVICES as usize],
    live: BTreeMap<Addr, (u32, u64)>,
    violations: Vec<String>,
}

/// The pool core's model driver (a capacity per device, never-reused addresses, injected
/// failures), with the checks above.
struct Driver {
    model: ModelDriver,
    checks: Mutex<Checks>,
}

impl Driver {
    fn new(capacity: u64) -> Self {
        Driver {
            model: ModelDriver::new()
                .with_capacity(capacity)
                .with_gap(GUARD_GAP),
            checks: Mutex::new(Checks::default()),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Checks) -> T) -> T {
        f(&mut self.checks.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Backend for Driver {
    fn alloc_segment(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        self.model.alloc_segment(device, bytes)
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
        self.with(|s| s.last_fence[device as usize] = s.clock);
        Ok(())
    }

    fn barrier(&self, device: u32) -> Result<(), CudaError> {
        self.model.barrier(device)?;
        self.with(|s| s.last_barrier[device as usize] = s.clock);
        Ok(())
    }

    fn memory_info(&self, device: u32) -> Result<(u64, u64), CudaError> {
        self.model.memory_info(device)
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
    )
        .prop_map(
            |(reuse, threshold, max_split_size, fence_bytes, (shared, thread_cache, limit))| {
                Setup {
                    reuse,
                    threshold,
                    limit,
                    max_split_size,
                    fence_bytes,
                    shared,
                    thread_cache,
                    capacity: CAPACITY,
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

fn size(big: bool) -> BoxedStrategy<u64> {
    let common = prop_oneof![
        6 => 1..=MIB,
        2 => prop_oneof![Just(512u64), Just(4096), Just(65536), Just(MIB)],
        3 => MIB + 1..=10 * MIB,
        2 => 10 * MIB + 1..=64 * MIB,
        1 => 100 * MIB..=200 * MIB,
        1 => prop_oneof![Just(u64::MAX), Just(u64::MAX - 511), Just(u64::MAX - 4096), Just(1 << 62)],
    ];
    if big {
        prop_oneof![6 => common, 1 => 500 * MIB..=1400 * MIB].boxed()
    } else {
        common.boxed()
    }
}

fn threshold_bytes() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0), Just(2 * MIB), Just(30 * MIB), Just(u64::MAX)]
}

fn op(big: bool) -> impl Strategy<Value = Op> {
    let dev = 0..DEVICES;
    prop_oneof![
        12 => (dev.clone(), size(big)).prop_map(|(dev, size)| Op::Alloc { dev, size }),
        8 => (any::<usize>(), dev.clone()).prop_map(|(pick, current)| Op::Free { pick, current }),
        4 => (dev.clone(), size(big), 0..STREAMS)
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
                Just(Call::MemoryInfo)
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
        Driver::new(setup.capacity),
        Settings {
            reuse: setup.reuse,
            threshold: setup.threshold,
            limit: setup.limit,
            policy: Policy {
                max_split_size: setup.max_split_size,
                fence_bytes: setup.fence_bytes,
                mapped_slack_permille: None,
            },
            trace: None,
            thread_cache: setup.thread_cache,
            // Caches from the second thread on, in every mode: the sequences have no contention.
            cache_contention: 0,
            expandable: false,
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
        driver.with(|s| s.clock = clock);
        driver.model.clear_delivered();
        let release_point =
            apply(&pool, &mut m, op, clock).map_err(|e| format!("step {step} {op:?}: {e}"))?;
        check(&pool, &m, release_point).map_err(|e| format!("after step {step} {op:?}: {e}"))?;
    }
    for dev in 0..DEVICES {
        if let Some(s) = pool.device_stats(dev) {
            SEEN.with(|c| {
                let (hits, outgrown) = c.get();
                c.set((
                    hits + s.stats.thread_cache_hits,
                    outgrown + s.stats.outgrown_releases,
                ))
            });
        }
    }
    Ok(())
}

thread_local! {
    /// Over the sequences a test ran (on its own thread): allocations thread caches served, and
    /// idle segments released because a larger request outgrew them; the tests check that the
    /// mechanisms they are after were used.
    static SEEN: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// Runs one step against the pool and the model; returns the device whose release threshold
/// must hold afterwards (`Some((dev, keep))`, `keep` overriding the threshold for empty-cache).
fn apply(
    pool: &Pool<Driver>,
    m: &mut Reference,
    op: &Op,
    clock: u64,
) -> Result<Option<(u32, Option<u64>)>, String> {
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
                        return Ok(Some((dev, None)));
                    };
                    let refused_release = delivered.iter().any(|d| d.0 == Call::Free);
                    let used = driver.model.reserved_on(dev);
                    let capacity = m
                        .setup
                        .limit
                        .resolve(m.setup.capacity)
                        .min(m.setup.capacity);
                    if !refused_release && used.checked_add(len).is_some_and(|t| t <= capacity) {
                        return Err(format!(
                            "out of memory for {len} bytes with {used} of {capacity} in segments"
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
            return Ok(Some((dev, None)));
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
            driver.with(|s| s.live.remove(&addr));
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
            let seq = pool.seq_before_sync(dev);
            pool.observe_fence(dev, seq);
            driver.with(|s| s.last_fence[dev as usize] = clock);
            return Ok(Some((dev, None)));
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
            return Ok(Some((dev, None)));
        }
        Op::EmptyCache { dev } => {
            pool.empty_cache(dev);
            return Ok(Some((dev, Some(0))));
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
            // The driver frees everything of the device; the pool forgets it.
            driver.model.forget_device(dev);
            driver.with(|s| {
                s.live.retain(|_, v| v.0 != dev);
                s.last_fence[dev as usize] = clock;
            });
            pool.forget_device(dev);
            m.begun[dev as usize] = None;
            m.live.retain(|_, v| v.0 != dev);
            m.dirty.retain(|d| d.dev != dev);
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

fn check(
    pool: &Pool<Driver>,
    m: &Reference,
    release: Option<(u32, Option<u64>)>,
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
        let inside = segments
            .range(..=addr)
            .next_back()
            .is_some_and(|(&s, seg)| seg.device == dev && addr + len <= s + seg.bytes);
        if !inside {
            return fail(format!(
                "live {addr:#x}+{len} (device {dev}) is in no segment of its device"
            ));
        }
    }
    for dev in pool.used_devices() {
        let snap = pool.device_stats(dev).ok_or("no statistics")?;
        let reserved: u64 = segments
            .values()
            .filter(|seg| seg.device == dev)
            .map(|seg| seg.bytes)
            .sum();
        let allocated: u64 = m.live.values().filter(|v| v.0 == dev).map(|v| v.1).sum();
        let requested: u64 = m.live.values().filter(|v| v.0 == dev).map(|v| v.2).sum();
        let st = &snap.stats;
        if st.reserved.current != reserved
            || st.allocated.current != allocated
            || st.requested.current != requested
        {
            return fail(format!(
                "device {dev}: pool says reserved {} allocated {} requested {}, model {reserved} \
                 {allocated} {requested}",
                st.reserved.current, st.allocated.current, st.requested.current
            ));
        }
        // A percentage the driver could not resolve (an injected failure) leaves no limit.
        let limit = pool.limit(dev);
        let expected = m.setup.limit.resolve(m.setup.capacity);
        let unresolved = matches!(m.setup.limit, DeviceBytes::Fraction(_)) && limit == u64::MAX;
        if reserved > limit || (limit != expected && !unresolved) {
            return fail(format!(
                "device {dev}: reserved {reserved} with the limit {limit} (configured {expected})"
            ));
        }
        if snap.cached != reserved - allocated || snap.pending > snap.cached {
            return fail(format!(
                "device {dev}: cached {} pending {} with reserved {reserved} allocated {allocated}",
                snap.cached, snap.pending
            ));
        }
    }
    if let Some((dev, keep)) = release {
        let refused = delivered.iter().any(|d| d.0 == Call::Free);
        let Some(snap) = pool.device_stats(dev) else {
            return Ok(());
        };
        let keep = keep.unwrap_or(snap.threshold);
        if !refused && snap.cached > keep {
            for (&s, seg) in segments.iter().filter(|(_, seg)| seg.device == dev) {
                let (sd, slen) = (seg.device, seg.bytes);
                if m.live.range(s..s + slen).next().is_none() {
                    return fail(format!(
                        "device {dev}: cached {} above {keep}, yet segment {s:#x}+{slen} (device \
                         {sd}) holds no live block",
                        snap.cached
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Runs `cases` sequences (`PROPTEST_CASES` overrides) of setups from `setups`, with requests
/// above 512 MiB if `big`.
fn check_sequences(setups: impl Strategy<Value = Setup>, big: bool, cases: u32) {
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
    let strategy = (setups, proptest::collection::vec(op(big), 1..120));
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
}

#[test]
fn random_sequences_keep_every_invariant() {
    check_sequences(setup(), false, 400);
    assert!(
        SEEN.with(|c| c.get().0) > 0,
        "no sequence went through a thread cache"
    );
}

#[test]
fn random_sequences_with_requests_above_512_mib_keep_every_invariant() {
    check_sequences(big_setup(), true, 400);
    let outgrown = SEEN.with(|c| c.get().1);
    assert!(
        outgrown > 0,
        "no sequence released a segment a larger request outgrew"
    );
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
