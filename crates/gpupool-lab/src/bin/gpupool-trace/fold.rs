//! Allocated and reserved bytes over time: the one fold of a trace's records that `stats`,
//! `perfetto` and `plot` share.
//!
//! A trace holds the pool's decisions, not its counters; a device's allocated bytes are the sum
//! of the blocks it handed out and has not taken back, and its reserved bytes the sum of the
//! segments it holds from the driver and the granules it has mapped. Records of one device are in the order the pool applied
//! them, so folding them in file order gives the counters after every record.

use gpupool::pool::trace::{Kind, Record};

/// One device's counters after the records folded so far. Arithmetic saturates: a corrupt trace
/// gives odd figures, never an overflow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fold {
    pub records: u64,
    pub allocs: u64,
    pub frees: u64,
    pub failed: u64,
    pub segments: u64,
    pub segment_frees: u64,
    pub fences: u64,
    pub barriers: u64,
    pub resets: u64,
    /// Bytes in blocks handed to the program and not given back.
    pub allocated: u64,
    /// Bytes in segments held from the driver, and mapped granules of expandable segments.
    pub reserved: u64,
    /// Granules mapped and unmapped.
    pub maps: u64,
    pub unmaps: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// When each peak was first reached.
    pub peak_allocated_ns: u64,
    pub peak_reserved_ns: u64,
    /// The time of the latest record, never decreasing (a record stamped earlier than the one
    /// before it, which only a corrupt trace holds, counts as simultaneous with it).
    pub t_ns: u64,
}

/// Which counters a record changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Change {
    pub allocated: bool,
    pub reserved: bool,
}

impl Fold {
    /// Folds in the next record of this device and says which counters it changed.
    pub fn apply(&mut self, r: &Record) -> Change {
        let before = (self.allocated, self.reserved);
        self.records += 1;
        self.t_ns = self.t_ns.max(r.t_ns);
        match r.kind {
            Kind::Alloc => {
                self.allocs += 1;
                self.allocated = self.allocated.saturating_add(r.c);
            }
            Kind::AllocFailed => self.failed += 1,
            Kind::Free => {
                self.frees += 1;
                self.allocated = self.allocated.saturating_sub(r.c);
            }
            Kind::SegmentAlloc => {
                self.segments += 1;
                self.reserved = self.reserved.saturating_add(r.b);
            }
            Kind::SegmentFree => {
                self.segment_frees += 1;
                self.reserved = self.reserved.saturating_sub(r.b);
            }
            Kind::Map => {
                self.maps += 1;
                self.reserved = self.reserved.saturating_add(r.b);
            }
            Kind::Unmap => {
                self.unmaps += 1;
                self.reserved = self.reserved.saturating_sub(r.b);
            }
            Kind::Fence => self.fences += 1,
            Kind::Barrier => self.barriers += 1,
            Kind::Reset => {
                self.resets += 1;
                self.allocated = 0;
                self.reserved = 0;
            }
            _ => {}
        }
        if self.allocated > self.peak_allocated {
            self.peak_allocated = self.allocated;
            self.peak_allocated_ns = self.t_ns;
        }
        if self.reserved > self.peak_reserved {
            self.peak_reserved = self.reserved;
            self.peak_reserved_ns = self.t_ns;
        }
        Change {
            allocated: self.allocated != before.0,
            reserved: self.reserved != before.1,
        }
    }
}

/// One device's counters after all its records.
pub fn fold(records: &[Record], device: u8) -> Fold {
    let mut f = Fold::default();
    for r in records.iter().filter(|r| r.device == device) {
        f.apply(r);
    }
    f
}

/// The devices the trace holds records of, in order.
pub fn devices(records: &[Record]) -> Vec<u8> {
    let mut seen = [false; 256];
    for r in records {
        seen[usize::from(r.device)] = true;
    }
    (0..=255u8).filter(|&d| seen[usize::from(d)]).collect()
}

/// A device's counters at one moment: after a record that changed one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub t_ns: u64,
    pub allocated: u64,
    pub reserved: u64,
}

/// A device's counters over time: a sample at its first record (zero, or what that record made
/// them) and one after every record that changed them; the device's whole fold besides.
pub fn series(records: &[Record], device: u8) -> (Vec<Sample>, Fold) {
    let mut f = Fold::default();
    let mut samples = Vec::new();
    for r in records.iter().filter(|r| r.device == device) {
        let changed = f.apply(r);
        if samples.is_empty() || changed.allocated || changed.reserved {
            samples.push(Sample {
                t_ns: f.t_ns,
                allocated: f.allocated,
                reserved: f.reserved,
            });
        }
    }
    (samples, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn rec(t_ns: u64, kind: Kind, a: u64, b: u64, c: u64) -> Record {
        Record {
            t_ns,
            a,
            b,
            c,
            thread: 1,
            kind,
            device: 0,
            aux: 0,
        }
    }

    #[test]
    fn folds_counters_and_peaks() {
        let rs = [
            rec(10, Kind::Settings, 0, 0, 0),
            rec(20, Kind::SegmentAlloc, 0x1000, 2 << 20, 0),
            rec(30, Kind::Alloc, 512, 0x1000, 512),
            rec(40, Kind::Alloc, 1000, 0x1200, 1024),
            rec(35, Kind::Free, 0x1000, 0, 512), // stamped early: counts as t=40
            rec(50, Kind::SegmentFree, 0x1000, 2 << 20, 0),
            // Granules mapped count as reserved until unmapped.
            rec(52, Kind::RangeReserved, 1 << 40, 1 << 30, 0),
            rec(53, Kind::Map, 1 << 40, 2 << 20, 0),
            rec(54, Kind::Map, (1 << 40) + (2 << 20), 2 << 20, 0),
            rec(55, Kind::Unmap, 1 << 40, 2 << 20, 0),
            rec(56, Kind::Unmap, (1 << 40) + (2 << 20), 2 << 20, 0),
            rec(60, Kind::Reset, 0, 0, 0),
        ];
        let (samples, f) = series(&rs, 0);
        assert_eq!(f.peak_allocated, 1536);
        assert_eq!(f.peak_allocated_ns, 40);
        assert_eq!(f.peak_reserved, 4 << 20);
        assert_eq!(f.peak_reserved_ns, 54);
        assert_eq!((f.maps, f.unmaps), (2, 2));
        assert_eq!((f.allocated, f.reserved, f.t_ns), (0, 0, 60));
        let ts: Vec<u64> = samples.iter().map(|s| s.t_ns).collect();
        assert_eq!(ts, [10, 20, 30, 40, 40, 50, 53, 54, 55, 56, 60]);
        assert_eq!(fold(&rs, 0), f);
        assert_eq!(fold(&rs, 1), Fold::default());
    }

    #[test]
    fn corrupt_sizes_saturate() {
        let rs = [
            rec(1, Kind::Alloc, 0, 0, u64::MAX),
            rec(2, Kind::Alloc, 0, 0, u64::MAX),
            rec(3, Kind::Free, 0, 0, 5),
        ];
        let f = fold(&rs, 0);
        assert_eq!(f.peak_allocated, u64::MAX);
        assert_eq!(f.allocated, u64::MAX - 5);
    }
}
