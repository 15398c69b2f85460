//! The best-fit index of a device's free small blocks: one list per exact size (a multiple of
//! `ALIGN` up to a whole small segment) and a two-level bitmap of the sizes that have blocks.
//!
//! Small blocks are the many ones: a program of ever-different small sizes keeps tens of
//! thousands of fragments free, and every free merges neighbours (two removals and one insertion)
//! while every allocation that its exact-size bin cannot serve looks for the best fit. An ordered
//! map pays a tree search with cache misses for each; here each step is a few word operations.
//! Best fit is kept exactly (the smallest size that is large enough); among blocks of one size
//! the last one listed is taken: the most recently freed, whose memory is the likeliest to be
//! warm, unless a merge took a block out of the middle of the list (the last one moves into its
//! place).

use super::size::{ALIGN, SMALL_SEGMENT};

/// Sizes indexed one by one: `ALIGN`, 2 × `ALIGN`, ... up to a small segment; a larger block
/// (a small range's frontier or wide holes; `DevicePool` keeps those apart) would share the last
/// list.
const CLASSES: usize = (SMALL_SEGMENT / ALIGN) as usize;
const WORDS: usize = CLASSES / 64;
const ABSENT: u32 = u32::MAX;

pub struct FreeLists {
    lists: Vec<Vec<u32>>,
    /// Bit `c` set: list `c` is not empty.
    bits: [u64; WORDS],
    /// Bit `w` set: `bits[w]` is not zero.
    summary: u128,
    /// Where each block sits in its list, by block handle (`ABSENT` when not indexed).
    pos: Vec<u32>,
    len: usize,
}

const _: () = assert!(WORDS <= 128, "the summary word covers every bitmap word");

fn class_of(size: u64) -> usize {
    debug_assert!(size >= ALIGN && size.is_multiple_of(ALIGN));
    ((size / ALIGN) as usize).clamp(1, CLASSES) - 1
}

/// The size a list holds.
fn size_of(class: usize) -> u64 {
    (class as u64 + 1) * ALIGN
}

impl Default for FreeLists {
    fn default() -> Self {
        FreeLists {
            lists: vec![Vec::new(); CLASSES],
            bits: [0; WORDS],
            summary: 0,
            pos: Vec::new(),
            len: 0,
        }
    }
}

impl FreeLists {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Index block `idx` of `size` bytes.
    pub fn insert(&mut self, idx: u32, size: u64) {
        debug_assert!(size <= SMALL_SEGMENT, "small blocks fit in a small segment");
        let c = class_of(size);
        let list = &mut self.lists[c];
        if self.pos.len() <= idx as usize {
            self.pos.resize(idx as usize + 1, ABSENT);
        }
        debug_assert_eq!(self.pos[idx as usize], ABSENT, "block indexed twice");
        self.pos[idx as usize] = list.len() as u32;
        list.push(idx);
        self.bits[c / 64] |= 1 << (c % 64);
        self.summary |= 1u128 << (c / 64);
        self.len += 1;
    }

    /// Remove block `idx` of `size` bytes; false if it was not indexed there.
    pub fn remove(&mut self, idx: u32, size: u64) -> bool {
        if !self.contains(idx, size) {
            return false;
        }
        let c = class_of(size);
        let list = &mut self.lists[c];
        let at = std::mem::replace(&mut self.pos[idx as usize], ABSENT) as usize;
        list.swap_remove(at);
        if let Some(&moved) = list.get(at) {
            self.pos[moved as usize] = at as u32;
        }
        if list.is_empty() {
            self.bits[c / 64] &= !(1 << (c % 64));
            if self.bits[c / 64] == 0 {
                self.summary &= !(1u128 << (c / 64));
            }
        }
        self.len -= 1;
        true
    }

    /// Whether block `idx` is indexed as a block of `size` bytes.
    pub fn contains(&self, idx: u32, size: u64) -> bool {
        let Some(&at) = self.pos.get(idx as usize) else {
            return false;
        };
        self.lists[class_of(size)].get(at as usize) == Some(&idx)
    }

    /// The best fit for `size` bytes: a block of the smallest indexed size at least `size`, as
    /// (that size, handle).
    pub fn best_fit(&self, size: u64) -> Option<(u64, u32)> {
        if size > SMALL_SEGMENT {
            return None;
        }
        let c = self.next_class(class_of(size.max(1).div_ceil(ALIGN) * ALIGN))?;
        let idx = *self.lists[c].last().expect("a set bit has a block");
        Some((size_of(c), idx))
    }

    /// The first class from `from` on whose list holds blocks: a few word operations.
    #[inline(always)]
    fn next_class(&self, from: usize) -> Option<usize> {
        if from >= CLASSES {
            return None;
        }
        let w = from / 64;
        let here = self.bits[w] & (u64::MAX << (from % 64));
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        let above = match w + 1 {
            n if n < WORDS => self.summary & (u128::MAX << n),
            _ => 0,
        };
        if above == 0 {
            return None;
        }
        let w = above.trailing_zeros() as usize;
        Some(w * 64 + self.bits[w].trailing_zeros() as usize)
    }

