//! PyTorch's `expandable_segments:True`, written from its documentation (the note on expandable
//! segments): each size pool is one reserved address range, tiled by blocks, into which
//! physical memory is mapped page by page as blocks need it (`Driver::map`), and from which the
//! pages no live block touches are unmapped when the driver is out of memory (before the one
//! retry). A small pool for requests up to 1 MiB is mapped in 2 MiB pages, a large pool in
//! 20 MiB pages; blocks are packed one after another, best fit. A block never ends at a
//! segment's edge: free neighbours merge across the whole range, so no memory is stranded at
//! segment ends. (Our own pool's expandable segments are `Ours::expandable`.)

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{round, CachePolicy, Driver};
use gpupool::pool::{Addr, ReuseWait};

const MIB: u64 = 1 << 20;
/// Address space each pool reserves: far more than any device holds.
const RANGE: u64 = 1 << 40;

/// The rules of one set.
#[derive(Clone, Copy, Debug)]
struct Rules {
    /// Requests up to this many bytes go to the small pool.
    small_limit: u64,
    small_page: u64,
    large_page: u64,
}

/// One pool: its range, the blocks that tile its used part, and the pages mapped.
struct Range {
    base: Addr,
    page: u64,
    /// End of the part blocks tile; beyond it, nothing.
    frontier: Addr,
    /// Every block by address: its size and whether it is free.
    blocks: BTreeMap<Addr, (u64, bool)>,
    /// Free blocks by (size, address).
    free: BTreeSet<(u64, Addr)>,
    /// Mapped pages by index, with the live blocks that touch each.
    pages: HashMap<u64, u32>,
}

impl Range {
    fn pages_of(&self, addr: Addr, size: u64) -> std::ops::Range<u64> {
        let first = (addr - self.base) / self.page;
        let end = (addr - self.base + size).div_ceil(self.page);
        first..end
    }

    fn set_free(&mut self, addr: Addr, size: u64) {
        self.blocks.insert(addr, (size, true));
        self.free.insert((size, addr));
    }

    fn unset_free(&mut self, addr: Addr) -> u64 {
        let (size, free) = self.blocks.remove(&addr).expect("a block");
        debug_assert!(free);
        self.free.remove(&(size, addr));
        size
    }

    /// The free block that serves `r` bytes (best fit, lowest address), after growing the tiled
    /// part at the end when none does; `None` when the range has no room left.
    fn place(&mut self, r: u64) -> Option<Addr> {
        if let Some(&(_, addr)) = self.free.range((r, 0)..).next() {
            return Some(addr);
        }
        let tail_free = match self.blocks.range(..self.frontier).next_back() {
            Some((&a, &(size, true))) if a + size == self.frontier => size,
            _ => 0,
        };
        let room = self.base + RANGE - self.frontier + tail_free;
        if r > room {
            return None;
        }
        // Grow: the free block at the end, if any, and new space after it.
        let tail = match self.blocks.range(..self.frontier).next_back() {
            Some((&a, &(size, true))) if a + size == self.frontier => {
                self.unset_free(a);
                a
            }
            _ => self.frontier,
        };
        let end = tail + r;
        self.set_free(tail, end - tail);
        self.frontier = end;
        Some(tail)
    }

    /// Free block `addr` gives its first `r` bytes to the program; the rest stays free.
    fn carve(&mut self, addr: Addr, r: u64) {
        let size = self.unset_free(addr);
        if r < size {
            self.set_free(addr + r, size - r);
        }
        self.blocks.insert(addr, (r, false));
    }

    /// The live block at `addr` is free again, merged with free neighbours. Its size.
    fn release(&mut self, addr: Addr) -> Option<u64> {
        let (size, free) = *self.blocks.get(&addr)?;
        if free {
            return None;
        }
        self.blocks.remove(&addr);
        let (mut a, mut s) = (addr, size);
        if let Some((&p, &(ps, true))) = self.blocks.range(..addr).next_back() {
            if p + ps == addr {
                self.unset_free(p);
                a = p;
                s += ps;
            }
        }
        if let Some(&(ns, true)) = self.blocks.get(&(a + s)) {
            self.unset_free(a + s);
            s += ns;
        }
        self.set_free(a, s);
        Some(size)
    }
}

pub struct Expandable {
    name: &'static str,
    rules: Rules,
    driver: Driver,
    small: Range,
    large: Range,
    allocated: u64,
}

impl Expandable {
    /// PyTorch's expandable segments, from its documentation.
    pub fn torch(capacity: Option<u64>) -> Expandable {
        let rules = Rules {
            small_limit: MIB,
            small_page: 2 * MIB,
            large_page: 20 * MIB,
        };
        Expandable::new("PyTorch expandable", rules, capacity)
    }

