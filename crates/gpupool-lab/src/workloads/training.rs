//! Training steps of a GPT-2-small-sized transformer as PyTorch runs them: the allocation
//! sequence of nanoGPT's loop under bf16 autocast with AdamW and DDP's bucketed gradients.
//!
//! Model: 12 layers, d_model 768, 12 heads, vocabulary 50 257, sequence 1 024, micro-batch 8;
//! fp32 master weights (124 M parameters, each tensor its own allocation); bf16 activations,
//! flash attention (no T×T score matrix). Once: the parameters, DDP's gradient buckets (1 MiB
//! first, then 25 MiB; gradients are views into them), and at the first optimizer step Adam's
//! two states per parameter. Per step: the batch; per layer the forward's saved activations
//! (layer-norm inputs and statistics, the bf16 casts that feed each linear, q/k/v, attention
//! output, the MLP's two 4×-wide tensors) and its temporaries (layer-norm outputs before the
//! cast, projection outputs before the residual add), autocast's bf16 weight copies held until
//! the layer's backward; the logits (kept by the training loop until the next step's forward
//! replaces them) and the fp32 cross-entropy; the backward in reverse, freeing saved tensors as
//! it goes, with weight-gradient temporaries cast to fp32 and accumulated into the buckets;
//! gradient clipping's per-tensor norms; the foreach AdamW step's temporaries. The seed only
//! varies a few small bookkeeping allocations per step (metrics, scalars); sizes and order are
//! otherwise the model's.

use super::rng::Rng;
use super::{Block, Program, MIB};

const LAYERS: usize = 12;
const C: u64 = 768;
const HEADS: u64 = 12;
const VOCAB: u64 = 50_257;
const SEQ: u64 = 1024;
const BATCH: u64 = 8;
const BUCKET: u64 = 25 * MIB;
const FIRST_BUCKET: u64 = MIB;

/// The fp32 parameter tensors, in `model.parameters()` order: embeddings, per layer the
/// twelve tensors of a block, the final layer norm. The LM head shares `wte`.
fn parameter_sizes() -> Vec<u64> {
    let mut p = vec![VOCAB * C * 4, SEQ * C * 4];
    for _ in 0..LAYERS {
        p.extend_from_slice(&[
            C * 4,         // ln_1.weight
            C * 4,         // ln_1.bias
            C * 3 * C * 4, // attn.c_attn.weight
            3 * C * 4,     // attn.c_attn.bias
            C * C * 4,     // attn.c_proj.weight
            C * 4,         // attn.c_proj.bias
            C * 4,         // ln_2.weight
            C * 4,         // ln_2.bias
            C * 4 * C * 4, // mlp.c_fc.weight
            4 * C * 4,     // mlp.c_fc.bias
            4 * C * C * 4, // mlp.c_proj.weight
            C * 4,         // mlp.c_proj.bias
        ]);
    }
    p.extend_from_slice(&[C * 4, C * 4]); // ln_f
    p
}

/// What one layer's forward keeps for its backward.
struct Saved {
    x: Block,
    ln1_stats: [Block; 2],
    ln1_cast: Block,
    w_attn: Block,
    qkv: Block,
    attn_out: Block,
    lse: Block,
    y: Block,
    w_proj: Block,
    x2: Block,
    ln2_stats: [Block; 2],
    ln2_cast: Block,
    w_fc: Block,
    fc: Block,
    gelu: Block,
    w_fc2: Block,
}

/// A layer norm's backward and the residual add after it: frees the block's input gradient
/// `g_in`, the norm's statistics and saved input `x`, and returns the new running gradient
/// (replacing `g`).
fn norm_backward(
    p: &mut Program,
    x32: u64,
    g_in: Block,
    stats: [Block; 2],
    x: Block,
    g: Block,
) -> Block {
    let g_norm = p.alloc(x32);
    p.free(g_in);
    let g_ln = p.alloc(x32);
    p.free(g_norm);
    p.free_all(stats);
    p.free(x);
    let g2 = p.alloc(x32);
    p.free(g);
    p.free(g_ln);
    g2
}

