//! Workloads: the allocation requests of a program, as a stream the pool and the policies it is
//! compared with (`crate::policies`) replay. Three generators, seeded and deterministic —
//! `training` (GPT-2 small), `inference` (serving with growing KV caches), `random` (RMM's
//! `random_allocations`) — and `from_records`, which takes the requests out of any trace
//! recorded with `GPUPOOL_TRACE`. `record` turns a generated stream into such a trace, so the
//! `gpupool-trace` tools read both alike.

pub mod inference;
pub mod random;
pub mod record;
pub use gpupool::rng;
pub mod training;

use std::collections::HashMap;

use gpupool::pool::size::usable_limit;
use gpupool::pool::trace::{Kind as RecordKind, Record};
use gpupool::pool::{Addr, CudaError, ReuseWait};

/// One step of the program, as the allocator sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// The program asks for `size` bytes; the block is called `slot` until it is freed (slots
    /// are dense and reused, so a replay keeps its addresses in a vector).
    Alloc { slot: u32, size: u64 },
    /// The program frees `slot`'s block; `need` is what the recording pool made its reuse wait
    /// for (`ReuseWait::Nothing` in generated workloads: stream-ordered, as PyTorch's allocator
    /// assumes). Only our pool looks at it, as it does at `how`.
    Free {
        slot: u32,
        need: ReuseWait,
        how: FreeHow,
    },
    /// The program synchronized: blocks freed before these fence and barrier sequence numbers
    /// are safe to reuse (recorded traces only; only our pool looks at it).
    Observe { fenced: u64, barriered: u64 },
    /// A synchronization at which a release threshold applies (recorded traces only).
    SyncPoint,
    /// A request of `size` bytes that failed out of memory in the recorded run (recorded traces
    /// only). The program never held it: a policy that serves it frees it at once, so it
    /// changes later requests only as serving and freeing it does.
    RecordedOom { size: u64 },
}

/// How a recorded free was made, for a comparison in another reuse mode (`need_for`): the
/// trace's code (0 `cudaFree`, 1 `cudaFreeAsync` on a blocking stream, 2 on a non-blocking
/// one) and whether the program had made work no barrier orders by then (a non-blocking stream,
/// a context of its own: trace kind 14). Generated workloads: the default (`cudaFree`, none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreeHow {
    pub code: u8,
    pub beyond_barriers: bool,
}

/// A request stream and what comes with it.
#[derive(Clone, Debug)]
pub struct Workload {
    pub name: String,
    pub ops: Vec<Op>,
    /// How many slots the stream uses (one more than the highest).
    pub slots: u32,
    /// The device capacity the workload is defined with (RMM's 16 GiB), or the limit
    /// (`GPUPOOL_LIMIT`) a recorded trace was made under, if any.
    pub capacity: Option<u64>,
}

impl Workload {
    /// Allocation requests in the stream, those that failed in the recorded run included.
    pub fn requests(&self) -> u64 {
        self.ops
            .iter()
            .filter(|o| matches!(o, Op::Alloc { .. } | Op::RecordedOom { .. }))
            .count() as u64
    }

    /// Requests that failed out of memory in the recorded run (`Op::RecordedOom`).
    pub fn recorded_ooms(&self) -> u64 {
        self.ops
            .iter()
            .filter(|o| matches!(o, Op::RecordedOom { .. }))
            .count() as u64
    }

    /// The most bytes the program held at once, as requested (no rounding). Requests that
    /// failed in the recorded run do not count: the program never held them.
    pub fn peak_requested(&self) -> u64 {
        self.requested_over_time()
            .map(|(_, bytes)| bytes)
            .max()
            .unwrap_or(0)
    }

    /// (index of the operation, bytes the program holds after it) for every allocation and
    /// free. Saturating: a trace's sizes may be absurd (corrupt, or hand-written).
    pub fn requested_over_time(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        let mut sizes = vec![0u64; self.slots as usize];
        let mut cur = 0u64;
        self.ops.iter().enumerate().filter_map(move |(i, op)| {
            match *op {
                Op::Alloc { slot, size } => {
                    sizes[slot as usize] = size;
                    cur = cur.saturating_add(size);
                }
                Op::Free { slot, .. } => {
                    cur = cur.saturating_sub(std::mem::take(&mut sizes[slot as usize]));
                }
                _ => return None,
            }
            Some((i, cur))
        })
    }
}

