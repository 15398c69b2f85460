"""The CPU-side benchmark's two reports (the hit path and what surrounds it; the policies, the
replay and the threads), computed from the figures the runs of bench_manifest.py kept. The
prose of each section is a template below; the tables come from render.table."""

import re

import render
from bench_manifest import (
    COUNTER_MODES,
    COUNTER_ROUNDS,
    H200_CALLS,
    HIT_ITERS,
    INFERENCE_SEEDS,
    LIVE_COUNTS,
    MODES,
    OVERLAP_BYTES,
    OVERLAP_CASES,
    OVERLAP_ITERS,
    RAW_ITERS,
    REPLAYS,
    SEED,
    SIZE,
    THREAD_STEPS,
    TRACE_ITERS,
    WORKLOADS,
)

THREAD_CASES = (
    "one_thread",
    "two_threads_two_devices",
    "two_threads_one_device",
    "two_threads_one_device_no_thread_cache",
)

MEASURED = """\
Measured {date} on `{system}`, {cpus} CPUs ({cpu_model}), commit {commit}, by `scripts/bench.sh` \
({how})."""

HIT = """\
### Hit path: one cudaMalloc+cudaFree pair of {size} B vs glibc malloc+free

Median ns per pair of 7 runs of {iters} pairs; *live* blocks (512 B–64 KiB, mixed)
are allocated first and held during the timing. ×glibc: the pool's pair over glibc's."""

TARGETS = """\
Targets (reported, not asserted): pair ≤ 4× glibc's; flat within 1.5× from 1 to 100 000 live \
blocks."""

TORCH = """\
### PyTorch's pluggable allocator entry points (1 live block, {size} B pairs)

`gpupool_torch_malloc` + `gpupool_torch_free` as `CUDAPluggableAllocator` calls them
(`hit_path ... torch`): on the legacy stream (PyTorch's default stream) and on a
non-blocking stream of the program's own, against the cudaMalloc+cudaFree pair above. In
`relaxed` mode each free names its stream and the next allocation on it takes the block back."""

COUNTERS = """\
### What the counters and the trace cost (1 live block, {size} B pairs)

The same pairs with the hit-path counters compiled out (`--no-default-features`, the
`stats` feature), alternating the two builds three times; and with `GPUPOOL_TRACE` writing
to a file ({trace_iters} pairs, 7 runs: two 40-byte records per pair). Target: counters ≤ 10%."""

TRACE = """\
Trace (relaxed): {without} ns per pair without, {with_} ns with: {per_event} ns per event; the \
file grew by {grew} MiB."""

INSTRUCTIONS = """\
### The hit path in instructions (callgrind, `bench/hit_instructions.sh`)

docs/design-notes.md, "Note: the hit path's budget", gives the target: 1.5× glibc in
`strict` mode with two devices."""

RAW = """\
### What the pool avoids: the runtime's own pair ({size} B, 1 live block, 7 × {iters} pairs)"""

RAW_AFTER = """\
On a GPU the driver's pair costs far more than the simulator's mmap+munmap; see
`scripts/gpu-check.sh`."""

OVERLAP = """\
### Overlap loop: cudaMalloc, kernel, cudaFree, host work ({iters} iterations, {mib} MiB blocks)

Wall ms (wall/ideal). No pool: the same program without LD_PRELOAD, whose cudaFree waits
for the kernel each time. Ideal: max(kernel, host) per iteration; serial: their sum."""

POLICIES = """\
Each workload is generated from seed {seed} and replayed through every policy, each on
its own simulated driver. *Peak reserved*: the most bytes the policy held from the
driver; *÷ peak requested*: that over the most bytes the program held at once (1.000 is
no overhead at all); *cudaMalloc per 1 000 requests*: real allocation calls (the cost a
cache exists to avoid); *OOMs*: requests that failed, after the policy's own recovery,
with the driver capped (RMM's 16 GiB for the random workloads, 1.1 × peak requested
otherwise); *replay events/s*: allocations and frees per second through the policy on
one core (median of repeated replays). The threshold policy releases cached memory above
1 GiB. Frees are stream-ordered (`relaxed`: reusable at once), as PyTorch's allocator
assumes and as the PyTorch-rules policy works."""

CHARTS = """\
Charts (reserved bytes over the run, one line per policy):
[training]({figures}/training.svg), [inference]({figures}/inference.svg)."""

REPLAY = """\
**Trace replay** (`gpupool-trace replay` of the generated inference trace, parse
included, best of {replays}): {records} records in {ms:.0f} ms, {rate:.1f} million records/s."""

SEEDS = """\
**Inference across seeds** (`gpupool-trace compare inference --seed N --min-time 0`,
N = 1–{seeds}; the target: at least 10% less peak reserved than the PyTorch rules with
no more `cudaMalloc` calls):"""