/// A weight gradient: computed in bf16, cast to fp32, accumulated into its bucket view.
fn weight_grad(p: &mut Program, elems: u64) {
    let g16 = p.alloc(elems * 2);
    let g32 = p.alloc(elems * 4);
    p.free(g16);
    p.free(g32);
}

pub fn generate(seed: u64, steps: u32) -> super::Workload {
    let mut rng = Rng::new(seed);
    let mut p = Program::new();
    let a = BATCH * SEQ * C * 2; // a bf16 activation
    let x32 = BATCH * SEQ * C * 4; // an fp32 residual-stream tensor
    let stats = BATCH * SEQ * 4; // layer-norm mean or rstd
    let logits16 = BATCH * SEQ * VOCAB * 2;
    let logits32 = BATCH * SEQ * VOCAB * 4;

    let params: Vec<Block> = parameter_sizes().into_iter().map(|s| p.alloc(s)).collect();
    // DDP's buckets, filled in reverse parameter order: the first one small.
    let total: u64 = params.iter().map(|b| b.size).sum();
    let mut buckets = Vec::new();
    let (mut filled, mut cap) = (0u64, FIRST_BUCKET);
    let mut cur = 0u64;
    for b in params.iter().rev() {
        cur += b.size;
        if cur >= cap {
            buckets.push(p.alloc(cur));
            filled += cur;
            cur = 0;
            cap = BUCKET;
        }
    }
    if cur > 0 {
        buckets.push(p.alloc(cur));
        filled += cur;
    }
    debug_assert_eq!(filled, total);
    let mut adam: Vec<Block> = Vec::new();
    let mut held_logits: Option<Block> = None;
    let mut held_loss: Option<Block> = None;

    for _ in 0..steps {
        let idx = p.alloc(BATCH * SEQ * 8);
        let targets = p.alloc(BATCH * SEQ * 8);
        // Forward. Embeddings run in fp32 under autocast.
        let tok = p.alloc(x32);
        let pos = p.alloc(SEQ * C * 4);
        let mut x = p.alloc(x32);
        p.free(tok);
        p.free(pos);
        let mut saved: Vec<Saved> = Vec::with_capacity(LAYERS);
        for _ in 0..LAYERS {
            let ln1_stats = [p.alloc(stats), p.alloc(stats)];
            let ln1 = p.alloc(x32);
            let ln1_cast = p.alloc(a);
            p.free(ln1);
            let w_attn = p.alloc(C * 3 * C * 2);
            let qkv = p.alloc(3 * a);
            let attn_out = p.alloc(a);
            let lse = p.alloc(BATCH * HEADS * SEQ * 4);
            let y = p.alloc(a);
            let w_proj = p.alloc(C * C * 2);
            let proj = p.alloc(a);
            let x2 = p.alloc(x32);
            p.free(proj);
            let ln2_stats = [p.alloc(stats), p.alloc(stats)];
            let ln2 = p.alloc(x32);
            let ln2_cast = p.alloc(a);
            p.free(ln2);
            let w_fc = p.alloc(C * 4 * C * 2);
            let fc = p.alloc(4 * a);
            let gelu = p.alloc(4 * a);
            let w_fc2 = p.alloc(4 * C * C * 2);
            let fc2 = p.alloc(a);
            let x3 = p.alloc(x32);
            p.free(fc2);
            saved.push(Saved {
                x,
                ln1_stats,
                ln1_cast,
                w_attn,
                qkv,
                attn_out,
                lse,
                y,
                w_proj,
                x2,
                ln2_stats,
                ln2_cast,
                w_fc,
                fc,
                gelu,
                w_fc2,
            });
            x = x3;
        }
        let lnf_stats = [p.alloc(stats), p.alloc(stats)];
        let lnf = p.alloc(x32);
        let lnf_cast = p.alloc(a);
        p.free(lnf);
        let wte16 = p.alloc(VOCAB * C * 2);
        let logits = p.alloc(logits16);
        // The loop's previous logits go when the new ones are returned.
        if let Some(old) = held_logits.replace(logits) {
            p.free(old);
        }
        let l32 = p.alloc(logits32);
        let logp = p.alloc(logits32);
        p.free(l32);
        let loss = p.alloc(4);
        if let Some(old) = held_loss.replace(loss) {
            p.free(old);
        }
        for _ in 0..rng.range(2, 6) {
            let m = p.alloc(rng.range(4, 4096));
            p.free(m);
        }

        // Backward.
        let grad_logp = p.alloc(logits32);
        let g32 = p.alloc(logits32);
        p.free(grad_logp);
        p.free(logp);
        let g16 = p.alloc(logits16);
        p.free(g32);
        let mut g_in = p.alloc(a);
        weight_grad(&mut p, VOCAB * C);
        p.free(g16);
        p.free(lnf_cast);
        p.free(wte16);
        let mut g = p.alloc(x32);
        p.free(g_in);
        p.free_all(lnf_stats);
        p.free(x);
        for s in saved.into_iter().rev() {
            // MLP.
            let g_fc2 = p.alloc(a);
            let g_gelu = p.alloc(4 * a);
            weight_grad(&mut p, 4 * C * C);
            p.free(g_fc2);
            p.free(s.gelu);
            p.free(s.w_fc2);
            let g_fc = p.alloc(4 * a);
            p.free(g_gelu);
            p.free(s.fc);
            g_in = p.alloc(a);
            weight_grad(&mut p, C * 4 * C);
            p.free(g_fc);
            p.free(s.ln2_cast);
            p.free(s.w_fc);
            g = norm_backward(&mut p, x32, g_in, s.ln2_stats, s.x2, g);
            // Attention.
            let g_proj = p.alloc(a);
            let g_y = p.alloc(a);
            weight_grad(&mut p, C * C);
            p.free(g_proj);
            p.free(s.y);
            p.free(s.w_proj);
            let dq_accum = p.alloc(BATCH * HEADS * SEQ * 64 * 4);
            let g_qkv = p.alloc(3 * a);
            p.free(dq_accum);
            p.free(g_y);
            p.free(s.attn_out);
            p.free(s.lse);
            p.free(s.qkv);
            g_in = p.alloc(a);
            weight_grad(&mut p, C * 3 * C);
            p.free(g_qkv);
            p.free(s.ln1_cast);
            p.free(s.w_attn);
            g = norm_backward(&mut p, x32, g_in, s.ln1_stats, s.x, g);
        }
        // Embedding backward: dense gradients, added into the buckets.
        let g_wte = p.alloc(VOCAB * C * 4);
        let g_wpe = p.alloc(SEQ * C * 4);
        p.free(g);
        p.free(g_wte);
        p.free(g_wpe);
        p.free(idx);
        p.free(targets);

        // Gradient clipping (foreach norms), then AdamW (foreach: one list of temporaries).
        let norms: Vec<Block> = params.iter().map(|_| p.alloc(4)).collect();
        let stacked = p.alloc(4 * params.len() as u64);
        p.free_all(norms);
        let total_norm = p.alloc(4);
        p.free(stacked);
        p.free(total_norm);
        if adam.is_empty() {
            for b in &params {
                adam.push(p.alloc(b.size));
                adam.push(p.alloc(b.size));
            }
        }
        let temps: Vec<Block> = params.iter().map(|b| p.alloc(b.size)).collect();
        p.free_all(temps);
    }
    p.free_all(held_logits);
    p.free_all(held_loss);
    p.free_all(adam);
    p.free_all(buckets);
    p.free_all(params);
    p.finish(format!("training (GPT-2 small, {steps} steps)"), None)
}
