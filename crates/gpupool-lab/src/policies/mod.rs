//! Allocation policies side by side on the same request stream (`crate::workloads`): our pool,
//! with and without a release threshold, and with expandable segments on the driver's virtual
//! memory; no cache; an exact-size free-list cache; policies following PyTorch's documented caching
//! rules, without and with expandable segments. Each allocates from its own simulated driver
//! (`Driver`), which counts the calls and the reserved bytes; `run` drives a policy through a
//! workload and reports; `run_checked` does the same while checking, after every operation,
//! that live blocks never overlap and lie inside the policy's segments, that every free matches
//! an allocation, and that allocated + cached = reserved.

pub mod driver;
pub mod expandable;
pub mod ours;
pub mod run;
pub mod simple;
pub mod torch;

pub use driver::{Counters, Driver};
pub use run::{run, run_checked, series, Outcome, RecordedOoms};

use crate::workloads::Op;
use gpupool::pool::{Addr, ReuseWait};

/// What a policy does with the program's requests.
pub trait CachePolicy {
    fn name(&self) -> String;
    /// Serve `size` bytes: the block's address, or `None` when the driver refuses even after
    /// the policy's own out-of-memory recovery.
    fn alloc(&mut self, size: u64) -> Option<Addr>;
    /// The program frees the block at `addr` (its reuse waiting for `need`, which only our pool
    /// models). False when `addr` is not a live block.
    fn free(&mut self, addr: Addr, need: ReuseWait) -> bool;
    /// A recorded synchronization (`Op::Observe`, `Op::SyncPoint`).
    fn sync(&mut self, _op: &Op) {}
    fn driver(&self) -> &Driver;
    /// Bytes in live blocks, after the policy's rounding.
    fn allocated(&self) -> u64;
    /// Bytes held from the driver and not in live blocks.
    fn cached(&self) -> u64;
    /// Structural invariants beyond the ones `run_checked` sees from outside.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// A request rounded to 512 bytes (at least 512), as every policy here does.
pub fn round(size: u64) -> Option<u64> {
    size.max(1).checked_next_multiple_of(512)
}

/// The mapped slack of the lineup's last expandable policy, in thousandths
/// (`GPUPOOL_EXPANDABLE_SLACK=4%`).
pub const LINEUP_SLACK: u32 = 40;

/// The policies, in report order: ours by default, with release threshold `threshold`, with
/// expandable segments and with them and a mapped slack, the PyTorch rules without and with
/// expandable segments, the exact-size cache, no cache. `capacity` caps each one's driver.
pub fn lineup(threshold: u64, capacity: Option<u64>) -> Vec<Box<dyn CachePolicy>> {
    vec![
        Box::new(ours::Ours::new(capacity, u64::MAX)),
        Box::new(ours::Ours::new(capacity, threshold)),
        Box::new(ours::Ours::expandable(capacity, u64::MAX)),
        Box::new(ours::Ours::expandable_with_slack(capacity, LINEUP_SLACK)),
        Box::new(torch::TorchRules::new(capacity)),
        Box::new(expandable::Expandable::torch(capacity)),
        Box::new(simple::ExactCache::new(capacity)),
        Box::new(simple::NoCache::new(capacity)),
    ]
}

/// How many policies `lineup` makes.
pub const LINEUP: usize = 8;