/// A block a generator holds; freeing it consumes it, so a generator cannot free twice.
#[derive(Debug)]
#[must_use = "a block must be freed or kept"]
pub struct Block {
    slot: u32,
    pub size: u64,
}

/// What generators write their programs against.
pub struct Program {
    ops: Vec<Op>,
    vacant: Vec<u32>,
    slots: u32,
}

impl Program {
    pub fn new() -> Program {
        Program {
            ops: Vec::new(),
            vacant: Vec::new(),
            slots: 0,
        }
    }

    pub fn alloc(&mut self, size: u64) -> Block {
        let slot = self.vacant.pop().unwrap_or_else(|| {
            self.slots += 1;
            self.slots - 1
        });
        self.ops.push(Op::Alloc { slot, size });
        Block { slot, size }
    }

    pub fn free(&mut self, b: Block) {
        self.free_after(b, ReuseWait::Nothing);
    }

    /// Free `b`, recording that its reuse waited for `need` (recorded traces).
    pub fn free_after(&mut self, b: Block, need: ReuseWait) {
        self.free_recorded(b, need, FreeHow::default());
    }

    /// Free `b` as a trace recorded it: its reuse waited for `need`, and it was made `how`.
    pub fn free_recorded(&mut self, b: Block, need: ReuseWait, how: FreeHow) {
        self.ops.push(Op::Free {
            slot: b.slot,
            need,
            how,
        });
        self.vacant.push(b.slot);
    }

    pub fn free_all(&mut self, blocks: impl IntoIterator<Item = Block>) {
        for b in blocks {
            self.free(b);
        }
    }

    pub fn finish(self, name: String, capacity: Option<u64>) -> Workload {
        Workload {
            name,
            ops: self.ops,
            slots: self.slots,
            capacity,
        }
    }
}

impl Default for Program {
    fn default() -> Self {
        Program::new()
    }
}

/// The generated workloads, by name.
/// The largest counts a workload takes (`Kind::parse`).
pub const MAX_TRAINING_STEPS: u64 = 10_000;
pub const MAX_INFERENCE_REQUESTS: u64 = 10_000;
pub const MAX_RANDOM_OPS: u64 = 10_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `steps` training steps of GPT-2 small.
    Training { steps: u32 },
    /// `requests` inference requests.
    Inference { requests: u32 },
    /// RMM's random allocations: `ops` operations, sizes uniform in 1..=`max_size`.
    Random { max_size: u64, ops: u64 },
}

impl Kind {
    /// A workload by name: `training[:STEPS]` (default 6), `inference[:REQUESTS]` (200),
    /// `random[:MAX_SIZE[:OPS]]` (64MiB, 10000). `None` when `spec` names none of them; an error
    /// when it does with a bad parameter.
    pub fn parse(spec: &str) -> Option<Result<Kind, String>> {
        let mut parts = spec.split(':');
        let name = parts.next().unwrap_or("");
        let params: Vec<&str> = parts.collect();
        // Counts up to `most`: a workload is generated in memory (measured: an inference
        // request takes about 270 KB and makes 170 KB of trace, a training step 70 KB of trace,
        // a random operation 80 bytes): the bounds keep it to a few GiB.
        let count = |v: Option<&&str>, default: u64, most: u64| -> Result<u64, String> {
            match v {
                None => Ok(default),
                Some(v) => v
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n > 0 && n <= most)
                    .ok_or_else(|| format!("bad count {v:?} in {spec:?} (1 to {most})")),
            }
        };
        let max = |n: usize| -> Result<(), String> {
            if params.len() > n {
                Err(format!("too many parameters in {spec:?}"))
            } else {
                Ok(())
            }
        };
        Some(match name {
            "training" => max(1)
                .and_then(|()| count(params.first(), 6, MAX_TRAINING_STEPS))
                .map(|n| Kind::Training { steps: n as u32 }),
            "inference" => max(1)
                .and_then(|()| count(params.first(), 200, MAX_INFERENCE_REQUESTS))
                .map(|n| Kind::Inference { requests: n as u32 }),
            "random" => max(2).and_then(|()| {
                let max_size = match params.first() {
                    None => 64 << 20,
                    Some(v) => gpupool::config::parse_bytes(v.as_bytes())
                        .filter(|&b| b > 0 && b <= 1 << 40)
                        .ok_or_else(|| format!("bad size {v:?} in {spec:?}"))?,
                };
                let ops = count(params.get(1), 10_000, MAX_RANDOM_OPS)?;
                Ok(Kind::Random { max_size, ops })
            }),
            _ => return None,
        })
    }

    pub fn generate(self, seed: u64) -> Workload {
        match self {
            Kind::Training { steps } => training::generate(seed, steps),
            Kind::Inference { requests } => inference::generate(seed, requests),
            Kind::Random { max_size, ops } => random::generate(seed, max_size, ops),
        }
    }
}

