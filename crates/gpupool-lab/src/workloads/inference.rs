//! Inference serving with a GPT-2-small-sized model (fp16 weights) as a Hugging-Face-style
//! server runs it: up to four requests in flight, interleaved one decode step each; each
//! request has its own batch size (1–16) and prompt length (16–768 tokens) and generates 8–128
//! tokens. Per request and layer a K and a V cache tensor (batch × capacity × 768 × 2 bytes)
//! that grows in 64-token steps — reallocated larger, the old one freed after the copy — and is
//! freed when the request finishes. The prefill's per-layer temporaries scale with batch ×
//! prompt, and its logits are computed for every position (batch × prompt × 50 257 × 2 bytes)
//! before the last position is taken in fp32: large transients of ever-different sizes beside
//! long-lived caches of ever-different sizes — the fragmentation-prone case. Decode steps
//! allocate small per-layer temporaries, the step's logits in fp16 and fp32, and the sampling
//! probabilities. Request shapes and arrivals come from the seed.

use super::rng::Rng;
use super::{Block, Program};

const LAYERS: usize = 12;
const C: u64 = 768;
const VOCAB: u64 = 50_257;
const MAX_SEQ: u64 = 1024;
const CHUNK: u64 = 64;
const IN_FLIGHT: usize = 4;

struct Request {
    batch: u64,
    len: u64,
    cap: u64,
    left: u64,
    /// K and V of each layer.
    kv: Vec<Block>,
}

fn kv_bytes(batch: u64, cap: u64) -> u64 {
    batch * cap * C * 2
}

/// The fp16 weights, each tensor its own allocation (the LM head shares `wte`).
fn load_weights(p: &mut Program) -> Vec<Block> {
    let mut w = vec![p.alloc(VOCAB * C * 2), p.alloc(MAX_SEQ * C * 2)];
    for _ in 0..LAYERS {
        for s in [
            C,
            C,
            C * 3 * C,
            3 * C,
            C * C,
            C,
            C,
            C,
            C * 4 * C,
            4 * C,
            4 * C * C,
            C,
        ] {
            w.push(p.alloc(s * 2));
        }
    }
    w.push(p.alloc(C * 2));
    w.push(p.alloc(C * 2));
    w
}

/// The prompt's forward pass; returns the request with its caches.
fn prefill(p: &mut Program, rng: &mut Rng) -> Request {
    let batch = rng.weighted(&[(1, 30), (2, 20), (4, 20), (8, 20), (16, 10)]);
    let prompt = rng.range(16, 768);
    let gen = rng.range(8, 128).min(MAX_SEQ - prompt);
    let cap = (prompt + 1).div_ceil(CHUNK) * CHUNK;
    let u = batch * prompt * C * 2;
    let ids = p.alloc(batch * prompt * 8);
    let mut h = p.alloc(u);
    let mut kv = Vec::with_capacity(2 * LAYERS);
    for _ in 0..LAYERS {
        let ln1 = p.alloc(u);
        let qkv = p.alloc(3 * u);
        p.free(ln1);
        kv.push(p.alloc(kv_bytes(batch, cap)));
        kv.push(p.alloc(kv_bytes(batch, cap)));
        let attn = p.alloc(u);
        p.free(qkv);
        let proj = p.alloc(u);
        p.free(attn);
        let h2 = p.alloc(u);
        p.free(proj);
        p.free(h);
        let ln2 = p.alloc(u);
        let fc = p.alloc(4 * u);
        p.free(ln2);
        let gelu = p.alloc(4 * u);
        p.free(fc);
        let fc2 = p.alloc(u);
        p.free(gelu);
        h = p.alloc(u);
        p.free(fc2);
        p.free(h2);
    }
    let lnf = p.alloc(u);
    p.free(h);
    let logits = p.alloc(batch * prompt * VOCAB * 2);
    p.free(lnf);
    let last = p.alloc(batch * VOCAB * 4);
    p.free(logits);
    sample(p, batch, last);
    p.free(ids);
    Request {
        batch,
        len: prompt + 1,
        cap,
        left: gen.saturating_sub(1),
        kv,
    }
}

/// Softmax and multinomial sampling of the next token from fp32 logits.
fn sample(p: &mut Program, batch: u64, logits32: Block) {
    let probs = p.alloc(batch * VOCAB * 4);
    p.free(logits32);
    let next = p.alloc(batch * 8);
    p.free(probs);
    p.free(next);
}

/// One generated token.
fn decode(p: &mut Program, r: &mut Request) {
    if r.len == r.cap {
        // The cache is full: every layer's K and V are reallocated one chunk larger.
        r.cap += CHUNK;
        let bytes = kv_bytes(r.batch, r.cap);
        for t in r.kv.iter_mut() {
            let grown = p.alloc(bytes);
            let old = std::mem::replace(t, grown);
            p.free(old);
        }
    }
    let u = r.batch * C * 2;
    let mut h = p.alloc(u);
    for _ in 0..LAYERS {
        let fc = p.alloc(4 * u);
        let h2 = p.alloc(u);
        p.free(fc);
        p.free(h);
        h = h2;
    }
    let logits = p.alloc(r.batch * VOCAB * 2);
    p.free(h);
    let l32 = p.alloc(r.batch * VOCAB * 4);
    p.free(logits);
    sample(p, r.batch, l32);
    r.len += 1;
    r.left -= 1;
}

pub fn generate(seed: u64, requests: u32) -> super::Workload {
    let mut rng = Rng::new(seed);
    let mut p = Program::new();
    let weights = load_weights(&mut p);
    let mut active: Vec<Request> = Vec::new();
    let mut admitted = 0;
    while admitted < requests || !active.is_empty() {
        if admitted < requests && active.len() < IN_FLIGHT && (active.is_empty() || rng.percent(30))
        {
            active.push(prefill(&mut p, &mut rng));
            admitted += 1;
        }
        for r in active.iter_mut() {
            if r.left > 0 {
                decode(&mut p, r);
            }
        }
        let (done, still): (Vec<Request>, Vec<Request>) =
            active.into_iter().partition(|r| r.left == 0);
        active = still;
        for r in done {
            p.free_all(r.kv);
        }
    }
    p.free_all(weights);
    p.finish(format!("inference ({requests} requests)"), None)
}
