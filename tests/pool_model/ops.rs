//! The steps of a sequence and the setups it runs under, as proptest strategies.

use super::*;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Wild {
    /// Inside a live block, not its start.
    Interior,
    /// A block already freed (and not handed out again).
    Double,
    /// An address no one handed out.
    Random,
}

#[derive(Clone, Debug)]
pub(crate) enum Op {
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
pub(crate) struct Setup {
    pub(crate) reuse: ReuseMode,
    pub(crate) threshold: DeviceBytes,
    /// The pool's limit (`GPUPOOL_LIMIT`): reserved never exceeds it, and out-of-memory is
    /// allowed only when the request does not fit within it either.
    pub(crate) limit: DeviceBytes,
    pub(crate) max_split_size: u64,
    pub(crate) fence_bytes: u64,
    /// Another thread allocated on every device first, so in `relaxed` mode (without a
    /// threshold) this thread's small blocks go through its own cache, of this bound.
    pub(crate) shared: bool,
    pub(crate) thread_cache: u64,
    pub(crate) capacity: u64,
    /// Large blocks come from expandable segments (the driver then offers virtual memory),
    /// with the mapped slack (`mapped_slack_permille`) if set.
    pub(crate) expandable: bool,
    pub(crate) slack: Option<u32>,
}

pub(crate) fn setup() -> impl Strategy<Value = Setup> {
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
pub(crate) fn big_setup() -> impl Strategy<Value = Setup> {
    setup().prop_map(|s| Setup {
        threshold: DeviceBytes::Unbounded,
        max_split_size: u64::MAX,
        capacity: BIG_CAPACITY,
        ..s
    })
}

/// Devices large enough that few requests fail, with expandable segments and the mapped slack
/// always on and no threshold: holes stay mapped until a request no hole holds moves them.
pub(crate) fn slack_setup() -> impl Strategy<Value = Setup> {
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
pub(crate) enum Sizes {
    /// From 1 byte to 200 MiB, and sizes that cannot be served.
    Common,
    /// `Common`, and 500–1400 MiB.
    Big,
    /// Mostly 1–400 MiB: holes of many sizes in the mapped range.
    Slack,
}

/// Sizes at the edges that matter to expandable segments: around whole granules (a block
/// that ends one byte into a granule maps it) and a split remainder of 1 MiB.
pub(crate) fn granule_edge() -> impl Strategy<Value = u64> {
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

pub(crate) fn size(sizes: Sizes) -> BoxedStrategy<u64> {
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

pub(crate) fn threshold_bytes() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0), Just(2 * MIB), Just(30 * MIB), Just(u64::MAX)]
}

pub(crate) fn op(sizes: Sizes) -> impl Strategy<Value = Op> {
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
