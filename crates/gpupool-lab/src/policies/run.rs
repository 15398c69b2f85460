//! Driving a policy through a workload: timed, checked, or sampled for a plot.

use std::collections::BTreeMap;
use std::time::Instant;

use super::{CachePolicy, Counters};
use crate::workloads::{Op, Workload};
use gpupool::pool::{Addr, ReuseWait};

/// What a policy did with the requests that failed out of memory in the recorded run
/// (`Op::RecordedOom`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordedOoms {
    pub served: u64,
    pub failed: u64,
}

impl RecordedOoms {
    /// Serve a request the recorded run failed, and free it at once: the program never held
    /// it. `check` sees the block while it is live.
    fn replay(
        &mut self,
        p: &mut dyn CachePolicy,
        size: u64,
        check: impl FnOnce(&dyn CachePolicy, Addr) -> Result<(), String>,
    ) -> Result<(), String> {
        let Some(a) = p.alloc(size) else {
            self.failed += 1;
            return Ok(());
        };
        self.served += 1;
        check(p, a)?;
        // No work on the device ever touched it: its reuse waits for nothing.
        if !p.free(a, ReuseWait::Nothing) {
            return Err(format!("free of {a:#x}, not a live block"));
        }
        Ok(())
    }
}

/// What a policy did with a workload.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub policy: String,
    pub counters: Counters,
    /// Allocation requests, those the recorded run failed included.
    pub requests: u64,
    /// Requests the recorded run served (all of a generated workload's) that the policy could
    /// not serve.
    pub ooms: u64,
    /// What the policy did with the requests the recorded run failed.
    pub recorded_ooms: RecordedOoms,
    /// Operations replayed, and the time they took.
    pub events: u64,
    pub seconds: f64,
}

impl Outcome {
    /// Real allocation calls per 1 000 requests.
    pub fn mallocs_per_1000(&self) -> f64 {
        self.counters.mallocs as f64 * 1000.0 / self.requests.max(1) as f64
    }
    pub fn events_per_second(&self) -> f64 {
        self.events as f64 / self.seconds.max(1e-9)
    }
}

const FAILED: Addr = Addr::MAX;

/// Replay `w` through `p`, timed: nothing is checked or sampled on the way.
pub fn run(p: &mut dyn CachePolicy, w: &Workload) -> Outcome {
    let mut addrs = vec![FAILED; w.slots as usize];
    let mut ooms = 0;
    let mut recorded_ooms = RecordedOoms::default();
    let t = Instant::now();
    for op in &w.ops {
        match *op {
            Op::Alloc { slot, size } => match p.alloc(size) {
                Some(a) => addrs[slot as usize] = a,
                None => {
                    addrs[slot as usize] = FAILED;
                    ooms += 1;
                }
            },
            Op::Free { slot, need, .. } => {
                let a = addrs[slot as usize];
                if a != FAILED {
                    p.free(a, need);
                }
            }
            Op::RecordedOom { size } => {
                // Unchecked, as every other free here.
                let _ = recorded_ooms.replay(p, size, |_, _| Ok(()));
            }
            _ => p.sync(op),
        }
    }
    let seconds = t.elapsed().as_secs_f64();
    Outcome {
        policy: p.name(),
        counters: p.driver().counters(),
        requests: w.requests(),
        ooms,
        recorded_ooms,
        events: w.ops.len() as u64,
        seconds,
    }
}

/// The accounting identity and the policy's own invariants.
fn consistent(p: &dyn CachePolicy, live_bytes: u64) -> Result<(), String> {
    let reserved = p.driver().counters().reserved;
    if p.allocated() + p.cached() != reserved {
        return Err(format!(
            "allocated {} + cached {} != reserved {reserved}",
            p.allocated(),
            p.cached()
        ));
    }
    if p.allocated() < live_bytes {
        return Err(format!(
            "allocated {} < live requested bytes {live_bytes}",
            p.allocated()
        ));
    }
    p.check()
}

