//! A first-in, first-out queue of small `Copy` items: the queues of freed blocks waiting for a
//! fence or a barrier. Every free in `strict` and `barrier` mode pushes to one and every block
//! that becomes reusable is popped from one, so both are on the hit path: a ring whose capacity
//! is a power of two, with only the growth out of line (the standard `VecDeque`'s push was a
//! call of 26 instructions there).

/// Invariant: `buf.len()` is zero or a power of two, and at least `len`; `head` is below
/// `buf.len()` whenever `len` is not zero. The ring's indexing relies on it to skip bounds
/// checks.
pub struct Fifo<T: Copy> {
    buf: Vec<T>,
    /// Index of the first item in `buf`.
    head: usize,
    len: usize,
}

impl<T: Copy> Default for Fifo<T> {
    fn default() -> Self {
        Fifo {
            buf: Vec::new(),
            head: 0,
            len: 0,
        }
    }
}

impl<T: Copy> Fifo<T> {
    #[inline(always)]
    fn mask(&self) -> usize {
        self.buf.len().wrapping_sub(1)
    }

    /// The item at `i`, an index masked with `mask()` of a ring that is not empty.
    #[inline(always)]
    fn at(&self, i: usize) -> T {
        debug_assert!(i < self.buf.len());
        // SAFETY: callers pass `head` of a ring holding items, or an index masked with
        // `buf.len() - 1` while `buf` is not empty; `buf.len()` is a power of two: in bounds
        // (the struct's invariant).
        unsafe { *self.buf.get_unchecked(i) }
    }

    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline(always)]
    pub fn push_back(&mut self, item: T) {
        if self.len == self.buf.len() {
            self.grow(item);
        }
        let at = (self.head + self.len) & self.mask();
        debug_assert!(at < self.buf.len());
        // SAFETY: `buf` holds more slots than items after the check above, so it is not empty,
        // and its length is a power of two: the masked index is in bounds.
        unsafe { *self.buf.get_unchecked_mut(at) = item };
        self.len += 1;
    }

    /// Double the ring (`item` fills the new slots; they are not read before being written).
    #[cold]
    #[inline(never)]
    fn grow(&mut self, item: T) {
        let cap = (2 * self.buf.len()).max(16);
        let mut buf = Vec::with_capacity(cap);
        buf.extend(self.iter());
        buf.resize(cap, item);
        self.buf = buf;
        self.head = 0;
    }

    #[inline(always)]
    pub fn front(&self) -> Option<&T> {
        if self.len == 0 {
            None
        } else {
            debug_assert!(self.head < self.buf.len());
            // SAFETY: the ring holds items, so `head` is in bounds (the struct's invariant).
            Some(unsafe { self.buf.get_unchecked(self.head) })
        }
    }

    #[inline(always)]
    pub fn pop_front(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let item = self.at(self.head);
        self.head = (self.head + 1) & self.mask();
        self.len -= 1;
        Some(item)
    }

    /// Pop items from the front for as long as `take` accepts them: `take` sees each front item
    /// and returns false to leave it in place and stop. The items are walked as the ring's (at
    /// most two) runs of consecutive slots, each a plain slice: a pointer and its end in
    /// registers over the loop (a fence drains its whole budget this way, block by block).
    #[inline(always)]
    pub fn pop_while(&mut self, mut take: impl FnMut(T) -> bool) {
        while self.len > 0 {
            // The items from `head` up to the end of the ring's storage, or of the items.
            let run = self.len.min(self.buf.len() - self.head);
            let items = &self.buf[self.head..self.head + run];
            // What is taken is counted from the pointer's place at the end, not by a counter
            // kept over the loop: one register and one instruction less for each item.
            let mut rest = items.iter();
            while rest.as_slice().first().is_some_and(|&item| take(item)) {
                rest.next();
            }
            let taken = run - rest.len();
            self.head = (self.head + taken) & self.mask();
            self.len -= taken;
            if taken < run {
                break;
            }
        }
    }

    /// The items, first to last.
    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        let mask = self.mask();
        (0..self.len).map(move |i| self.buf[(self.head + i) & mask])
    }

    /// Keep only the items `keep` accepts, in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let mask = self.mask();
        let mut kept = 0;
        for i in 0..self.len {
            let item = self.buf[(self.head + i) & mask];
            if keep(&item) {
                self.buf[(self.head + kept) & mask] = item;
                kept += 1;
            }
        }
        self.len = kept;
    }

    pub fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Pushes, pops (one at a time and `pop_while`), retains and clears agree with
    /// `VecDeque`'s, across growth and wrap-around.
    #[test]
    fn agrees_with_vec_deque() {
        let mut ours = Fifo::default();
        let mut std = VecDeque::new();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for step in 0..50_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            match seed % 100 {
                0 => {
                    ours.retain(|&(_, s): &(u32, u64)| s % 3 != 0);
                    std.retain(|&(_, s): &(u32, u64)| s % 3 != 0);
                }
                1 if step % 7 == 0 => {
                    ours.clear();
                    std.clear();
                }
                2..=42 => assert_eq!(ours.pop_front(), std.pop_front()),
                // Pops a few, across the ring's wrap-around when it has one; each item `take`
                // sees is the front's, and the one refused stays.
                43..=45 => {
                    let n = (seed >> 32) % 12;
                    let mut seen = Vec::new();
                    ours.pop_while(|item| {
                        if seen.len() as u64 == n {
                            return false;
                        }
                        seen.push(item);
                        true
                    });
                    let theirs: Vec<_> = (0..n).map_while(|_| std.pop_front()).collect();
                    assert_eq!(seen, theirs);
                }
                _ => {
                    ours.push_back((step as u32, step));
                    std.push_back((step as u32, step));
                }
            }
            assert_eq!(ours.len(), std.len());
            assert_eq!(ours.front(), std.front());
            if step % 501 == 0 {
                assert!(ours.iter().eq(std.iter().copied()));
            }
        }
    }
}
