"""PyTorch's cost of one torch.empty + del pair per size, for scripts/gpu-check.sh: the caching
allocator's hit path as a PyTorch program meets it, next to hit_bench's cudaMalloc+cudaFree pairs.

Run with PyTorch's own caching allocator, or with --pluggable LIB (libgpupool installed as
PyTorch's allocator through CUDAPluggableAllocator; GPUPOOL_REUSE picks its mode). Each size is
measured in doubling batches of `x = torch.empty(n, dtype=torch.uint8, device="cuda"); del x`
until about --target-ms of wall time has passed (at most --max-pairs pairs), after two warm-up
pairs that fill the cache. Each batch is timed on the host (perf_counter_ns) and with CUDA events
recorded on the current stream around it (the GPU is idle, so the events see the same host time
plus the event records' own cost).

What Python itself costs is measured, not guessed: the same loop calling a Python function of the
same arguments that returns None (`python_overhead_ns`), and torch.empty on the "meta" device,
which creates the tensor without any allocator (`meta_pair_ns`: PyTorch's dispatch and tensor
bookkeeping). `net` in each size's line is the pair minus the Python overhead; the allocator's own
share is roughly the pair minus meta_pair_ns.

Prints key=value lines:
  allocator=native|pluggable
  python_overhead_ns=NS
  meta_pair_ns=NS
  size=BYTES pair_ns=NS net_ns=NS event_ns=NS pairs=N    (one per size)
and "torch_hit=done" at the end (with --pluggable, the pool's summary on stderr before it).
"""

import argparse
import sys
import time

import torch

import pluggable

SIZES = [512, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30]


def noop(n, dtype=None, device=None):
    return None


def loop(make, n, device, pairs):
    # The same bytecode for every function measured: only `make` differs.
    dtype = torch.uint8
    for _ in range(pairs):
        x = make(n, dtype=dtype, device=device)
        del x


def measure(make, n, device, target_ms, max_pairs, events):
    """(host ns per pair, event ns per pair or None, pairs) for `make` at `n` bytes."""
    loop(make, n, device, 2)
    if events:
        torch.cuda.synchronize()
    host_ns = 0
    event_ms = 0.0
    total = 0
    batch = 1
    while host_ns < target_ms * 1e6 and total < max_pairs:
        if events:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter_ns()
        loop(make, n, device, batch)
        host_ns += time.perf_counter_ns() - t0
        if events:
            end.record()
            end.synchronize()
            event_ms += start.elapsed_time(end)
        total += batch
        batch = min(batch * 2, max(1, max_pairs - total))
    return host_ns / total, (event_ms * 1e6 / total if events else None), total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pluggable", metavar="LIB", help="install libgpupool as PyTorch's allocator")
    ap.add_argument("--target-ms", type=float, default=150.0)
    ap.add_argument("--max-pairs", type=int, default=1 << 20)
    args = ap.parse_args()

    dev = pluggable.start(args.pluggable)
    if dev is None:
        return 1
    torch.cuda.init()
    torch.cuda.synchronize()
    print(f"allocator={'pluggable' if args.pluggable else 'native'}")

    overhead, _, _ = measure(noop, 512, dev, args.target_ms, args.max_pairs, False)
    meta, _, _ = measure(torch.empty, 512, torch.device("meta"), args.target_ms, args.max_pairs, False)
    print(f"python_overhead_ns={overhead:.0f}")
    print(f"meta_pair_ns={meta:.0f}")
    for n in SIZES:
        host, event, pairs = measure(torch.empty, n, dev, args.target_ms, args.max_pairs, True)
        print(f"size={n} pair_ns={host:.0f} net_ns={host - overhead:.0f} event_ns={event:.0f} "
              f"pairs={pairs}")
        sys.stdout.flush()
    torch.cuda.synchronize()
    return pluggable.finish(args.pluggable, "torch_hit=done")


if __name__ == "__main__":
    sys.exit(main())
