//! Replaying a recorded trace through the pool algorithm, offline and without a GPU.
//!
//! With the settings the trace was recorded with, the replay takes the same decisions as the
//! live run (the backend hands back the recorded segment addresses and refusals in order), so it
//! reproduces the run's figures exactly. With other settings (threshold, split bound, fence
//! budget, reuse mode, a capacity), it answers "what would this job have reserved with X".

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::backend::{Addr, Backend, CudaError};
use super::device::{DevicePool, Need, Policy};
use super::stats::DeviceStats;
use super::trace::{Kind, Record};
use super::{need_for, reuse_from_code, FreeKind, Seqs, StreamKey, NO_STREAM};
use crate::config::ReuseMode;

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
    /// Replay every allocation and free as made on one stream (`gpupool_malloc_async` and
    /// `gpupool_free_async` on the legacy stream), as PyTorch's pluggable allocator makes them.
    pub one_stream: bool,
}

impl Overrides {
    fn any(&self) -> bool {
        self.threshold.is_some()
            || self.max_split_size.is_some()
            || self.fence_bytes.is_some()
            || self.reuse.is_some()
            || self.capacity.is_some()
            || self.limit.is_some()
            || self.one_stream
    }
}

/// What one device did in the replay.
#[derive(Clone, Debug)]
pub struct DeviceResult {
    pub device: u8,
    pub stats: DeviceStats,
    /// Requests the live run served and the replay could not (out of memory under a capacity
    /// or a limit).
    pub failed: u64,
    /// The pool's limit at the end of the replay (`u64::MAX`: none).
    pub limit: u64,
    /// Whether the replay took a decision the live run did not (only possible with overrides or
    /// a trace from threads racing on one device).
    pub diverged: bool,
}

/// The backend of a replay: recorded outcomes first (same settings), synthetic addresses and an
/// optional capacity otherwise.
struct ReplayBackend {
    state: Mutex<ReplayState>,
}

struct ReplayState {
    recorded: VecDeque<Result<(Addr, u64), (u64, i32)>>,
    use_recorded: bool,
    diverged: bool,
    next: Addr,
    capacity: u64,
    /// Live segments by address (ordered: a recorded segment's overlap check is one lookup).
    live: BTreeMap<Addr, u64>,
    used: u64,
}

/// Whether a recorded segment could be real: 512-byte aligned, non-null, ending below 2^63, and
/// overlapping no live segment.
fn plausible(live: &BTreeMap<Addr, u64>, addr: Addr, bytes: u64) -> bool {
    // Live segments never overlap one another: only the last one starting before the end can
    // reach into [addr, end).
    addr != 0
        && addr % 512 == 0
        && addr.checked_add(bytes).is_some_and(|end| {
            end < 1 << 63
                && live
                    .range(..end)
                    .next_back()
                    .map_or(true, |(&a, &n)| a.saturating_add(n) <= addr)
        })
}

impl Backend for ReplayBackend {
    fn alloc_segment(&self, _device: u32, bytes: u64) -> Result<Addr, CudaError> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.use_recorded {
            match s.recorded.pop_front() {
                // A corrupt trace can name any address and size: take only what a driver
                // could have returned (aligned, not wrapping around, not overlapping a live
                // segment), else diverge.
                Some(Ok((addr, size))) if size == bytes && plausible(&s.live, addr, bytes) => {
                    s.live.insert(addr, bytes);
                    s.used = s.used.saturating_add(bytes);
                    return Ok(addr);
                }
                Some(Err((size, code))) if size == bytes => return Err(CudaError(code)),
                _ => {
                    s.use_recorded = false;
                    s.diverged = true;
                }
            }
        }
        if s.used.saturating_add(bytes) > s.capacity {
            return Err(CudaError::MEMORY_ALLOCATION);
        }
        // Synthetic addresses above any real one, 2 MiB aligned, with a gap between segments.
        let addr = s.next;
        let Some(next) = bytes
            .div_ceil(2 << 20)
            .checked_mul(2 << 20)
            .and_then(|b| b.checked_add(2 << 20))
            .and_then(|b| b.checked_add(addr))
        else {
            return Err(CudaError::MEMORY_ALLOCATION);
        };
        s.next = next;
        s.live.insert(addr, bytes);
        s.used = s.used.saturating_add(bytes);
        Ok(addr)
    }

    fn free_segment(&self, _device: u32, addr: Addr) -> Result<(), CudaError> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let size = s.live.remove(&addr).ok_or(CudaError::INVALID_VALUE)?;
        s.used = s.used.saturating_sub(size);
        Ok(())
    }

    fn fence(&self, _device: u32) -> Result<(), CudaError> {
        Ok(())
    }

    fn barrier(&self, _device: u32) -> Result<(), CudaError> {
        Ok(())
    }

    fn memory_info(&self, _device: u32) -> Result<(u64, u64), CudaError> {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        Ok((s.capacity.saturating_sub(s.used), s.capacity))
    }
}

