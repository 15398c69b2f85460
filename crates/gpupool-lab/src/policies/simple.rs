//! The two baselines: no cache at all, and an exact-size free-list cache without splitting.

use std::collections::HashMap;

use super::{round, CachePolicy, Driver};
use gpupool::pool::{Addr, ReuseWait};

/// Every request a real `cudaMalloc` (of the request rounded to 512 bytes), every free a real
/// `cudaFree`: the floor for memory, the ceiling for driver calls.
pub struct NoCache {
    driver: Driver,
    live: HashMap<Addr, u64>,
    allocated: u64,
}

impl NoCache {
    pub fn new(capacity: Option<u64>) -> NoCache {
        NoCache {
            driver: Driver::new(capacity),
            live: HashMap::new(),
            allocated: 0,
        }
    }
}

impl CachePolicy for NoCache {
    fn name(&self) -> String {
        "no cache".into()
    }
    fn alloc(&mut self, size: u64) -> Option<Addr> {
        let r = round(size)?;
        let addr = self.driver.malloc(r)?;
        self.live.insert(addr, r);
        self.allocated += r;
        Some(addr)
    }
    fn free(&mut self, addr: Addr, _need: ReuseWait) -> bool {
        let Some(r) = self.live.remove(&addr) else {
            return false;
        };
        self.allocated -= r;
        self.driver.free(addr)
    }
    fn driver(&self) -> &Driver {
        &self.driver
    }
    fn allocated(&self) -> u64 {
        self.allocated
    }
    fn cached(&self) -> u64 {
        0
    }
}

/// What hand-written pools usually do: freed blocks wait in a free list per exact (rounded)
/// size and serve only requests of that size; a miss is a `cudaMalloc` of the request; when the
/// driver refuses, every cached block is freed and the call retried.
pub struct ExactCache {
    driver: Driver,
    lists: HashMap<u64, Vec<Addr>>,
    live: HashMap<Addr, u64>,
    allocated: u64,
    cached: u64,
}

impl ExactCache {
    pub fn new(capacity: Option<u64>) -> ExactCache {
        ExactCache {
            driver: Driver::new(capacity),
            lists: HashMap::new(),
            live: HashMap::new(),
            allocated: 0,
            cached: 0,
        }
    }

    fn release_all(&mut self) {
        for (_, list) in self.lists.drain() {
            for addr in list {
                self.driver.free(addr);
            }
        }
        self.cached = 0;
    }
}

impl CachePolicy for ExactCache {
    fn name(&self) -> String {
        "exact-size cache".into()
    }
    fn alloc(&mut self, size: u64) -> Option<Addr> {
        let r = round(size)?;
        let addr = match self.lists.get_mut(&r).and_then(Vec::pop) {
            Some(addr) => {
                self.cached -= r;
                addr
            }
            None => match self.driver.malloc(r) {
                Some(a) => a,
                None => {
                    self.release_all();
                    self.driver.malloc(r)?
                }
            },
        };
        self.live.insert(addr, r);
        self.allocated += r;
        Some(addr)
    }
    fn free(&mut self, addr: Addr, _need: ReuseWait) -> bool {
        let Some(r) = self.live.remove(&addr) else {
            return false;
        };
        self.allocated -= r;
        self.cached += r;
        self.lists.entry(r).or_default().push(addr);
        true
    }
    fn driver(&self) -> &Driver {
        &self.driver
    }
    fn allocated(&self) -> u64 {
        self.allocated
    }
    fn cached(&self) -> u64 {
        self.cached
    }
}
