//! Replaying a recorded trace through the pool algorithm, offline and without a GPU.
//!
//! With the settings the trace was recorded with, the replay takes the same decisions as the
//! live run (the backend hands back the recorded segment addresses and refusals in order), so it
//! reproduces the run's figures exactly. With other settings (threshold, split bound, fence
//! budget, reuse mode, a capacity, expandable segments on or off), it answers "what would this
//! job have reserved with X".
//!
//! Expandable segments replay on the model driver's virtual memory (`ModelDriver::with_vmm`),
//! with the granule and range size the trace recorded; with the recorded settings the driver's
//! refusals of ranges and mappings are played back too, as segment refusals are.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::backend::{Addr, Backend, CudaError};
use super::device::{DevicePool, Policy, ReuseWait};
use super::model_driver::{ModelDriver, RecordedSegment, GUARD_GAP};
use super::model_wrapper::ModelWrapper;
use super::stats::DeviceStats;
use super::trace::{Kind, Record, SEGMENT_BEYOND_MEMORY};
use super::{need_for, reuse_from_code, FreeKind, ReuseClock, StreamKey, NO_STREAM};
use crate::config::ReuseMode;

/// Where the driver's own addresses start once a replay diverged: above any real one.
const SYNTHETIC_BASE: Addr = 1 << 56;

/// The stream `Overrides::one_stream` replays on (trace stream numbers start at 1, and this one
/// is above them).
const ONE_STREAM: StreamKey = 1 << 16;

/// Settings to replay with; `None` keeps what the trace recorded.
#[derive(Clone, Copy, Debug, Default)]
pub struct Overrides {
    pub threshold: Option<u64>,
    pub max_split_size: Option<u64>,
    pub fence_bytes: Option<u64>,
    pub reuse: Option<ReuseMode>,
    /// Device capacity for the pool's segments (the driver refuses beyond it).
    pub capacity: Option<u64>,
    /// The pool's limit (`GPUPOOL_LIMIT`): the most bytes it reserves on each device.
    pub limit: Option<u64>,
    /// Replay every allocation and free as one of PyTorch's routes into the pool makes them.
    pub route: Route,
    /// Expandable segments on or off (`GPUPOOL_EXPANDABLE`), whatever the trace was recorded
    /// with.
    pub expandable: Option<bool>,
    /// The mapped slack in thousandths (`GPUPOOL_EXPANDABLE_SLACK`); `Some(None)` turns it off.
    pub mapped_slack_permille: Option<Option<u32>>,
}

/// How a replay makes the program's calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Route {
    /// As the trace recorded them.
    #[default]
    Recorded,
    /// On one stream, with the pool's promise (`gpupool_malloc_async`/`gpupool_free_async` on
    /// the legacy stream), as PyTorch's pluggable allocator makes them.
    OneStream,
    /// `cudaMalloc`/`cudaFree` and no stream, as PyTorch makes them with
    /// `PYTORCH_NO_CUDA_MEMORY_CACHING=1`.
    Uncached,
    /// The runtime's `cudaMallocAsync`/`cudaFreeAsync` on one stream, as PyTorch's
    /// `cudaMallocAsync` backend makes them under the preload (`FreeKind::Ordered`).
    RuntimeAsync,
}

impl Overrides {
    fn any(&self) -> bool {
        self.threshold.is_some()
            || self.max_split_size.is_some()
            || self.fence_bytes.is_some()
            || self.reuse.is_some()
            || self.capacity.is_some()
            || self.limit.is_some()
            || self.mapped_slack_permille.is_some()
            || self.route != Route::Recorded
    }
}

/// What one device did in the replay.
#[derive(Clone, Debug)]
pub struct DeviceResult {
    pub device: u8,
    pub stats: DeviceStats,
    /// Whether large blocks came from expandable segments, and the granules mapped (the maps
    /// the driver made, as the live pool's summary counts them) and unmapped.
    pub expandable: bool,
    pub maps: u64,
    pub unmaps: u64,
    /// Requests the live run served and the replay could not (out of memory under a capacity
    /// or a limit).
    pub failed: u64,
    /// Requests the live run failed and the replay failed again: with `failed`, every request
    /// the replay could not serve, as the live summary counts those it returned an error for.
    pub failed_as_recorded: u64,
    /// The pool's limit at the end of the replay (`u64::MAX`: none).
    pub limit: u64,
    /// Whether the replay took a decision the live run did not (only possible with overrides or
    /// a trace from threads racing on one device).
    pub diverged: bool,
}

