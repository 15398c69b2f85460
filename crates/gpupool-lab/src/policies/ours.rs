//! Our pool's algorithm (`gpupool::pool::DevicePool`, unchanged) behind the comparison's trait.

use std::sync::atomic::Ordering;

use super::{CachePolicy, Driver};
use crate::workloads::Op;
use gpupool::pool::device::{DevicePool, Policy};
use gpupool::pool::{Addr, FreeKind, ReuseClock, ReuseWait};

pub struct Ours {
    name: String,
    driver: Driver,
    pool: DevicePool,
    clock: ReuseClock,
    policy: Policy,
}

impl Ours {
    /// The pool with its default settings and release threshold `threshold` (`u64::MAX`: none).
    pub fn new(capacity: Option<u64>, threshold: u64) -> Ours {
        let name = if threshold == u64::MAX {
            "gpupool".to_string()
        } else {
            format!(
                "gpupool, threshold {}",
                gpupool::report::units::bytes(threshold)
            )
        };
        Ours {
            name,
            driver: Driver::new(capacity),
            pool: DevicePool::new(0, threshold),
            clock: ReuseClock::default(),
            policy: Policy {
                max_split_size: u64::MAX,
                fence_bytes: 256 << 20,
                mapped_slack_permille: None,
            },
        }
    }
}

impl Ours {
    /// The pool with expandable segments on (`GPUPOOL_EXPANDABLE=1`), its driver answering the
    /// virtual memory calls, and release threshold `threshold`.
    pub fn expandable(capacity: Option<u64>, threshold: u64) -> Ours {
        let mut ours = Ours::new(capacity, threshold);
        ours.name = match threshold {
            u64::MAX => "gpupool, expandable".to_string(),
            t => format!(
                "gpupool, expandable, threshold {}",
                gpupool::report::units::bytes(t)
            ),
        };
        ours.driver = Driver::with_vmm(capacity);
        ours.pool.enable_expandable(&ours.driver);
        ours
    }

    /// The pool with expandable segments and a mapped slack of `permille` thousandths of its
    /// peak allocated (`GPUPOOL_EXPANDABLE_SLACK`).
    pub fn expandable_with_slack(capacity: Option<u64>, permille: u32) -> Ours {
        let mut ours = Ours::expandable(capacity, u64::MAX);
        ours.name = format!("gpupool, expandable, slack {}", slack_name(permille));
        ours.policy.mapped_slack_permille = Some(permille);
        ours
    }
}

/// `40` as `4%`, `25` as `2.5%`.
pub fn slack_name(permille: u32) -> String {
    match permille % 10 {
        0 => format!("{}%", permille / 10),
        tenth => format!("{}.{tenth}%", permille / 10),
    }
}

impl CachePolicy for Ours {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn alloc(&mut self, size: u64) -> Option<Addr> {
        self.pool
            .alloc(size, &self.driver, &self.clock, &self.policy)
            .ok()
    }
    fn free(&mut self, addr: Addr, need: ReuseWait) -> bool {
        let clock = &self.clock;
        self.pool.free(addr, FreeKind::Sync, need, || {
            let s = clock.freed.load(Ordering::Relaxed);
            clock.freed.store(s + 1, Ordering::Relaxed);
            s
        })
    }
    fn sync(&mut self, op: &Op) {
        match *op {
            Op::Observe { fenced, barriered } => {
                self.clock.fenced.fetch_max(fenced, Ordering::Relaxed);
                self.clock.barriered.fetch_max(barriered, Ordering::Relaxed);
                self.pool.promote(&self.clock);
            }
            Op::SyncPoint => self.pool.sync_point(&self.driver, &self.clock),
            Op::Alloc { .. } | Op::Free { .. } | Op::RecordedOom { .. } => {}
        }
    }
    fn driver(&self) -> &Driver {
        &self.driver
    }
    fn allocated(&self) -> u64 {
        self.pool.stats.allocated.current
    }
    fn cached(&self) -> u64 {
        self.pool.cached()
    }
    fn check(&self) -> Result<(), String> {
        self.pool.check()?;
        let reserved = self.driver.counters().reserved;
        if self.pool.stats.reserved.current != reserved {
            return Err(format!(
                "pool reserved {} != driver {reserved}",
                self.pool.stats.reserved.current
            ));
        }
        Ok(())
    }
}
