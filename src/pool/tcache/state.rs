//! One thread's cache: its ready blocks by size, the blocks it handed out, the blocks waiting
//! for a barrier or fence, and what is on its way back to the device.

use super::*;
use crate::pool::Origin;

/// Lists of reusable blocks by size: small sizes (every 512 bytes up to 1 MiB, the common case)
/// indexed directly, larger ones in a map; a bitmap of the small sizes that got a block since
/// the last clear, so that a walk over the lists (a full cache choosing what to give back)
/// visits those alone rather than all 2 048.
#[derive(Default)]
struct ReadyLists {
    small: Vec<Vec<CachedBlock>>,
    small_used: [u64; SMALL_SLOTS / 64],
    large: HashMap<u64, Vec<CachedBlock>, BuildHasherDefault<AddrHasher>>,
}

const SMALL_SLOTS: usize = (SMALL_LIMIT / ALIGN) as usize;

impl ReadyLists {
    fn get_mut(&mut self, size: u64) -> Option<&mut Vec<CachedBlock>> {
        if size <= SMALL_LIMIT {
            self.small.get_mut((size / ALIGN) as usize - 1)
        } else {
            self.large.get_mut(&size)
        }
    }

    fn entry(&mut self, size: u64) -> &mut Vec<CachedBlock> {
        if size <= SMALL_LIMIT {
            if self.small.is_empty() {
                self.small.resize_with(SMALL_SLOTS, Vec::new);
            }
            let i = (size / ALIGN) as usize - 1;
            self.small_used[i / 64] |= 1 << (i % 64);
            &mut self.small[i]
        } else {
            self.large.entry(size).or_default()
        }
    }

    /// (size, list) of every size that got a block since the last `prune` or `clear` (some
    /// lists may be empty).
    fn iter(&self) -> impl Iterator<Item = (u64, &Vec<CachedBlock>)> {
        let small = self
            .small_used
            .iter()
            .enumerate()
            .flat_map(move |(w, &bits)| {
                let mut bits = bits;
                std::iter::from_fn(move || {
                    if bits == 0 {
                        return None;
                    }
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    Some(((i as u64 + 1) * ALIGN, &self.small[i]))
                })
            });
        small.chain(self.large.iter().map(|(&s, v)| (s, v)))
    }

    /// Forget the sizes whose lists are empty now.
    fn prune(&mut self) {
        for (w, bits) in self.small_used.iter_mut().enumerate() {
            let mut b = *bits;
            while b != 0 {
                let i = w * 64 + b.trailing_zeros() as usize;
                b &= b - 1;
                if self.small[i].is_empty() {
                    *bits &= !(1 << (i % 64));
                }
            }
        }
        self.large.retain(|_, v| !v.is_empty());
    }

    fn clear(&mut self) {
        self.small.iter_mut().for_each(Vec::clear);
        self.small_used = [0; SMALL_SLOTS / 64];
        self.large.clear();
    }
}

#[derive(Default)]
pub struct CacheState {
    /// The device pool's generation these blocks belong to (`DevicePool::generation`).
    pub generation: u64,
    pub out: AddrMap<HandedOut>,
    /// Reusable blocks by size, oldest first.
    ready: ReadyLists,
    pub ready_bytes: u64,
    pub ready_count: u64,
    /// Freed blocks that wait for a barrier or fence, in the order of their stamps: reusable
    /// from here once one covers them (`promote`), or given back to the device.
    waiting: VecDeque<CachedBlock>,
    pub waiting_bytes: u64,
    /// Of `waiting_bytes`, those waiting for a fence.
    pub waiting_fence_bytes: u64,
    /// Over the blocks handed out: their size minus what was requested.
    pub out_slack: u64,
    /// Free blocks on their way back to the device (out of this cache, not yet taken back: the
    /// device still counts them lent), so that a report does not read them as the program's.
    pub transit: Transit,
    pub counts: CacheCounts,
}