H200 = """\
**A trace recorded on a GPU** (`bench/traces/h200-torch-train.trace.gz`: the PyTorch
training loop of `tests/gpu/torch_train.py` on an H200 under the preload, 2026-11-30; see
`bench/traces/README.md`). The policies side by side with stream-ordered frees, as above
(`gpupool-trace compare TRACE --reuse relaxed`):"""

H200_MODES = """\
The pool's own modes on the same trace (`gpupool-trace replay TRACE --reuse MODE
--fence-bytes 256MiB`, and with `--one-stream` for the calls PyTorch's pluggable allocator
makes: every allocation and free on PyTorch's stream). PyTorch's own allocator reserved
5.73 GiB in that run."""

THREADS = """\
**Threads** (`THREAD_STEPS={steps} cargo bench --bench threads`: the pool API, a churn of
64 held blocks of 512 B–4 MiB per thread, one free and one allocation per step; million
operations per second, median of 5 runs; this machine has {cpus} CPUs):"""

THREADS_AFTER = """\
Thread caches (`GPUPOOL_THREAD_CACHE`, 64 MiB per thread by default) start with the second
thread in `relaxed` mode, and in `strict` and `barrier` once the threads compete for the \
device's lock."""


class Results:
    """The figures by run name (bench_manifest's names) and each run's wall time in ns."""

    def __init__(self, figures, wall_ns):
        self.figures = figures
        self.wall_ns = wall_ns

    def __getitem__(self, name):
        return self.figures[name]

    def median(self, kind, mode):
        """The middle of the counter rounds' figures of `kind` (stats or nostats)."""
        values = [self[f"{kind}/{mode}/{r}"] for r in range(1, COUNTER_ROUNDS + 1)]
        return sorted(values, key=float)[len(values) // 2]


def times(x):
    return f"{x}×"


def over(a, b, digits):
    """a / b as "N×"."""
    return times(render.ratio(a, b, digits))


def at_most(a, b):
    return "yes" if float(a) <= float(b) else "no"


def right(*headers):
    """Columns of figures, aligned right."""
    return [(h, "r") for h in headers]


def hit_table(r):
    cols = right("live blocks", "glibc ns")
    for mode in MODES:
        cols += right(f"pool {mode} ns", "×glibc")
    rows = []
    for live in LIVE_COUNTS:
        glibc = r[f"glibc/{live}"]
        row = [render.thousands(live), glibc]
        for mode in MODES:
            row += [r[f"{mode}/{live}"], over(r[f"{mode}/{live}"], glibc, 1)]
        rows.append(row)
    return render.table(cols, rows)


def target_table(r):
    """Per mode: the worst pair over glibc's, whether it is at most 4×, the pair at 100 000 live
    blocks over the pair at 1, whether that is at most 1.5×."""
    rows = []
    for mode in MODES:
        worst = "0"
        for live in LIVE_COUNTS:
            x = render.ratio(r[f"{mode}/{live}"], r[f"glibc/{live}"], 2)
            if float(x) > float(worst):
                worst = x
        flat = render.ratio(r[f"{mode}/100000"], r[f"{mode}/1"], 2)
        rows.append([mode, times(worst), at_most(worst, 4), times(flat), at_most(flat, 1.5)])
    cols = [("mode", "l"), ("worst ×glibc", "r"), ("≤ 4×?", "l")]
    cols += [("100 000 live / 1 live", "r"), ("≤ 1.5×?", "l")]
    return render.table(cols, rows)


def torch_table(r):
    rows = []
    for m in MODES:
        pair = r[f"{m}/1"]
        legacy, own = r[f"torch/{m}"], r[f"torch_stream/{m}"]
        rows.append([m, pair, legacy, over(legacy, pair, 2), own, over(own, pair, 2)])
    cols = [("mode", "l")] + right("cudaMalloc pair ns", "torch, legacy stream ns", "×pair")
    cols += right("torch, own stream ns", "×pair")
    return render.table(cols, rows)


def counter_table(r):
    rows = []
    for mode in COUNTER_MODES:
        a, b = r.median("stats", mode), r.median("nostats", mode)
        rows.append([mode, a, b, f"{(float(a) / float(b) - 1) * 100:+.1f}%"])
    cols = [("mode", "l")] + right("with counters ns", "without ns", "counters cost")
    return render.table(cols, rows)


def raw_table(r):
    disabled = f"{r['disabled']} ({float(r['disabled']) - float(r['raw']):+.0f} ns)"
    rows = [
        ["simulator's cudaMalloc+cudaFree, no pool (CUDASIM_MALLOC_US unset)", r["raw"]],
        ["preloaded with GPUPOOL_DISABLE=1 (pass-through)", disabled],
        ["pool hit, strict (from the table above, 1 live block)", r["strict/1"]],
    ]
    return render.table([("path", "l"), ("ns per pair", "r")], rows)


def overlap_table(r):
    cols = right("kernel µs", "host µs", "ideal ms", "serial ms", "no pool")
    cols += right(*(f"pool {m}" for m in MODES))
    rows = []
    for k, h in OVERLAP_CASES:
        none = r[f"overlap/{k}/{h}/none"]
        ideal = none["ideal_ms"]
        walls = [none["wall_ms"]] + [r[f"overlap/{k}/{h}/{m}"] for m in MODES]
        rows.append(
            [k, h, ideal, none["serial_ms"]] + [f"{w} ({over(w, ideal, 2)})" for w in walls]
        )
    return render.table(cols, rows)


def instructions(r):
    """The instruction table, when the run was in the manifest (it is not in the shell
    version's figures)."""
    if "instructions" not in r.figures:
        return []
    return [INSTRUCTIONS, r["instructions"]]


def cpu(r, meta):
    """The hit path against glibc, PyTorch's entry points, the counters and the trace, the
    runtime's own pair, the overlap loop."""
    trace = TRACE.format(
        without=r["notrace"],
        with_=r["trace"],
        per_event=render.fixed((float(r["trace"]) - float(r["notrace"])) / 2, 1),
        grew=render.fixed(meta["trace_bytes"] / 1048576, 1),
    )
    blocks = [
        MEASURED.format(**meta, how=f"hit-path runs pinned: {meta['pin']}"),
        HIT.format(size=SIZE, iters=HIT_ITERS),
        hit_table(r),
        TARGETS,
        target_table(r),
        *instructions(r),
        TORCH.format(size=SIZE),
        torch_table(r),
        COUNTERS.format(size=SIZE, trace_iters=TRACE_ITERS),
        counter_table(r),
        trace,
        RAW.format(size=SIZE, iters=RAW_ITERS),
        raw_table(r),
        RAW_AFTER,
        OVERLAP.format(iters=OVERLAP_ITERS, mib=OVERLAP_BYTES >> 20),
        overlap_table(r),
    ]
    return "\n\n".join(blocks)


def seed_summary(rows):
    """ "Mean ...%; the target met on N of M seeds." over (seed, peak vs PyTorch rules, calls vs
    PyTorch rules) rows: met where peak reserved is at least 10% lower with no more calls."""
    deltas, met = [], 0
    for _, mem, calls in rows:
        m = float(re.sub(r"[ %+]", "", mem))
        deltas.append(m)
        inside = calls.split("(")[1].split(")")[0]
        ours, theirs = (float(v.replace(" ", "")) for v in inside.split(" vs "))
        met += m <= -10 and ours <= theirs
    mean = sum(deltas) / len(deltas)
    return f"Mean {mean:+.1f}%; the target met on {met} of {len(rows)} seeds."


def thread_table(threads):
    rows = []
    for mode in MODES:
        one, two, same, off = (threads[(mode, c)] for c in THREAD_CASES)
        row = [mode, render.ratio(one, 1e6)]
        for x in (two, same, off):
            row += [render.ratio(x, 1e6), over(x, one, 2)]
        rows.append(row)
    cols = [("mode", "l")] + right("one thread", "two threads, two devices", "×one")
    cols += right("two threads, one device", "×one", "same, thread caches off", "×one")
    return render.table(cols, rows)


def policies(r, meta, figures="bench/figures"):
    """The policy comparison, the replay's speed, the inference seeds, the H200 trace, the
    threads. `figures`: the charts' folder as seen from the page the report goes in."""
    best = min(r.wall_ns[f"replay/{i}"] for i in range(1, REPLAYS + 1))
    records = meta["replay_records"]
    seeds = [(s, *r[f"seed/{s}"]) for s in range(1, INFERENCE_SEEDS + 1)]
    seed_cols = right("seed", "peak reserved vs PyTorch rules", "cudaMalloc calls vs PyTorch rules")
    h200 = [
        [calls, mode, *row]
        for calls in H200_CALLS
        for mode in MODES
        for row in r[f"h200/{calls}/{mode}"]
    ]
    h200_cols = [("calls", "l"), ("mode", "l")]
    h200_cols += right("peak reserved", "cudaMalloc calls", "fences", "barriers")
    how = f"`gpupool-trace compare {' '.join(WORKLOADS)} --seed {SEED}`, pinned: {meta['pin']}"
    blocks = [
        MEASURED.format(**meta, how=how),
        POLICIES.format(seed=SEED),
        r["compare"],
        CHARTS.format(figures=figures),
        REPLAY.format(
            replays=REPLAYS, records=records, ms=best / 1e6, rate=records / (best / 1e9) / 1e6
        ),
        SEEDS.format(seeds=INFERENCE_SEEDS),
        render.table(seed_cols, seeds),
        seed_summary(seeds),
        H200,
        r["h200/compare"],
        H200_MODES,
        render.table(h200_cols, h200),
        THREADS.format(steps=THREAD_STEPS, cpus=meta["cpus"]),
        thread_table(r["threads"]),
        THREADS_AFTER,
    ]
    return "\n\n".join(blocks)
