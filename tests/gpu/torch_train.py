"""A small transformer training loop on the GPU, for scripts/gpu-check.sh.

Run natively, with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a real cudaMalloc/cudaFree),
and with PYTORCH_NO_CUDA_MEMORY_CACHING=1 under LD_PRELOAD=libgpupool.so (the pool serves those
calls). Prints, one key=value per line:

  median_step_ms         median wall time of a step after the warm-up steps (synchronized)
  max_memory_reserved_mib  torch's own counter (0 when its caching allocator is off: it then
                         does not see memory that libgpupool keeps)
  peak_device_used_mib   max over samples of (total - free) from torch.cuda.mem_get_info(),
                         sampled after forward, after backward and after each step: what the
                         device really had in use, whoever holds it
  base_device_used_mib   the same before the model was made (the CUDA context)
  final_loss, loss_finite

and "torch_train=ok" at the end, or exits 1 if a loss was not finite.
"""

import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

import pluggable


def mib(n):
    return n / (1 << 20)


class Model(nn.Module):
    def __init__(self, vocab, d_model, layers, heads, conv=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        # A convolution over the sequence: cuDNN's kernels, whose benchmark mode probes the
        # allocator for its workspace.
        self.conv = nn.Conv1d(d_model, d_model, 3, padding=1) if conv else None
        layer = nn.TransformerEncoderLayer(
            d_model,
            heads,
            dim_feedforward=4 * d_model,
            dropout=0.1,
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        if self.conv is not None:
            x = self.conv(x.transpose(1, 2)).transpose(1, 2)
        return self.head(self.encoder(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--conv",
        action="store_true",
        help="add a convolution, with cuDNN's benchmark mode on (it probes for its workspace)",
    )
    ap.add_argument(
        "--pluggable",
        metavar="LIB",
        help="install libgpupool as PyTorch's allocator (CUDAPluggableAllocator) and print "
        "its summary at the end",
    )
    ap.add_argument(
        "--package",
        action="store_true",
        help="make libgpupool PyTorch's allocator with the Python package's gpupool.torch.use() "
        "and print its summary at the end",
    )
    ap.add_argument(
        "--dump",
        action="store_true",
        help="after the loop, with the model still live, ask the preloaded pool for a live "
        "dump (SIGUSR1): its 'held by' line says which library holds the tensors",
    )
    args = ap.parse_args()

    if args.package:
        import gpupool.torch  # noqa: the package, from PYTHONPATH on the GPU machine

        gpupool.torch.use()
    dev = pluggable.start(args.pluggable)
    if dev is None:
        return 1
    torch.manual_seed(args.seed)
    torch.cuda.init()
    torch.cuda.synchronize()

    peak_used = 0

    def sample():
        nonlocal peak_used
        free, total = torch.cuda.mem_get_info(dev)
        peak_used = max(peak_used, total - free)

    free, total = torch.cuda.mem_get_info(dev)
    base_used = total - free

    if args.conv:
        torch.backends.cudnn.benchmark = True
    model = Model(args.vocab, args.d_model, args.layers, args.heads, args.conv).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    amp = args.dtype == "bf16"

    times = []
    losses = []
    t_start = time.perf_counter()
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev, generator=gen)
        targets = torch.roll(tokens, shifts=-1, dims=1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            logits = model(tokens)
            loss = loss_fn(logits.float().view(-1, args.vocab), targets.view(-1))
        sample()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        sample()
        opt.step()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        sample()
        value = loss.item()
        losses.append(value)
        if step >= args.warmup:
            times.append((t1 - t0) * 1e3)
        if not math.isfinite(value):
            print(f"FAIL: step {step} loss {value}", file=sys.stderr)
            print("loss_finite=0")
            return 1
    wall = time.perf_counter() - t_start
    if args.dump:
        import signal

        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(1.0)  # the pool's dump thread writes it

    try:
        reserved = torch.cuda.max_memory_reserved(dev)
    except Exception as e:  # the counters may be unavailable without the caching allocator
        print(f"max_memory_reserved unavailable: {e}", file=sys.stderr)
        reserved = 0

    params = sum(p.numel() for p in model.parameters())
    # empty_cache() after the training state is dropped: what went back to the driver, as
    # mem_get_info() sees it, and what PyTorch then says is reserved.
    del model, opt, logits, loss, tokens, targets
    torch.cuda.synchronize()
    before_empty, _ = torch.cuda.mem_get_info(dev)
    torch.cuda.empty_cache()
    after_empty, _ = torch.cuda.mem_get_info(dev)
    try:
        reserved_after = torch.cuda.memory_reserved(dev)
    except Exception:  # unavailable with the pluggable allocator
        reserved_after = -1
    print(f"empty_cache_freed_mib={mib(after_empty - before_empty):.0f}")
    print(f"reserved_after_empty_mib={mib(reserved_after):.0f}")
    print(f"params_m={params / 1e6:.1f}")
    print(f"steps={args.steps} warmup={args.warmup} dtype={args.dtype}")
    print(f"first_loss={losses[0]:.4f}")
    print(f"final_loss={losses[-1]:.4f}")
    print("loss_finite=1")
    print(f"median_step_ms={statistics.median(times) if times else float('nan'):.2f}")
    print(f"loop_wall_s={wall:.2f}")
    print(f"max_memory_reserved_mib={mib(reserved):.0f}")
    print(f"peak_device_used_mib={mib(peak_used):.0f}")
    print(f"base_device_used_mib={mib(base_used):.0f}")
    if args.package:
        import gpupool

        sys.stdout.flush()
        print(gpupool.summary(), file=sys.stderr)
    return pluggable.finish(args.pluggable, "torch_train=ok")


if __name__ == "__main__":
    sys.exit(main())
