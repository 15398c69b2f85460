//! The memory a device reset took back under the pool: the segments it forgot. A program's
//! free of a pointer there is a free of memory CUDA already freed. Passed on to CUDA, it
//! would free whatever the driver put there since: after a reset the driver gives the same
//! addresses again, often to the pool's next segment, whose blocks other threads then hold
//! (and the driver gives them again, twice). So such a free first asks the driver what starts
//! there (`Pool::free`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::backend::Addr;

/// Ranges kept at most: a program that resets again and again, with many segments each time,
/// stops adding past this (its later dead pointers then go to CUDA as before).
const MOST: usize = 1 << 16;

#[derive(Default)]
pub struct ResetFreed {
    /// Start to end of each range, none overlapping.
    ranges: Mutex<BTreeMap<Addr, Addr>>,
    /// `ranges` holds one: read without the lock, so that a process that never reset pays a
    /// load on each free the pool passes on.
    any: AtomicBool,
}

impl ResetFreed {
    /// A reset took back `[addr, addr + size)` for each of `ranges`.
    pub fn add(&self, ranges: impl IntoIterator<Item = (Addr, u64)>) {
        let mut kept = self.ranges.lock();
        for (addr, size) in ranges {
            let end = addr.saturating_add(size);
            // An earlier reset's range the new one overlaps goes: the driver gave its
            // addresses again since, and the new one covers what is dead now.
            let overlapping: Vec<Addr> = kept
                .range(..end)
                .rev()
                .take_while(|&(_, &e)| e > addr)
                .map(|(&s, _)| s)
                .collect();
            for s in overlapping {
                kept.remove(&s);
            }
            if kept.len() < MOST {
                kept.insert(addr, end);
            }
        }
        self.any.store(!kept.is_empty(), Ordering::Release);
    }

    /// Whether a reset took back the memory at `addr`.
    pub fn contains(&self, addr: Addr) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let kept = self.ranges.lock();
        kept.range(..=addr)
            .next_back()
            .is_some_and(|(_, &end)| addr < end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_hold_their_addresses_and_a_later_reset_replaces_what_it_overlaps() {
        let r = ResetFreed::default();
        r.add([(0x1000, 0x1000), (0x4000, 0x2000)]);
        assert!(r.contains(0x1000) && r.contains(0x1fff) && r.contains(0x5fff));
        assert!(!r.contains(0xfff) && !r.contains(0x2000) && !r.contains(0x6000));
        r.add([(0x1800, 0x3000)]);
        assert!(!r.contains(0x1000), "the overlapped range went");
        assert!(r.contains(0x1800) && r.contains(0x47ff));
        assert!(!r.contains(0x5000), "the other overlapped range went too");
    }
}