    fn new(name: &'static str, rules: Rules, capacity: Option<u64>) -> Expandable {
        let driver = Driver::new(capacity);
        let range = |page| {
            let base = driver.reserve(RANGE).expect("address space");
            Range {
                base,
                page,
                frontier: base,
                blocks: BTreeMap::new(),
                free: BTreeSet::new(),
                pages: HashMap::new(),
            }
        };
        let (small, large) = (range(rules.small_page), range(rules.large_page));
        Expandable {
            name,
            rules,
            driver,
            small,
            large,
            allocated: 0,
        }
    }

    /// Map the pages `[addr, addr + size)` touches in its pool and count the block on each:
    /// false, with nothing changed, when the driver refuses one even after releasing the
    /// unused pages. A page is counted as soon as it is touched, so that the release never
    /// takes one this block needs.
    fn map(&mut self, small: bool, addr: Addr, size: u64) -> bool {
        let range = if small {
            &mut self.small
        } else {
            &mut self.large
        };
        let (base, page) = (range.base, range.page);
        let touched = range.pages_of(addr, size);
        let mut wanted = Vec::new();
        for p in touched.clone() {
            match range.pages.get_mut(&p) {
                Some(users) => *users += 1,
                None => wanted.push(p),
            }
        }
        let mut done = 0;
        for &p in &wanted {
            let at = base + p * page;
            let ok = self.driver.map(at, page)
                || (self.release_unused() > 0 && self.driver.map(at, page));
            if !ok {
                break;
            }
            let range = if small {
                &mut self.small
            } else {
                &mut self.large
            };
            range.pages.insert(p, 1);
            done += 1;
        }
        if done == wanted.len() {
            return true;
        }
        // Undo: the pages mapped here go back, the others lose this block's count.
        let range = if small {
            &mut self.small
        } else {
            &mut self.large
        };
        for p in touched {
            if let Some(users) = range.pages.get_mut(&p) {
                *users -= 1;
                if *users == 0 && wanted.contains(&p) {
                    range.pages.remove(&p);
                    self.driver.unmap(base + p * page);
                }
            }
        }
        false
    }

    /// Unmap every page no live block touches, in both pools. The bytes unmapped.
    fn release_unused(&mut self) -> u64 {
        let mut released = 0;
        for range in [&mut self.small, &mut self.large] {
            let unused: Vec<u64> = range
                .pages
                .iter()
                .filter(|&(_, &users)| users == 0)
                .map(|(&p, _)| p)
                .collect();
            for p in unused {
                range.pages.remove(&p);
                self.driver.unmap(range.base + p * range.page);
                released += range.page;
            }
        }
        released
    }

    fn mapped(&self) -> u64 {
        self.small.pages.len() as u64 * self.small.page
            + self.large.pages.len() as u64 * self.large.page
    }
}

impl CachePolicy for Expandable {
    fn name(&self) -> String {
        self.name.into()
    }

    fn alloc(&mut self, size: u64) -> Option<Addr> {
        let r = round(size)?;
        let small = r <= self.rules.small_limit;
        let range = if small {
            &mut self.small
        } else {
            &mut self.large
        };
        let start = range.place(r)?;
        range.carve(start, r);
        if !self.map(small, start, r) {
            let range = if small {
                &mut self.small
            } else {
                &mut self.large
            };
            range.release(start);
            return None;
        }
        self.allocated += r;
        Some(start)
    }

    fn free(&mut self, addr: Addr, _need: ReuseWait) -> bool {
        let small = addr >= self.small.base && addr < self.small.base + RANGE;
        let range = if small {
            &mut self.small
        } else {
            &mut self.large
        };
        let Some(size) = range.release(addr) else {
            return false;
        };
        for p in range.pages_of(addr, size) {
            *range.pages.get_mut(&p).expect("mapped") -= 1;
        }
        self.allocated -= size;
        true
    }

    fn driver(&self) -> &Driver {
        &self.driver
    }
    fn allocated(&self) -> u64 {
        self.allocated
    }
    fn cached(&self) -> u64 {
        self.mapped() - self.allocated
    }

    fn check(&self) -> Result<(), String> {
        for range in [&self.small, &self.large] {
            let mut at = range.base;
            for (&addr, &(size, free)) in &range.blocks {
                if addr != at {
                    return Err(format!("blocks do not tile the range at {at:#x}"));
                }
                if free != range.free.contains(&(size, addr)) {
                    return Err(format!("block {addr:#x}: free index disagrees"));
                }
                at = addr + size;
            }
            if at != range.frontier {
                return Err(format!(
                    "tiling ends at {at:#x}, the frontier at {:#x}",
                    range.frontier
                ));
            }
        }
        Ok(())
    }
}
