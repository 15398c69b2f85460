//! The blocks held for each stream (`device/stream_hold.rs`): by stream, an ordered set of
//! keys, (in a large segment, size, handle), so that a request takes the smallest held block
//! that fits. A stream-ordered pair frees one block (an insert) and takes it back at its next
//! allocation (a search and a remove): on the `cudaMallocAsync` path that is every tensor.
//!
//! The key inserted last stays out of the sets, in `recent`, until the next insert moves it
//! there, as the live map keeps its last entry (`live_map.rs`): a block taken back before the
//! next free costs a compare each way instead of a tree's insert, search and remove. A search
//! takes the smaller of `recent` and the set's first fit, so every answer is the sets' own.

use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasherDefault;

use super::{IntHasher, StreamKey};

/// Where a held block stands in its stream's set: (in a large segment, size, handle).
pub type HeldKey = (bool, u64, u32);

/// Streams whose set stays once emptied (a stream that frees and allocates in turn would
/// otherwise drop and remake its set on every pair); beyond that, an emptied set goes, so
/// destroyed streams leave nothing behind.
const EMPTY_SETS_KEPT: usize = 16;

#[derive(Default)]
pub struct HeldSets {
    /// The key inserted last and its stream, in no set.
    recent: Option<(StreamKey, HeldKey)>,
    sets: HashMap<StreamKey, BTreeSet<HeldKey>, BuildHasherDefault<IntHasher>>,
    /// Keys in `sets` (`recent` apart): none, and a search needs no lookup.
    in_sets: usize,
}

impl HeldSets {
    /// Hold `key`, not held yet, for `stream`. It waits in `recent`; the key there before goes
    /// into its stream's set.
    #[inline(always)]
    pub fn insert(&mut self, stream: StreamKey, key: HeldKey) {
        debug_assert!(!self.contains(stream, key));
        if let Some((s, k)) = self.recent.replace((stream, key)) {
            self.insert_in_set(s, k);
        }
    }

    #[inline(never)]
    fn insert_in_set(&mut self, stream: StreamKey, key: HeldKey) {
        self.sets.entry(stream).or_default().insert(key);
        self.in_sets += 1;
    }

    /// `key` is no longer held for `stream` (if it was).
    #[inline(always)]
    pub fn remove(&mut self, stream: StreamKey, key: HeldKey) {
        if self.recent == Some((stream, key)) {
            self.recent = None;
        } else {
            self.remove_from_set(stream, key);
        }
    }

    #[inline(never)]
    fn remove_from_set(&mut self, stream: StreamKey, key: HeldKey) {
        let Some(set) = self.sets.get_mut(&stream) else {
            return;
        };
        if set.remove(&key) {
            self.in_sets -= 1;
        }
        if set.is_empty() && self.sets.len() > EMPTY_SETS_KEPT {
            self.sets.remove(&stream);
        }
    }

    /// The smallest key held for `stream` within `from..=to`.
    #[inline(always)]
    pub fn first_in(&self, stream: StreamKey, from: HeldKey, to: HeldKey) -> Option<HeldKey> {
        let recent = self
            .recent
            .filter(|&(s, k)| s == stream && from <= k && k <= to)
            .map(|(_, k)| k);
        if self.in_sets == 0 {
            return recent;
        }
        let in_set = self.first_in_set(stream, from, to);
        match (recent, in_set) {
            (Some(r), Some(k)) => Some(r.min(k)),
            (r, k) => r.or(k),
        }
    }

    #[inline(never)]
    fn first_in_set(&self, stream: StreamKey, from: HeldKey, to: HeldKey) -> Option<HeldKey> {
        self.sets.get(&stream)?.range(from..=to).next().copied()
    }

    /// Whether `key` is held for `stream`.
    pub fn contains(&self, stream: StreamKey, key: HeldKey) -> bool {
        self.recent == Some((stream, key))
            || self.sets.get(&stream).is_some_and(|set| set.contains(&key))
    }

    /// Keys held, for every stream.
    pub fn len(&self) -> usize {
        self.in_sets + self.recent.is_some() as usize
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        self.recent = None;
        self.sets.clear();
        self.in_sets = 0;
    }

    /// Streams with a set, empty or not (tests).
    #[cfg(test)]
    fn sets(&self) -> usize {
        self.sets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain sets by stream that `HeldSets` answers as.
    #[derive(Default)]
    struct Model(HashMap<StreamKey, BTreeSet<HeldKey>>);

    impl Model {
        fn first_in(&self, stream: StreamKey, from: HeldKey, to: HeldKey) -> Option<HeldKey> {
            self.0.get(&stream)?.range(from..=to).next().copied()
        }
        fn len(&self) -> usize {
            self.0.values().map(BTreeSet::len).sum()
        }
    }

    #[test]
    fn the_recent_key_is_found_beside_the_sets_and_forgotten_once_removed() {
        let mut h = HeldSets::default();
        let all = ((false, 0, 0), (true, u64::MAX, u32::MAX));
        h.insert(1, (false, 4096, 7));
        assert_eq!(h.first_in(1, all.0, all.1), Some((false, 4096, 7)));
        assert_eq!(h.first_in(2, all.0, all.1), None, "another stream's");
        assert_eq!(h.first_in(1, (false, 8192, 0), all.1), None, "too small");
        // A second insert moves the first into its set; the smaller of both is found.
        h.insert(1, (false, 8192, 3));
        assert_eq!(h.first_in(1, all.0, all.1), Some((false, 4096, 7)));
        h.remove(1, (false, 4096, 7));
        assert_eq!(h.first_in(1, all.0, all.1), Some((false, 8192, 3)));
        h.remove(1, (false, 8192, 3));
        assert_eq!(h.first_in(1, all.0, all.1), None, "removed from recent");
        assert!(h.is_empty());
        // Removing a key not held changes nothing.
        h.insert(1, (false, 512, 1));
        h.remove(1, (false, 512, 2));
        h.remove(2, (false, 512, 1));
        assert!(h.contains(1, (false, 512, 1)));
        assert_eq!(h.len(), 1);
        h.clear();
        assert!(h.is_empty() && h.first_in(1, all.0, all.1).is_none());
    }

    #[test]
    fn answers_as_sets_by_stream() {
        let mut h = HeldSets::default();
        let mut model = Model::default();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // Up to 40 streams (more than the emptied sets kept), 400 handles, few sizes: ties
        // in size break by handle.
        let mut held: Vec<Option<(StreamKey, HeldKey)>> = vec![None; 400];
        for step in 0..200_000 {
            let idx = (next() % 400) as u32;
            match held[idx as usize] {
                // Most held blocks are taken back soon: the recent key's own case.
                Some((s, k)) if next() % 4 != 0 => {
                    h.remove(s, k);
                    model.0.get_mut(&s).unwrap().remove(&k);
                    held[idx as usize] = None;
                }
                Some(_) => {}
                None => {
                    let s = next() % 40;
                    let k = (next() % 2 == 0, (next() % 8 + 1) * 512, idx);
                    h.insert(s, k);
                    model.0.entry(s).or_default().insert(k);
                    held[idx as usize] = Some((s, k));
                }
            }
            let s = next() % 41;
            let large = next() % 2 == 0;
            let from = (large, (next() % 9) * 512, 0);
            let to = (large, u64::MAX, u32::MAX);
            assert_eq!(
                h.first_in(s, from, to),
                model.first_in(s, from, to),
                "step {step}"
            );
            assert_eq!(h.len(), model.len(), "step {step}");
        }
        for (s, k) in held.iter().flatten() {
            assert!(h.contains(*s, *k));
        }
        assert!(h.sets() <= 40);
    }
}