/// Free blocks a cache sent back to the device that the device has not taken yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transit {
    pub bytes: u64,
    pub count: u64,
    /// Of `bytes`, those whose reuse waits for a barrier or fence (pending).
    pub waiting_bytes: u64,
}

impl Transit {
    fn of(held: &[CachedBlock]) -> Transit {
        held.iter().fold(Transit::default(), |t, h| Transit {
            bytes: t.bytes + h.size,
            count: t.count + 1,
            waiting_bytes: t.waiting_bytes
                + if h.need == ReuseWait::Nothing {
                    0
                } else {
                    h.size
                },
        })
    }
}

impl CacheState {
    /// A reusable block of `rounded` bytes for a request of `requested`, if the cache has one.
    pub fn take_ready(&mut self, rounded: u64, requested: u64, origin: Origin) -> Option<Addr> {
        let h = self.ready.get_mut(rounded)?.pop()?;
        self.ready_bytes -= h.size;
        self.ready_count -= 1;
        self.counts.hits += 1;
        self.counts.allocs += 1;
        self.counts.allocated_in += h.size;
        self.counts.requested_in += requested;
        self.counts.histogram[histogram_bucket(requested)] += 1;
        self.hand_out(h.addr, h.idx, h.size, requested, origin);
        Some(h.addr)
    }

    /// Record a block handed out (the device counted the allocation if it served it).
    pub fn hand_out(&mut self, addr: Addr, idx: u32, size: u64, requested: u64, origin: Origin) {
        self.out_slack += size - requested;
        self.out.insert(
            addr,
            HandedOut {
                idx,
                size,
                requested,
                origin,
            },
        );
    }

    /// The program freed `addr`: the block, if this cache handed it out.
    pub fn take_out(&mut self, addr: Addr) -> Option<HandedOut> {
        let o = self.out.remove(&addr)?;
        self.out_slack -= o.size - o.requested;
        self.counts.frees += 1;
        self.counts.allocated_out += o.size;
        self.counts.requested_out += o.requested;
        Some(o)
    }

    pub fn push_ready(&mut self, addr: Addr, idx: u32, size: u64) {
        self.ready.entry(size).push(CachedBlock {
            idx,
            addr,
            size,
            need: ReuseWait::Nothing,
            stamp: 0,
        });
        self.ready_bytes += size;
        self.ready_count += 1;
    }

    /// A block freed at cache epoch `stamp` that must wait for `need`.
    pub fn push_waiting(&mut self, addr: Addr, idx: u32, size: u64, need: ReuseWait, stamp: u64) {
        self.waiting.push_back(CachedBlock {
            idx,
            addr,
            size,
            need,
            stamp,
        });
        self.waiting_bytes += size;
        if need == ReuseWait::Fence {
            self.waiting_fence_bytes += size;
        }
    }

    /// What the oldest waiting block waits for (`promote` stops at the first block not covered).
    pub fn front_waits_for(&self) -> Option<ReuseWait> {
        self.waiting.front().map(|h| h.need)
    }

    /// Waiting blocks that a fence or barrier covered since become reusable. Whether any did.
    pub fn promote(&mut self, clock: &ReuseClock) -> bool {
        let Some(front) = self.waiting.front() else {
            return false;
        };
        let fenced = clock.cache_fenced.load(Ordering::SeqCst);
        let barriered = clock.cache_barriered.load(Ordering::SeqCst).max(fenced);
        let covered = |h: &CachedBlock| match h.need {
            ReuseWait::Nothing => true,
            ReuseWait::Barrier => h.stamp < barriered,
            ReuseWait::Fence => h.stamp < fenced,
        };
        if !covered(front) {
            return false;
        }
        // In stamp order: the first block still waiting stops the walk (a barrier-bound block
        // behind a fence-bound one waits a little longer, never less).
        while let Some(h) = self.waiting.front().copied().filter(covered) {
            self.waiting.pop_front();
            self.waiting_bytes -= h.size;
            if h.need == ReuseWait::Fence {
                self.waiting_fence_bytes -= h.size;
            }
            self.push_ready(h.addr, h.idx, h.size);
        }
        true
    }