/// The request streams of a recorded trace, one per device (in device order). A request the
/// live run failed out of memory becomes an `Op::RecordedOom` at its place; one refused with
/// another error (no device, an injected fault) is left out, as no policy would change it.
/// Frees of unknown addresses are ignored; a device reset frees every live block. A limit the
/// trace recorded (`GPUPOOL_LIMIT`) is the workload's capacity.
pub fn from_records(records: &[Record], name: &str) -> Vec<(u8, Workload)> {
    struct Dev {
        p: Program,
        live: HashMap<Addr, Block>,
        beyond_barriers: bool,
        limit: Option<u64>,
    }
    let mut devs: Vec<Option<Dev>> = (0..256).map(|_| None).collect();
    for r in records {
        let d = devs[usize::from(r.device)].get_or_insert_with(|| Dev {
            p: Program::new(),
            live: HashMap::new(),
            beyond_barriers: false,
            limit: None,
        });
        match r.kind {
            RecordKind::Alloc => {
                let b = d.p.alloc(r.a);
                if let Some(old) = d.live.insert(r.b, b) {
                    // An address handed out twice without a free between: a corrupt trace.
                    d.p.free(old);
                }
            }
            RecordKind::AllocFailed if r.b == CudaError::MEMORY_ALLOCATION.0 as u64 => {
                d.p.ops.push(Op::RecordedOom { size: r.a })
            }
            RecordKind::Free => {
                if let Some(b) = d.live.remove(&r.a) {
                    let how = FreeHow {
                        code: (r.aux & 3) as u8,
                        beyond_barriers: d.beyond_barriers,
                    };
                    d.p.free_recorded(b, ReuseWait::from_code(r.b), how);
                }
            }
            RecordKind::Observe => d.p.ops.push(Op::Observe {
                fenced: r.a,
                barriered: r.b,
            }),
            RecordKind::SyncPoint => d.p.ops.push(Op::SyncPoint),
            RecordKind::BeyondBarriers => d.beyond_barriers = true,
            RecordKind::Limit => d.limit = Some(usable_limit(r.a)).filter(|&l| l != u64::MAX),
            RecordKind::Reset => {
                let mut live: Vec<(Addr, Block)> = d.live.drain().collect();
                live.sort_by_key(|e| e.0);
                d.p.free_all(live.into_iter().map(|e| e.1));
            }
            _ => {}
        }
    }
    devs.into_iter()
        .enumerate()
        .filter_map(|(i, d)| {
            let d = d?;
            let dev = i as u8;
            Some((dev, d.p.finish(format!("{name} (device {dev})"), d.limit)))
        })
        .collect()
}