/// One device being replayed.
struct DeviceReplay {
    pool: DevicePool,
    backend: ReplayBackend,
    seqs: Seqs,
    policy: Policy,
    reuse: ReuseMode,
    recorded_reuse: ReuseMode,
    /// The trace said the program created a non-blocking stream (`barrier` mode fences after).
    nonblocking_seen: bool,
    /// Live-run address → replay address of each live block.
    addrs: HashMap<Addr, Addr>,
    failed: u64,
    diverged: bool,
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
        };
        let threshold = o
            .threshold
            .unwrap_or_else(|| settings.map_or(u64::MAX, |r| r.c));
        let recorded = records
            .iter()
            .filter_map(|r| match r.kind {
                Kind::SegmentAlloc => Some(Ok((r.a, r.b))),
                Kind::SegmentRefused => Some(Err((r.a, r.b as i32))),
                _ => None,
            })
            .collect();
        DeviceReplay {
            pool: {
                let mut p = DevicePool::new(device as u32, threshold);
                p.stream_reuse = o.reuse.unwrap_or(recorded_reuse) == ReuseMode::Relaxed;
                if let Some(limit) = o.limit {
                    p.set_limit(limit);
                }
                p
            },
            backend: ReplayBackend {
                state: Mutex::new(ReplayState {
                    recorded,
                    use_recorded: !o.any(),
                    diverged: false,
                    next: 1 << 56,
                    capacity: o.capacity.unwrap_or(u64::MAX),
                    live: BTreeMap::new(),
                    used: 0,
                }),
            },
            seqs: Seqs::default(),
            policy,
            reuse: o.reuse.unwrap_or(recorded_reuse),
            recorded_reuse,
            nonblocking_seen: false,
            addrs: HashMap::new(),
            failed: 0,
            diverged: false,
        }
    }

    fn apply(&mut self, r: &Record, o: &Overrides) {
        match r.kind {
            Kind::Alloc | Kind::AllocFailed => {
                let stream = stream_of(r.aux, o);
                match self
                    .pool
                    .alloc_on(r.a, stream, &self.backend, &self.seqs, &self.policy)
                {
                    Ok(addr) if r.kind == Kind::Alloc => {
                        self.addrs.insert(r.b, addr);
                    }
                    Ok(_) => {
                        // The live run failed here and the replay did not; the block stays live
                        // to the end (the program never freed what it did not get).
                        self.diverged = true;
                    }
                    Err(_) if r.kind == Kind::Alloc => self.failed += 1,
                    Err(_) => {}
                }
            }
            Kind::Free => {
                let Some(addr) = self.addrs.remove(&r.a) else {
                    return;
                };
                let how = if o.one_stream {
                    FreeKind::Async {
                        blocking: true,
                        stream: ONE_STREAM,
                    }
                } else {
                    FreeKind::from_code(r.aux & 3, stream_of(r.aux >> 2, o).unwrap_or(NO_STREAM))
                };
                let need = if self.reuse == self.recorded_reuse && !o.one_stream {
                    Need::from_code(r.b)
                } else {
                    need_for(self.reuse, how, self.nonblocking_seen)
                };
                let seqs = &self.seqs;
                self.pool.free(addr, how, need, || {
                    let seq = seqs.freed.load(Ordering::Relaxed);
                    seqs.freed.store(seq + 1, Ordering::Relaxed);
                    seq
                });
            }
            Kind::Observe => {
                self.seqs.fenced.fetch_max(r.a, Ordering::Relaxed);
                self.seqs.barriered.fetch_max(r.b, Ordering::Relaxed);
                self.pool.promote(&self.seqs);
            }
            Kind::SyncPoint => self.pool.sync_point(&self.backend, &self.seqs),
            Kind::EmptyCache => {
                self.pool.empty_cache(&self.backend, &self.seqs);
            }
            Kind::Threshold if o.threshold.is_none() => self.pool.set_threshold(r.a),
            Kind::Limit if o.limit.is_none() => self.pool.set_limit(r.a),
            Kind::NonBlockingStream => self.nonblocking_seen = true,
            Kind::Reset => {
                self.pool.forget_all();
                self.addrs.clear();
                let mut s = self.backend.state.lock().unwrap_or_else(|e| e.into_inner());
                s.live.clear();
                s.used = 0;
            }
            // Decisions the replay takes again itself.
            Kind::Settings
            | Kind::Threshold
            | Kind::Limit
            | Kind::SegmentAlloc
            | Kind::SegmentRefused
            | Kind::SegmentFree
            | Kind::Fence
            | Kind::Barrier => {}
        }
    }
}

/// The stream a record's number names (0: none), or `ONE_STREAM` for every record when
/// `Overrides::one_stream` says so.
fn stream_of(id: u16, o: &Overrides) -> Option<StreamKey> {
    if o.one_stream {
        Some(ONE_STREAM)
    } else {
        (id != 0).then_some(StreamKey::from(id))
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
            let diverged = d.diverged
                || d.backend
                    .state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .diverged;
            DeviceResult {
                device,
                stats: d.pool.stats.clone(),
                failed: d.failed,
                limit: d.pool.limit,
                diverged,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_segment_is_plausible_only_where_no_live_one_is() {
        let live: BTreeMap<Addr, u64> = [(0x10000, 0x1000), (0x20000, 0x8000)].into();
        let ok = |a, n| plausible(&live, a, n);
        // Between, touching either side.
        assert!(ok(0x11000, 0xf000));
        assert!(ok(0x28000, 0x100));
        assert!(ok(0x200, 0x10000 - 0x200));
        // Overlapping the start, the end, or inside one; covering one whole.
        assert!(!ok(0x1fe00, 0x400));
        assert!(!ok(0x27e00, 0x400));
        assert!(!ok(0x10200, 0x200));
        assert!(!ok(0x0fe00, 0x20000));
        // Null, unaligned, wrapping or beyond 2^63.
        assert!(!ok(0, 512));
        assert!(!ok(0x30100, 512));
        assert!(!ok(u64::MAX - 511, 1024));
        assert!(!ok(1 << 63, 512));
    }
}