/// The outcome of one range reservation or granule mapping a trace recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RecordedMapping {
    Reserved,
    ReserveRefused { code: i32 },
    Mapped { bytes: u64 },
    MapRefused { bytes: u64, code: i32 },
}

/// The model driver, answering the pool's virtual memory calls with the outcomes the trace
/// recorded, in order, while each matches the call (a reservation for a reservation, a map of
/// the same size); from the first that does not, with the model's own answers.
struct ReplayDriver {
    model: ModelDriver,
    playback: Mutex<Playback>,
}

struct Playback {
    /// `None` once the outcomes stopped matching, or when there were none.
    recorded: Option<VecDeque<RecordedMapping>>,
    diverged: bool,
    /// Maps the model made (neither those the recording refused nor those the model did).
    maps: u64,
}

impl ReplayDriver {
    fn new(model: ModelDriver, recorded: Option<VecDeque<RecordedMapping>>) -> ReplayDriver {
        ReplayDriver {
            model,
            playback: Mutex::new(Playback {
                recorded,
                diverged: false,
                maps: 0,
            }),
        }
    }

    fn playback(&self) -> std::sync::MutexGuard<'_, Playback> {
        // Every change is made whole under the lock.
        self.playback.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The recorded outcome of the next call, if it is `expected`'s kind and size. `None`:
    /// the model answers.
    fn play_back(&self, expected: RecordedMapping) -> Option<RecordedMapping> {
        let mut p = self.playback();
        let queue = p.recorded.as_mut()?;
        let same = |r: &RecordedMapping| match (r, expected) {
            (
                RecordedMapping::Reserved | RecordedMapping::ReserveRefused { .. },
                RecordedMapping::Reserved,
            ) => true,
            (
                RecordedMapping::Mapped { bytes } | RecordedMapping::MapRefused { bytes, .. },
                RecordedMapping::Mapped { bytes: b },
            ) => *bytes == b,
            _ => false,
        };
        match queue.pop_front() {
            Some(r) if same(&r) => Some(r),
            _ => {
                p.recorded = None;
                p.diverged = true;
                None
            }
        }
    }

    /// Whether the outcomes stopped matching the calls, or the replay left some unasked.
    fn diverged(&self) -> bool {
        let p = self.playback();
        self.model.diverged() || p.diverged || p.recorded.as_ref().is_some_and(|q| !q.is_empty())
    }

    /// Granules mapped and unmapped: the maps the driver made (not those it refused, as the
    /// live pool counts them) and the unmaps.
    fn maps_and_unmaps(&self) -> (u64, u64) {
        (self.playback().maps, self.model.counts().unmaps)
    }
}

impl AsRef<ModelDriver> for ReplayDriver {
    fn as_ref(&self) -> &ModelDriver {
        &self.model
    }
}

impl ModelWrapper for ReplayDriver {
    fn vmm_reserve(&self, device: u32, bytes: u64) -> Result<Addr, CudaError> {
        match self.play_back(RecordedMapping::Reserved) {
            Some(RecordedMapping::ReserveRefused { code }) => Err(CudaError(code)),
            _ => self.model.vmm_reserve(device, bytes),
        }
    }
    fn vmm_map(&self, device: u32, addr: Addr, bytes: u64) -> Result<(), CudaError> {
        match self.play_back(RecordedMapping::Mapped { bytes }) {
            Some(RecordedMapping::MapRefused { code, .. }) => Err(CudaError(code)),
            _ => {
                let r = self.model.vmm_map(device, addr, bytes);
                if r.is_ok() {
                    self.playback().maps += 1;
                }
                r
            }
        }
    }
}

/// One device being replayed.
struct DeviceReplay {
    pool: DevicePool,
    /// With the recorded settings, it hands back the recorded segment addresses and refusals,
    /// and the recorded outcomes of reservations and mappings, in order.
    backend: ReplayDriver,
    clock: ReuseClock,
    policy: Policy,
    reuse: ReuseMode,
    recorded_reuse: ReuseMode,
    /// The trace said the program made work no barrier orders (`barrier` mode fences after).
    beyond_barriers: bool,
    /// Live-run address → replay address of each live block.
    addrs: HashMap<Addr, Addr>,
    failed: u64,
    failed_as_recorded: u64,
    diverged: bool,
    /// The replay runs with the recorded settings: a request the live run served and the
    /// replay could not is a decision the live run did not take.
    as_recorded: bool,
    /// Segments the live pool refused itself, without a `cudaMalloc`
    /// (`SEGMENT_BEYOND_MEMORY`), that the replay asks the driver for and is refused as
    /// recorded: no driver call of the live run's.
    refused_unasked: u64,
}