    /// Free bytes held, reusable or not.
    pub fn held_bytes(&self) -> u64 {
        self.ready_bytes + self.waiting_bytes
    }

    /// Free blocks held.
    pub fn held_count(&self) -> u64 {
        self.ready_count + self.waiting.len() as u64
    }

    /// Every free block (to give back to the device).
    pub fn spill_all(&mut self) -> Vec<CachedBlock> {
        let mut out = self.take_waiting();
        self.spill_ready(0, &mut out);
        out
    }

    /// Every block still waiting (given back to the device, they wait there).
    pub fn take_waiting(&mut self) -> Vec<CachedBlock> {
        self.waiting_bytes = 0;
        self.waiting_fence_bytes = 0;
        self.waiting.drain(..).collect()
    }

    /// Move reusable blocks into `out` until at most `keep` reusable bytes remain (the sizes
    /// held most of first).
    pub fn spill_ready(&mut self, keep: u64, out: &mut Vec<CachedBlock>) {
        self.ready.prune();
        while self.ready_bytes > keep {
            // The size holding the most bytes gives back its older half (the newest stay for
            // the next request of this size).
            let Some((size, _)) = self
                .ready
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .max_by_key(|(s, v)| s * v.len() as u64)
            else {
                break;
            };
            self.spill_size(size, keep == 0, out);
        }
    }

    /// Move the older half of the reusable blocks of `size` bytes (all of them if `all`) into
    /// `out`.
    pub fn spill_size(&mut self, size: u64, all: bool, out: &mut Vec<CachedBlock>) {
        let Some(list) = self.ready.get_mut(size) else {
            return;
        };
        let n = if all {
            list.len()
        } else {
            list.len().div_ceil(2)
        };
        for h in list.drain(..n) {
            self.ready_bytes -= h.size;
            self.ready_count -= 1;
            out.push(h);
        }
    }

    /// `held` left this cache for the device (`Pool::receive_from_cache`), which takes them back once it
    /// has its lock.
    pub fn send(&mut self, held: &[CachedBlock]) {
        let sent = Transit::of(held);
        let t = &mut self.transit;
        t.bytes += sent.bytes;
        t.count += sent.count;
        t.waiting_bytes += sent.waiting_bytes;
    }

    /// The device took back `held`, sent at generation `generation`.
    pub fn arrived(&mut self, generation: u64, held: &[CachedBlock]) {
        if self.generation == generation {
            let back = Transit::of(held);
            let t = &mut self.transit;
            t.bytes = t.bytes.saturating_sub(back.bytes);
            t.count = t.count.saturating_sub(back.count);
            t.waiting_bytes = t.waiting_bytes.saturating_sub(back.waiting_bytes);
        }
    }

    /// Forget every block (the device forgot them: `cudaDeviceReset`; or its thread exited).
    pub fn clear(&mut self, generation: u64) {
        if generation != self.generation {
            // A reset: blocks on their way back are gone with the rest.
            self.transit = Transit::default();
        }
        self.out.clear();
        self.ready.clear();
        self.waiting.clear();
        self.ready_bytes = 0;
        self.ready_count = 0;
        self.waiting_bytes = 0;
        self.waiting_fence_bytes = 0;
        self.out_slack = 0;
        self.generation = generation;
    }

    /// The size of the largest reusable block held (0 for none).
    pub fn largest_ready(&self) -> u64 {
        self.ready
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(size, _)| size)
            .max()
            .unwrap_or(0)
    }

    /// Every free block held.
    pub fn held_blocks(&self) -> impl Iterator<Item = &CachedBlock> {
        self.ready
            .iter()
            .flat_map(|(_, v)| v.iter())
            .chain(self.waiting.iter())
    }
}
