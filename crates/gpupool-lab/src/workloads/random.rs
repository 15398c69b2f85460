//! RMM's `random_allocations` benchmark pattern (rapidsai/rmm,
//! `benchmarks/random_allocations`), rewritten from its description: `2 × ops` iterations; each
//! draws a size uniform in `1..=max_size` and allocates with probability 73% — unless nothing is
//! live (then always), `ops` allocations were made already, or the live bytes plus this one
//! would reach the 16 GiB cap (then it frees instead); a free takes a live allocation chosen
//! uniformly. Everything still live is freed at the end. RMM erases the chosen element from its
//! vector; this takes it out by swapping with the last, which picks allocations with the same
//! uniform odds without a quadratic cost at 100 000 operations.

use super::rng::Rng;
use super::{Block, Program, GIB, MIB};

/// RMM's cap on live bytes, also the device capacity the workload is measured under.
pub const MAX_USAGE: u64 = 16 * GIB;
const ALLOC_PERCENT: u64 = 73;

pub fn generate(seed: u64, max_size: u64, ops: u64) -> super::Workload {
    let mut rng = Rng::new(seed);
    let mut p = Program::new();
    let mut live: Vec<Block> = Vec::new();
    let (mut made, mut bytes) = (0u64, 0u64);
    for _ in 0..ops.saturating_mul(2) {
        let size = rng.range(1, max_size.max(1));
        let alloc = live.is_empty()
            || (rng.percent(ALLOC_PERCENT) && made < ops && bytes + size < MAX_USAGE);
        if alloc {
            live.push(p.alloc(size));
            made += 1;
            bytes += size;
        } else {
            let i = rng.range(0, live.len() as u64 - 1) as usize;
            let b = live.swap_remove(i);
            bytes -= b.size;
            p.free(b);
        }
    }
    p.free_all(live);
    let name = format!("random (max {} MiB, {} ops)", max_size.div_ceil(MIB), ops);
    p.finish(name, Some(MAX_USAGE))
}
