//! The bitmap of an expandable segment's mapped granules, and of those left unready
//! (docs/design-notes.md, "Note: expandable segments"): counts and searches a word of 64
//! granules at a time.

/// The mapped granules of an expandable segment.
#[derive(Clone, Debug)]
pub(super) struct Granules {
    /// Bit `k` set: granule `k` of the range is mapped.
    bits: Vec<u64>,
    /// Bytes mapped.
    pub(super) mapped: u64,
    /// Mapped granules no block may use as they are: a refused mapping left them, and the unmap
    /// that would have undone it was refused too. The device may lack access to one (its
    /// `cuMemSetAccess` was refused), and its peers do (they are granted a block's granules
    /// once all are mapped). Counted as mapped, since the driver holds their memory; `map_block`
    /// unmaps one and maps it afresh before a block uses it, a release unmaps one like any free
    /// granule. Few, and mostly none.
    unready: Vec<u64>,
}

impl Granules {
    pub(super) fn new(count: u64) -> Granules {
        Granules {
            bits: vec![0; count.div_ceil(64) as usize],
            mapped: 0,
            unready: Vec::new(),
        }
    }

    pub(super) fn is_mapped(&self, k: u64) -> bool {
        self.bits[(k / 64) as usize] & (1 << (k % 64)) != 0
    }

    /// Whether granule `k` is mapped but not ready for a block (`unready`).
    pub(super) fn is_unready(&self, k: u64) -> bool {
        !self.unready.is_empty() && self.unready.contains(&k)
    }

    /// The granules mapped but not ready for a block.
    pub(super) fn unready(&self) -> &[u64] {
        &self.unready
    }

    /// Granule `k` is mapped and counted, but not ready for a block.
    pub(super) fn left_mapped(&mut self, k: u64, g: u64) {
        self.set(k, true);
        self.mapped += g;
        self.unready.push(k);
    }

    /// Granule `k` was unmapped.
    pub(super) fn unmapped(&mut self, k: u64, g: u64) {
        self.set(k, false);
        self.mapped -= g;
        self.unready.retain(|&u| u != k);
    }

    pub(super) fn set(&mut self, k: u64, mapped: bool) {
        let (w, bit) = ((k / 64) as usize, 1 << (k % 64));
        if mapped {
            self.bits[w] |= bit;
        } else {
            self.bits[w] &= !bit;
        }
    }

    /// Granules marked mapped.
    pub(super) fn count(&self) -> u64 {
        self.bits.iter().map(|w| w.count_ones() as u64).sum()
    }

    /// The first granule from `k` on, before `end`, that is mapped (if `mapped`) or not;
    /// `end` if none. Skips a word of 64 granules at a time.
    pub(super) fn next_with(&self, mut k: u64, end: u64, mapped: bool) -> u64 {
        while k < end {
            let (w, bit) = ((k / 64) as usize, k % 64);
            let word = if mapped { self.bits[w] } else { !self.bits[w] } >> bit;
            if word != 0 {
                return (k + word.trailing_zeros() as u64).min(end);
            }
            k += 64 - bit;
        }
        end
    }

    /// The granules marked mapped among `[first, end)`, lowest first.
    pub(super) fn mapped_between(&self, first: u64, end: u64) -> impl Iterator<Item = u64> + '_ {
        std::iter::successors(Some(self.next_with(first, end, true)), move |&k| {
            Some(self.next_with(k + 1, end, true))
        })
        .take_while(move |&k| k < end)
    }

    /// Granules marked mapped among `[first, end)`.
    pub(super) fn count_between(&self, first: u64, end: u64) -> u64 {
        let mut n = 0;
        let mut k = first;
        while k < end {
            let (w, bit) = ((k / 64) as usize, k % 64);
            let span = (64 - bit).min(end - k);
            let mask = if span == 64 {
                u64::MAX
            } else {
                ((1u64 << span) - 1) << bit
            };
            n += (self.bits[w] & mask).count_ones() as u64;
            k += span;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::Granules;

    /// The bitmap's counts and searches against a plain scan, across word boundaries.
    #[test]
    fn granule_counts_and_searches_agree_with_a_scan() {
        let mut g = Granules::new(200);
        for k in [0, 1, 63, 64, 65, 127, 128, 150, 151, 152, 199] {
            g.set(k, true);
        }
        let scan = |first: u64, end: u64| (first..end).filter(|&k| g.is_mapped(k)).count() as u64;
        let next =
            |k: u64, end: u64, m: bool| (k..end).find(|&i| g.is_mapped(i) == m).unwrap_or(end);
        for first in 0..=200 {
            for end in first..=200 {
                assert_eq!(
                    g.count_between(first, end),
                    scan(first, end),
                    "{first}..{end}"
                );
                assert_eq!(
                    g.mapped_between(first, end).collect::<Vec<_>>(),
                    (first..end).filter(|&k| g.is_mapped(k)).collect::<Vec<_>>(),
                    "{first}..{end}"
                );
                for m in [true, false] {
                    assert_eq!(
                        g.next_with(first, end, m),
                        next(first, end, m),
                        "{first}..{end} {m}"
                    );
                }
            }
        }
        assert_eq!(g.count(), 11);
        // A block inside one granule holds none wholly: its first is past its end.
        assert_eq!(g.mapped_between(1, 0).count(), 0);
    }
}