impl DeviceReplay {
    fn new(device: u8, records: &[&Record], o: &Overrides) -> DeviceReplay {
        let settings = records.iter().find(|r| r.kind == Kind::Settings);
        let recorded_reuse = settings.map_or(ReuseMode::Strict, |r| reuse_from_code(r.aux));
        let policy = Policy {
            max_split_size: o
                .max_split_size
                .unwrap_or_else(|| settings.map_or(u64::MAX, |r| r.a)),
            fence_bytes: o
                .fence_bytes
                .unwrap_or_else(|| settings.map_or(64 << 20, |r| r.b)),
            mapped_slack_permille: o.mapped_slack_permille.unwrap_or_else(|| {
                records
                    .iter()
                    .find(|r| r.kind == Kind::MappedSlack)
                    .map(|r| r.a as u32)
            }),
        };
        let threshold = o
            .threshold
            .unwrap_or_else(|| settings.map_or(u64::MAX, |r| r.c));
        // The granule and range size the live run used, if it had expandable segments.
        let recorded_vmm = records
            .iter()
            .find(|r| r.kind == Kind::Expandable)
            .map(|r| (r.a, r.b));
        let expandable = o.expandable.unwrap_or(recorded_vmm.is_some());
        let as_recorded = !o.any() && expandable == recorded_vmm.is_some();
        let mut backend = ModelDriver::new()
            .starting_at(SYNTHETIC_BASE)
            .with_gap(GUARD_GAP)
            .with_capacity(o.capacity.unwrap_or(u64::MAX));
        if expandable {
            backend = backend.with_vmm();
        }
        if as_recorded {
            backend = backend.replaying(records.iter().filter_map(|r| match r.kind {
                Kind::SegmentAlloc => Some(RecordedSegment::Given {
                    addr: r.a,
                    bytes: r.b,
                }),
                Kind::SegmentRefused => Some(RecordedSegment::Refused {
                    bytes: r.a,
                    code: r.b as i32,
                }),
                _ => None,
            }));
        }
        let mappings = as_recorded.then(|| {
            records
                .iter()
                .filter_map(|r| match r.kind {
                    Kind::RangeReserved => Some(RecordedMapping::Reserved),
                    Kind::RangeRefused => {
                        Some(RecordedMapping::ReserveRefused { code: r.b as i32 })
                    }
                    Kind::Map => Some(RecordedMapping::Mapped { bytes: r.b }),
                    Kind::MapRefused => Some(RecordedMapping::MapRefused {
                        bytes: r.b,
                        code: r.c as i32,
                    }),
                    _ => None,
                })
                .collect()
        });
        let backend = ReplayDriver::new(backend, mappings);
        DeviceReplay {
            pool: {
                let mut p = DevicePool::new(device as u32, threshold);
                p.stream_reuse = o.reuse.unwrap_or(recorded_reuse) == ReuseMode::Relaxed;
                if let Some(limit) = o.limit {
                    p.set_limit(limit);
                }
                match recorded_vmm {
                    Some((granule, range)) if expandable => p.set_expandable(granule, range),
                    // A device of the capacity replayed, or of unknown size.
                    None if expandable => p.enable_expandable(&backend),
                    _ => {}
                }
                p
            },
            backend,
            clock: ReuseClock::default(),
            policy,
            reuse: o.reuse.unwrap_or(recorded_reuse),
            recorded_reuse,
            beyond_barriers: false,
            addrs: HashMap::new(),
            failed: 0,
            failed_as_recorded: 0,
            diverged: false,
            as_recorded,
            refused_unasked: if as_recorded {
                records
                    .iter()
                    .filter(|r| r.kind == Kind::SegmentRefused && r.aux == SEGMENT_BEYOND_MEMORY)
                    .count() as u64
            } else {
                0
            },
        }
    }