    /// Every block of at least `size` bytes, as (its size, handle): the smallest size first,
    /// and within a size in `best_fit`'s order. For the rare search past the best fit.
    pub fn fits(&self, size: u64) -> impl Iterator<Item = (u64, u32)> + '_ {
        let from = match size {
            s if s > SMALL_SEGMENT => CLASSES,
            s => class_of(s.max(1).div_ceil(ALIGN) * ALIGN),
        };
        std::iter::successors(self.next_class(from), |&c| self.next_class(c + 1)).flat_map(
            move |c| {
                self.lists[c]
                    .iter()
                    .rev()
                    .map(move |&idx| (size_of(c), idx))
            },
        )
    }

    /// The largest indexed size.
    pub fn largest(&self) -> Option<u64> {
        if self.summary == 0 {
            return None;
        }
        let w = 127 - self.summary.leading_zeros() as usize;
        Some(size_of(w * 64 + 63 - self.bits[w].leading_zeros() as usize))
    }

    pub fn clear(&mut self) {
        for w in 0..WORDS {
            let mut bits = self.bits[w];
            while bits != 0 {
                self.lists[w * 64 + bits.trailing_zeros() as usize].clear();
                bits &= bits - 1;
            }
        }
        self.bits = [0; WORDS];
        self.summary = 0;
        self.pos.clear();
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The lists against an ordered map of (size, handle), under a deterministic mix of
    /// insertions, removals and best-fit queries over every size class.
    #[test]
    fn best_fit_matches_an_ordered_map() {
        let mut lists = FreeLists::default();
        let mut model: BTreeMap<(u64, u32), ()> = BTreeMap::new();
        let mut sizes: Vec<Option<u64>> = vec![None; 3000];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..200_000 {
            let idx = (next() % 3000) as u32;
            // Mostly sizes near the two ends and the word boundaries, some anywhere.
            let size = match next() % 4 {
                0 => (next() % 130 + 1) * ALIGN,
                1 => SMALL_SEGMENT - (next() % 130) * ALIGN,
                _ => (next() % CLASSES as u64 + 1) * ALIGN,
            };
            match sizes[idx as usize] {
                Some(s) => {
                    assert!(lists.remove(idx, s), "step {step}");
                    assert!(!lists.remove(idx, s), "removed twice");
                    model.remove(&(s, idx));
                    sizes[idx as usize] = None;
                }
                None => {
                    lists.insert(idx, size);
                    model.insert((size, idx), ());
                    sizes[idx as usize] = Some(size);
                }
            }
            let want = (next() % CLASSES as u64 + 1) * ALIGN;
            let got = lists.best_fit(want);
            let expected = model.range((want, 0)..).next().map(|(&(s, _), _)| s);
            assert_eq!(
                got.map(|g| g.0),
                expected,
                "step {step}: best fit for {want}"
            );
            if let Some((s, i)) = got {
                assert_eq!(sizes[i as usize], Some(s), "the handle has that size");
            }
            assert_eq!(lists.len(), model.len());
            let largest = model.keys().next_back().map(|k| k.0);
            assert_eq!(lists.largest(), largest);
        }
        lists.clear();
        assert!(lists.is_empty());
        assert_eq!(lists.best_fit(ALIGN), None);
        assert_eq!(lists.largest(), None);
        assert!(!lists.contains(0, ALIGN));
    }

    #[test]
    fn fits_lists_every_block_large_enough_smallest_first() {
        let mut lists = FreeLists::default();
        for (idx, size) in [
            (1, 8192),
            (2, 4096),
            (3, 8192),
            (4, 1024),
            (5, SMALL_SEGMENT),
        ] {
            lists.insert(idx, size);
        }
        let all: Vec<_> = lists.fits(4000).collect();
        assert_eq!(
            all,
            [(4096, 2), (8192, 3), (8192, 1), (SMALL_SEGMENT, 5)],
            "by size, the most recently freed of a size first"
        );
        assert_eq!(lists.fits(4000).next(), lists.best_fit(4000));
        assert_eq!(lists.fits(1).count(), 5);
        assert_eq!(lists.fits(SMALL_SEGMENT + 1).count(), 0);
    }

    #[test]
    fn most_recently_freed_of_a_size_first() {
        let mut lists = FreeLists::default();
        lists.insert(7, 4096);
        lists.insert(3, 4096);
        lists.insert(9, 8192);
        assert_eq!(lists.best_fit(1), Some((4096, 3)));
        assert!(lists.remove(3, 4096));
        assert_eq!(lists.best_fit(4096), Some((4096, 7)));
        assert_eq!(lists.best_fit(4097), Some((8192, 9)));
        assert_eq!(lists.best_fit(8193), None);
        assert!(!lists.contains(9, 4096), "indexed under its own size only");
        assert_eq!(lists.best_fit(u64::MAX), None);
    }
}
