//! A reference policy following PyTorch's documented caching-allocator rules, written from
//! those rules (not from PyTorch's code): requests rounded to 512 bytes; a small pool for
//! requests up to 1 MiB carved from 2 MiB segments; larger requests in a large pool, carved
//! from 20 MiB segments up to 10 MiB and from a segment of their own rounded to 2 MiB above;
//! best fit (smallest block, then lowest address) within the request's pool; a small block is
//! split when at least 512 bytes remain, a large one only when more than 1 MiB remains; freed
//! blocks merge with free neighbours of their segment; when the driver refuses, every cached
//! block that is a whole segment is freed and the call retried once. No `max_split_size`, no
//! release threshold, no expandable segments: PyTorch's defaults.

use std::collections::{BTreeMap, HashMap};

use super::{round, CachePolicy, Driver};
use gpupool::pool::{Addr, ReuseWait};

const MIB: u64 = 1 << 20;
const NONE: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Blk {
    addr: Addr,
    size: u64,
    prev: u32,
    next: u32,
    free: bool,
    small: bool,
}

pub struct TorchRules {
    driver: Driver,
    blocks: Vec<Blk>,
    vacant: Vec<u32>,
    /// Free blocks by (size, address), per pool.
    small: BTreeMap<(u64, Addr), u32>,
    large: BTreeMap<(u64, Addr), u32>,
    live: HashMap<Addr, u32>,
    allocated: u64,
    cached: u64,
}

impl TorchRules {
    pub fn new(capacity: Option<u64>) -> TorchRules {
        TorchRules {
            driver: Driver::new(capacity),
            blocks: Vec::new(),
            vacant: Vec::new(),
            small: BTreeMap::new(),
            large: BTreeMap::new(),
            live: HashMap::new(),
            allocated: 0,
            cached: 0,
        }
    }

    fn index(&mut self, i: u32) -> &mut BTreeMap<(u64, Addr), u32> {
        if self.blocks[i as usize].small {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    fn insert_free(&mut self, i: u32) {
        let b = self.blocks[i as usize];
        self.index(i).insert((b.size, b.addr), i);
    }

    fn remove_free(&mut self, i: u32) {
        let b = self.blocks[i as usize];
        self.index(i).remove(&(b.size, b.addr));
    }

    fn new_block(&mut self, b: Blk) -> u32 {
        match self.vacant.pop() {
            Some(i) => {
                self.blocks[i as usize] = b;
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    /// Free every cached block that is a whole segment.
    fn release_unsplit(&mut self) {
        let whole: Vec<u32> = self
            .small
            .values()
            .chain(self.large.values())
            .copied()
            .filter(|&i| {
                let b = self.blocks[i as usize];
                b.prev == NONE && b.next == NONE
            })
            .collect();
        for i in whole {
            self.remove_free(i);
            let b = self.blocks[i as usize];
            self.driver.free(b.addr);
            self.cached -= b.size;
            self.vacant.push(i);
        }
    }

    fn segment(&mut self, bytes: u64, small: bool) -> Option<u32> {
        let addr = match self.driver.malloc(bytes) {
            Some(a) => a,
            None => {
                self.release_unsplit();
                self.driver.malloc(bytes)?
            }
        };
        self.cached += bytes;
        Some(self.new_block(Blk {
            addr,
            size: bytes,
            prev: NONE,
            next: NONE,
            free: true,
            small,
        }))
    }
}

impl CachePolicy for TorchRules {
    fn name(&self) -> String {
        "PyTorch rules".into()
    }

    fn alloc(&mut self, size: u64) -> Option<Addr> {
        let r = round(size)?;
        let small = r <= MIB;
        let pool = if small { &self.small } else { &self.large };
        let found = pool.range((r, 0)..).next().map(|(_, &i)| i);
        let i = match found {
            Some(i) => {
                self.remove_free(i);
                i
            }
            None => {
                let seg = if small {
                    2 * MIB
                } else if r < 10 * MIB {
                    // PyTorch: `size < kMinLargeAlloc` (10 MiB) takes a 20 MiB segment; exactly
                    // 10 MiB gets its own (no workload here asks for it).
                    20 * MIB
                } else {
                    r.checked_next_multiple_of(2 * MIB)?
                };
                self.segment(seg, small)?
            }
        };
        let b = self.blocks[i as usize];
        let rest = b.size - r;
        if (small && rest >= 512) || (!small && rest > MIB) {
            let j = self.new_block(Blk {
                addr: b.addr + r,
                size: rest,
                prev: i,
                next: b.next,
                free: true,
                small,
            });
            if b.next != NONE {
                self.blocks[b.next as usize].prev = j;
            }
            let bi = &mut self.blocks[i as usize];
            bi.next = j;
            bi.size = r;
            self.insert_free(j);
        }
        let bi = &mut self.blocks[i as usize];
        bi.free = false;
        let (addr, sz) = (bi.addr, bi.size);
        self.cached -= sz;
        self.allocated += sz;
        self.live.insert(addr, i);
        Some(addr)
    }

    fn free(&mut self, addr: Addr, _need: ReuseWait) -> bool {
        let Some(mut i) = self.live.remove(&addr) else {
            return false;
        };
        let sz = self.blocks[i as usize].size;
        self.allocated -= sz;
        self.cached += sz;
        let prev = self.blocks[i as usize].prev;
        if prev != NONE && self.blocks[prev as usize].free {
            self.remove_free(prev);
            let b = self.blocks[i as usize];
            let p = &mut self.blocks[prev as usize];
            p.size += b.size;
            p.next = b.next;
            if b.next != NONE {
                self.blocks[b.next as usize].prev = prev;
            }
            self.vacant.push(i);
            i = prev;
        }
        let next = self.blocks[i as usize].next;
        if next != NONE && self.blocks[next as usize].free {
            self.remove_free(next);
            let n = self.blocks[next as usize];
            let b = &mut self.blocks[i as usize];
            b.size += n.size;
            b.next = n.next;
            if n.next != NONE {
                self.blocks[n.next as usize].prev = i;
            }
            self.vacant.push(next);
        }
        self.blocks[i as usize].free = true;
        self.insert_free(i);
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

    fn check(&self) -> Result<(), String> {
        let mut free_bytes = 0;
        for (&(size, addr), &i) in self.small.iter().chain(self.large.iter()) {
            let b = self.blocks[i as usize];
            if !b.free || b.size != size || b.addr != addr {
                return Err(format!(
                    "index entry {addr:#x}+{size} is not that free block"
                ));
            }
            for n in [b.prev, b.next] {
                if n != NONE && self.blocks[n as usize].free {
                    return Err(format!("free block {addr:#x} has a free neighbour"));
                }
            }
            if b.next != NONE && self.blocks[b.next as usize].addr != addr + size {
                return Err(format!("block {addr:#x}: next is not adjacent"));
            }
            free_bytes += size;
        }
        if free_bytes != self.cached {
            return Err(format!(
                "free blocks {free_bytes} != cached {}",
                self.cached
            ));
        }
        Ok(())
    }
}
