//! A request stream as the trace `GPUPOOL_TRACE` would have recorded had the program run under
//! the pool in `relaxed` mode (stream-ordered reuse, what PyTorch's allocator assumes): the
//! pool's own decisions (segments, releases) included, so `gpupool-trace stats`, `replay`,
//! `plot` and `compare` read a generated workload as they read a recorded one, and a replay with
//! the recorded settings reproduces it exactly. Time is synthetic — one microsecond per
//! operation — so the same seed gives the same bytes.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::{Op, Workload};
use gpupool::pool::backend::Addr;
use gpupool::pool::device::{DevicePool, Policy};
use gpupool::pool::model_driver::ModelDriver;
use gpupool::pool::trace::{TraceBuf, TraceSink, MAGIC, RECORD_SIZE};
use gpupool::pool::{FreeKind, ReuseClock, ReuseWait};

/// Nanoseconds of synthetic time per operation.
pub const NS_PER_OP: u64 = 1000;

#[derive(Default)]
struct Sink(Mutex<Vec<u8>>);

impl TraceSink for Sink {
    fn write(&self, bytes: &[u8]) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
    }
}

/// The driver generated traces are recorded against: the model driver with no capacity and each
/// segment right after the last, so the same seed gives the same segment addresses.
pub type Bump = ModelDriver;

/// The trace file's bytes for `w` on device 0, with the pool's default settings.
pub fn to_trace(w: &Workload) -> Vec<u8> {
    let sink = Arc::new(Sink::default());
    let policy = Policy {
        max_split_size: u64::MAX,
        fence_bytes: 256 << 20,
        mapped_slack_permille: None,
    };
    let backend = Bump::new();
    let clock = ReuseClock::default();
    let mut pool = DevicePool::new(0, u64::MAX);
    let dyn_sink: Arc<dyn TraceSink> = sink.clone();
    pool.set_trace(TraceBuf::new(dyn_sink, Instant::now(), 0), &policy, 2);
    let mut addrs: Vec<Option<Addr>> = vec![None; w.slots as usize];
    let mut out = MAGIC.to_vec();
    let mut stamp = |pool: &mut DevicePool, t: u64| {
        pool.flush_trace();
        let mut buf = sink.0.lock().unwrap_or_else(|e| e.into_inner());
        for rec in buf.chunks_exact_mut(RECORD_SIZE) {
            rec[..8].copy_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&buf);
        buf.clear();
    };
    let free = |pool: &mut DevicePool, addr, need| {
        pool.free(addr, FreeKind::Sync, need, || {
            let s = clock.freed.load(Ordering::Relaxed);
            clock.freed.store(s + 1, Ordering::Relaxed);
            s
        });
    };
    stamp(&mut pool, 0);
    for (i, op) in w.ops.iter().enumerate() {
        match *op {
            Op::Alloc { slot, size } => {
                addrs[slot as usize] = pool.alloc(size, &backend, &clock, &policy).ok();
            }
            Op::Free { slot, need, .. } => {
                if let Some(addr) = addrs[slot as usize].take() {
                    free(&mut pool, addr, need);
                }
            }
            Op::RecordedOom { size } => {
                // The uncapped pool serves it, and the program lets it go at once.
                if let Ok(addr) = pool.alloc(size, &backend, &clock, &policy) {
                    free(&mut pool, addr, ReuseWait::Nothing);
                }
            }
            Op::Observe { fenced, barriered } => {
                clock.fenced.fetch_max(fenced, Ordering::Relaxed);
                clock.barriered.fetch_max(barriered, Ordering::Relaxed);
                pool.promote(&clock);
            }
            Op::SyncPoint => pool.sync_point(&backend, &clock),
        }
        stamp(&mut pool, (i as u64 + 1) * NS_PER_OP);
    }
    out
}