    fn apply(&mut self, r: &Record, o: &Overrides) {
        match r.kind {
            Kind::Alloc | Kind::AllocFailed => {
                let stream = stream_of(r.aux, o);
                match self
                    .pool
                    .alloc_on(r.a, stream, &self.backend, &self.clock, &self.policy)
                {
                    Ok(addr) if r.kind == Kind::Alloc => {
                        self.addrs.insert(r.b, addr);
                    }
                    Ok(_) => {
                        // The live run failed here and the replay did not; the block stays live
                        // to the end (the program never freed what it did not get).
                        self.diverged = true;
                    }
                    Err(_) if r.kind == Kind::Alloc => {
                        self.failed += 1;
                        self.diverged |= self.as_recorded;
                    }
                    Err(_) => self.failed_as_recorded += 1,
                }
            }
            Kind::Free => {
                let Some(addr) = self.addrs.remove(&r.a) else {
                    return;
                };
                let how = match o.route {
                    Route::Recorded => FreeKind::from_code(
                        r.aux & 3,
                        stream_of(r.aux >> 2, o).unwrap_or(NO_STREAM),
                    ),
                    Route::Uncached => FreeKind::Sync,
                    Route::RuntimeAsync if self.reuse != ReuseMode::Relaxed => {
                        FreeKind::Ordered { stream: ONE_STREAM }
                    }
                    Route::OneStream | Route::RuntimeAsync => FreeKind::Async {
                        blocking: true,
                        stream: ONE_STREAM,
                    },
                };
                let need = if self.reuse == self.recorded_reuse && o.route == Route::Recorded {
                    ReuseWait::from_code(r.b)
                } else {
                    need_for(self.reuse, how, self.beyond_barriers)
                };
                let clock = &self.clock;
                self.pool.free(addr, how, need, || {
                    let seq = clock.freed.load(Ordering::Relaxed);
                    clock.freed.store(seq + 1, Ordering::Relaxed);
                    seq
                });
            }
            Kind::Observe => {
                self.clock.fenced.fetch_max(r.a, Ordering::Relaxed);
                self.clock.barriered.fetch_max(r.b, Ordering::Relaxed);
                self.pool.promote(&self.clock);
            }
            Kind::SyncPoint => self.pool.sync_point(&self.backend, &self.clock),
            Kind::EmptyCache if r.b != 0 => {
                self.pool.release_for_others(&self.backend, &self.clock);
            }
            Kind::EmptyCache => {
                self.pool.trim_to(&self.backend, &self.clock, r.a);
            }
            Kind::Threshold if o.threshold.is_none() => self.pool.set_threshold(r.a, r.b != 0),
            Kind::Limit if o.limit.is_none() => self.pool.set_limit(r.a),
            Kind::BeyondBarriers => {
                // As the live pool (`Pool::note_work_beyond_barriers`; a trace has no caches).
                let unfenced = self.clock.fenced.load(Ordering::Relaxed)
                    < self.clock.freed.load(Ordering::Relaxed);
                if !self.beyond_barriers && self.reuse != ReuseMode::Strict && unfenced {
                    self.pool
                        .fence_for_work_beyond_barriers(&self.backend, &self.clock);
                }
                self.beyond_barriers = true;
            }
            Kind::Reset => {
                // As the live pool after a reset: every granule given back, then all forgotten.
                self.pool.unmap_all_after_reset(&self.backend);
                self.pool.forget_all();
                self.addrs.clear();
                self.backend.model.forget_device(u32::from(r.device));
            }
            // Decisions the replay takes again itself.
            Kind::Settings
            | Kind::Threshold
            | Kind::Limit
            | Kind::SegmentAlloc
            | Kind::SegmentRefused
            | Kind::SegmentFree
            | Kind::Fence
            | Kind::Barrier
            | Kind::Expandable
            | Kind::RangeReserved
            | Kind::RangeRefused
            | Kind::Map
            | Kind::MapRefused
            | Kind::Unmap
            | Kind::MappedSlack => {}
        }
    }
}

/// The stream a record's number names (0: none), or what `Overrides::route` makes of every
/// record's.
fn stream_of(id: u16, o: &Overrides) -> Option<StreamKey> {
    match o.route {
        Route::Recorded => (id != 0).then_some(StreamKey::from(id)),
        Route::OneStream | Route::RuntimeAsync => Some(ONE_STREAM),
        Route::Uncached => None,
    }
}

/// Replay `records` with `overrides`; one result per device, in device order.
pub fn replay(records: &[Record], overrides: &Overrides) -> Vec<DeviceResult> {
    let mut by_device: BTreeMap<u8, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_device.entry(r.device).or_default().push(r);
    }
    by_device
        .into_iter()
        .map(|(device, recs)| {
            let mut d = DeviceReplay::new(device, &recs, overrides);
            for r in &recs {
                d.apply(r, overrides);
            }
            let diverged = d.diverged || d.backend.diverged();
            let (maps, unmaps) = d.backend.maps_and_unmaps();
            let mut stats = d.pool.stats.clone();
            if !diverged {
                stats.real_mallocs = stats.real_mallocs.saturating_sub(d.refused_unasked);
            }
            DeviceResult {
                device,
                stats,
                expandable: d.pool.expandable(),
                maps,
                unmaps,
                failed: d.failed,
                failed_as_recorded: d.failed_as_recorded,
                limit: d.pool.limit,
                diverged,
            }
        })
        .collect()
}