/// Where the block at `a` of `size` bytes ends, if it is 512-byte aligned, inside one of the
/// policy's segments and clear of every `live` block.
fn placed(
    p: &dyn CachePolicy,
    live: &BTreeMap<Addr, Addr>,
    a: Addr,
    size: u64,
) -> Result<Addr, String> {
    let end = a + size.max(1);
    if a % 512 != 0 {
        return Err(format!("address {a:#x} not 512-byte aligned"));
    }
    if !p.driver().covers(a, end) {
        return Err(format!("block {a:#x}+{size} outside every segment"));
    }
    let before = live.range(..end).next_back();
    if let Some((&b, &e)) = before.filter(|(_, &e)| e > a) {
        return Err(format!("block {a:#x}..{end:#x} overlaps {b:#x}..{e:#x}"));
    }
    Ok(end)
}

/// Replay `w` through `p`, checking after every operation that the new block is aligned, lies
/// inside one of the policy's segments and overlaps no live block, that every free is of a live
/// block, that allocated + cached = reserved (and the policy's own invariants, every 1 000
/// operations and at the end), and that nothing is allocated at the end.
pub fn run_checked(p: &mut dyn CachePolicy, w: &Workload) -> Result<Outcome, String> {
    let mut addrs = vec![FAILED; w.slots as usize];
    let mut sizes = vec![0u64; w.slots as usize];
    let mut live: BTreeMap<Addr, u64> = BTreeMap::new();
    let (mut live_bytes, mut ooms) = (0u64, 0u64);
    let mut recorded_ooms = RecordedOoms::default();
    let name = p.name();
    for (i, op) in w.ops.iter().enumerate() {
        let at = |e: String| format!("{name}, operation {i} ({op:?}): {e}");
        match *op {
            Op::Alloc { slot, size } => {
                let Some(a) = p.alloc(size) else {
                    addrs[slot as usize] = FAILED;
                    ooms += 1;
                    continue;
                };
                let end = placed(p, &live, a, size).map_err(at)?;
                live.insert(a, end);
                addrs[slot as usize] = a;
                sizes[slot as usize] = size;
                live_bytes = live_bytes.saturating_add(size);
            }
            Op::RecordedOom { size } => recorded_ooms
                .replay(p, size, |p, a| placed(p, &live, a, size).map(|_| ()))
                .map_err(at)?,
            Op::Free { slot, need, .. } => {
                let a = std::mem::replace(&mut addrs[slot as usize], FAILED);
                if a == FAILED {
                    continue;
                }
                if live.remove(&a).is_none() || !p.free(a, need) {
                    return Err(at(format!("free of {a:#x}, not a live block")));
                }
                live_bytes = live_bytes.saturating_sub(sizes[slot as usize]);
            }
            _ => p.sync(op),
        }
        let full = i % 1000 == 999;
        let reserved = p.driver().counters().reserved;
        if p.allocated() + p.cached() != reserved || (full && consistent(p, live_bytes).is_err()) {
            return Err(at(consistent(p, live_bytes)
                .err()
                .unwrap_or_else(|| "inconsistent".into())));
        }
    }
    consistent(p, live_bytes).map_err(|e| format!("{name}, at the end: {e}"))?;
    if p.allocated() != 0 || !live.is_empty() {
        return Err(format!(
            "{name}: {} bytes still allocated at the end",
            p.allocated()
        ));
    }
    Ok(Outcome {
        policy: name,
        counters: p.driver().counters(),
        requests: w.requests(),
        ooms,
        recorded_ooms,
        events: w.ops.len() as u64,
        seconds: 0.0,
    })
}

/// Reserved bytes after each operation that changed them, as (operation index, bytes).
pub fn series(p: &mut dyn CachePolicy, w: &Workload) -> Vec<(u64, u64)> {
    let mut addrs = vec![FAILED; w.slots as usize];
    let mut out = vec![(0, 0)];
    let mut last = 0;
    for (i, op) in w.ops.iter().enumerate() {
        match *op {
            Op::Alloc { slot, size } => addrs[slot as usize] = p.alloc(size).unwrap_or(FAILED),
            Op::Free { slot, need, .. } => {
                let a = addrs[slot as usize];
                if a != FAILED {
                    p.free(a, need);
                }
            }
            Op::RecordedOom { size } => {
                let _ = RecordedOoms::default().replay(p, size, |_, _| Ok(()));
            }
            _ => p.sync(op),
        }
        let r = p.driver().counters().reserved;
        if r != last {
            out.push((i as u64 + 1, r));
            last = r;
        }
    }
    out
}