/// Binary units for sizes in generators.
pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    /// A recorded free keeps how it was made, and whether a non-blocking stream existed by
    /// then, for a comparison in another reuse mode.
    #[test]
    fn recorded_frees_keep_how_they_were_made() {
        let rec = |kind, a, b, c, aux| Record {
            t_ns: 0,
            a,
            b,
            c,
            thread: 1,
            kind,
            device: 0,
            aux,
        };
        let records = [
            rec(RecordKind::Alloc, 512, 0x1000, 512, 0),
            rec(RecordKind::Alloc, 512, 0x2000, 512, 0),
            rec(RecordKind::Free, 0x1000, 1, 512, 1 | 3 << 2),
            rec(RecordKind::BeyondBarriers, 0, 0, 0, 0),
            rec(RecordKind::Free, 0x2000, 2, 512, 0),
        ];
        let w = &from_records(&records, "t")[0].1;
        let frees: Vec<(ReuseWait, FreeHow)> = w
            .ops
            .iter()
            .filter_map(|o| match *o {
                Op::Free { need, how, .. } => Some((need, how)),
                _ => None,
            })
            .collect();
        let how = |code, beyond_barriers| FreeHow {
            code,
            beyond_barriers,
        };
        assert_eq!(
            frees,
            [
                (ReuseWait::Barrier, how(1, false)),
                (ReuseWait::Fence, how(0, true))
            ]
        );
    }

    /// A request the recorded run failed out of memory stays in the workload, at its place,
    /// without counting as held; one refused with another error is left out; the limit the
    /// trace recorded is the workload's capacity.
    #[test]
    fn recorded_out_of_memory_failures_are_kept_where_they_happened() {
        let rec = |kind, a, b| Record {
            t_ns: 0,
            a,
            b,
            c: 0,
            thread: 1,
            kind,
            device: 0,
            aux: 0,
        };
        let no_device = 100;
        let records = [
            rec(RecordKind::Settings, u64::MAX, 256 << 20),
            rec(RecordKind::Limit, GIB + 100, 0),
            rec(RecordKind::Alloc, 600 * MIB, 0x1000),
            rec(RecordKind::AllocFailed, 700 * MIB, 2),
            rec(RecordKind::AllocFailed, MIB, no_device),
            rec(RecordKind::Free, 0x1000, 0),
        ];
        let w = &from_records(&records, "t")[0].1;
        assert_eq!(
            &w.ops[..2],
            [
                Op::Alloc {
                    slot: 0,
                    size: 600 * MIB
                },
                Op::RecordedOom { size: 700 * MIB }
            ]
        );
        assert!(matches!(w.ops[2], Op::Free { slot: 0, .. }), "{:?}", w.ops);
        assert_eq!(w.ops.len(), 3);
        assert_eq!((w.requests(), w.recorded_ooms()), (2, 1));
        // The program held 600 MiB at most, never the 1.3 GiB it asked for.
        assert_eq!(w.peak_requested(), 600 * MIB);
        assert_eq!(w.capacity, Some(GIB));
    }

    #[test]
    fn kinds_parse() {
        assert_eq!(
            Kind::parse("training"),
            Some(Ok(Kind::Training { steps: 6 }))
        );
        assert_eq!(
            Kind::parse("inference:7"),
            Some(Ok(Kind::Inference { requests: 7 }))
        );
        assert_eq!(
            Kind::parse("random:1GiB:100000"),
            Some(Ok(Kind::Random {
                max_size: GIB,
                ops: 100_000
            }))
        );
        assert_eq!(Kind::parse("trace.bin"), None);
        for bad in [
            "training:0",
            "training:x",
            "random:0",
            "random:1MiB:5:6",
            "inference:1:2",
        ] {
            assert!(matches!(Kind::parse(bad), Some(Err(_))), "{bad}");
        }
    }

    #[test]
    fn program_reuses_slots_and_counts_peaks() {
        let mut p = Program::new();
        let a = p.alloc(100);
        let b = p.alloc(50);
        p.free(a);
        let c = p.alloc(10);
        p.free_all([b, c]);
        let w = p.finish("t".into(), None);
        assert_eq!(w.slots, 2);
        assert_eq!(w.requests(), 3);
        assert_eq!(w.peak_requested(), 150);
        assert_eq!(w.ops[3], Op::Alloc { slot: 0, size: 10 });
    }

    #[test]
    fn generated_workloads_are_deterministic() {
        for k in [
            Kind::Training { steps: 2 },
            Kind::Inference { requests: 10 },
            Kind::Random {
                max_size: MIB,
                ops: 2000,
            },
        ] {
            let a = k.generate(3);
            assert_eq!(a.ops, k.generate(3).ops, "{k:?}");
            assert!(a.requests() > 100, "{k:?}");
            // Every block is freed by the end.
            let allocs = a.requests() as usize;
            let frees = a
                .ops
                .iter()
                .filter(|o| matches!(o, Op::Free { .. }))
                .count();
            assert_eq!(allocs, frees, "{k:?}");
        }
        let r = Kind::Random {
            max_size: MIB,
            ops: 2000,
        };
        assert_ne!(r.generate(1).ops, r.generate(2).ops);
    }
}
