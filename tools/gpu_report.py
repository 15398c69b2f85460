"""gpu-results.md, the real-GPU check's report: the steps and their results, then one section per
test program with the figures read from its logs."""

import kv
import render
from steps import FAILED

# Column headers of the figures the steps print (the manifest's `reads`).
LABELS = {
    "program_mallocs": "program mallocs",
    "churn_ms": "churn ms",
    "reused_address": "rounds with the same address",
    "clobbered": "clobbered rounds",
    "rounds": "rounds",
    "same_stream_reuse": "rounds reused on the same stream",
    "median_step_ms": "median step ms",
    "max_memory_reserved_mib": "max_memory_reserved MiB",
    "peak_device_used_mib": "peak device used MiB",
    "base_device_used_mib": "base used MiB",
    "final_loss": "final loss",
    "empty_cache_freed_mib": "empty_cache() freed MiB",
    "wall_ms": "wall ms",
    "ideal_ms": "ideal ms",
    "serial_ms": "serial ms",
    "pitches": "pitches",
    "mismatched": "mismatched",
    "unaligned": "unaligned",
    "bytes_wrong": "bytes wrong",
    "filled_bytes": "bytes filled into the cache",
    "asked_bytes": "bytes asked of CUDA",
    "gemms": "gemms",
    "max_error": "max error",
    "blocks": "blocks",
    "double_blocks": "double blocks",
    "granule_bytes": "granule bytes",
    "map_us": "map us",
    "unmap_us": "unmap us",
    "move_us": "move us",
    "remap_us": "remap us",
    "run_map_us": "run map us",
}

CHURN = (
    "churn_nopool",
    "churn_pool_strict",
    "churn_pool_barrier",
    "churn_pool_relaxed",
    "churn_pool_relaxed_few",
    "churn_pool_strict_few",
)
HAZARD = (
    "hazard_nopool",
    "hazard_pool_strict",
    "hazard_pool_barrier",
    "hazard_pool_relaxed",
    "hazard_blocking_nopool",
    "hazard_blocking_pool_strict",
    "hazard_blocking_pool_barrier",
    "hazard_blocking_pool_relaxed",
)
STREAM_REUSE = (
    "stream_reuse_nopool",
    "stream_reuse_pool_relaxed",
    "stream_reuse_pool_strict",
    "stream_reuse_pool_barrier",
)
TORCH = (
    "torch_headline_pool",
    "torch_native",
    "torch_headline_pool_classic",
    "torch_native_expandable",
    "torch_async_native",
    "torch_headline_pool_relaxed",
    "torch_headline_pool_slack",
    "torch_launcher_pool",
    "torch_package_use",
    "torch_nocache",
    "torch_nocache_pool",
    "torch_nocache_pool_barrier",
    "torch_pluggable",
    "torch_pluggable_barrier",
    "torch_pluggable_relaxed",
    "torch_headline_cudnn",
)
# The static runtime, through the driver hooks (issue 19).
STATIC_CHURN = ("churn_static_nopool", "churn_static_pool_strict", "churn_static_pool_relaxed")
STATIC_HAZARD = (
    "hazard_static_nopool",
    "hazard_static_pool_strict",
    "hazard_static_pool_barrier",
    "hazard_static_hooks_off",
)
CUBLAS = ("cublas_nopool", "cublas_pool_strict")
PITCHED = ("pitched_nopool", "pitched_pool_strict", "pitched_static_pool_strict")
CACHE_BACK = ("cache_back_nopool", "cache_back_pool_strict", "cache_back_static_pool_strict")
# Expandable segments (issue 20).
FRAGMENT = ("fragment_nopool", "fragment_pool_classic", "fragment_pool_expandable")
VMM = ("vmm_cost_nopool",)
VMM_KEYS = ("map_us", "unmap_us", "move_us", "remap_us", "run_map_us")
OVERLAP = (
    "overlap_nopool",
    "overlap_pool_strict",
    "overlap_pool_barrier",
    "overlap_pool_barrier_api",
    "overlap_pool_relaxed",
)
HIT = ("hit_raw", "hit_pool", "hit_async", "hit_pool_relaxed")
TORCH_HIT = ("torch_hit_native", "torch_hit_pluggable", "torch_hit_pluggable_relaxed")


class Results:
    """What the report is made of: the recorded steps (name, kind, status, seconds, note), the
    manifest's steps by name, and a function giving a step's log text (None: no log)."""

    def __init__(self, records, steps, read_log):
        self.records = records
        self.steps = {s.name: s for s in steps}
        self.read_log = read_log
        self._recs = {}

    def status(self, name):
        return next((r[2] for r in self.records if r[0] == name), "-")

    def kv(self, name):
        """The key=value records of a step's log (empty without a log)."""
        if name not in self._recs:
            self._recs[name] = kv.records(self.read_log(name) or "")
        return self._recs[name]

    def value(self, name, key):
        return kv.first(self.kv(name), key, "")

    def failed(self):
        return sum(1 for r in self.records if r[1] == "check" and r[2] in FAILED)


def summary_block(text):
    """The pool's exit summary in a log: from the line before its first line on, 40 lines."""
    out, on, prev = [], False, ""
    for line in text.splitlines():
        if "gpupool summary" in line:
            on = True
            out.append(prev)
        if on:
            out.append(line)
        prev = line
    return out[:40]


def step_table(res, names, status=True):
    """One row per step: its name, its result, and the figures its manifest entry reads."""
    keys = res.steps[names[0]].reads
    cols = [("run", "l")] + ([("result", "l")] if status else [])
    cols += [(LABELS[k], "r") for k in keys]
    rows = [
        [n] + ([res.status(n)] if status else []) + [res.value(n, k) for k in keys] for n in names
    ]
    return render.table(cols, rows)


def per_size(res, names, keys):
    """Rows by size (ascending) of `keys` from each step's per-size records; '-' where a step
    has no figure for a size."""
    by_step = [{r["size"]: r for r in kv.rows(res.kv(n), "size", *keys)} for n in names]
    sizes = sorted({s for d in by_step for s in d}, key=int)
    return [[s] + [d[s][k] if s in d else "-" for d in by_step for k in keys] for s in sizes]


def hit_rows(res):
    return per_size(res, HIT, ("ns_per_pair",))


def torch_hit_rows(res):
    return per_size(res, TORCH_HIT, ("pair_ns", "net_ns"))


def summary_section(res, name, title=None):
    text = res.read_log(name)
    if text is None:
        return []
    return ([title, ""] if title else []) + [render.code(summary_block(text)), ""]


def report(res, meta):
    """The whole report. `meta`: date, dry, lib, lib_sha, commit, elapsed, budget, published."""
    out = [
        "# libgpupool GPU check",
        "",
        f"- date: {meta['date']}",
        f"- mode: {'dry run (nothing ran on a GPU)' if meta['dry'] else 'real run'}",
        f"- library: `{meta['lib']}`" + (f" (sha256 {meta['lib_sha']})" if meta["lib_sha"] else ""),
        f"- commit: {meta['commit']}",
        f"- elapsed: {meta['elapsed']} s of a {meta['budget']} s budget",
        "",
        "## Steps",
        "",
        render.table(
            [("step", "l"), ("kind", "l"), ("result", "l"), ("s", "r"), ("note", "l")], res.records
        ),
        "",
        f"Correctness checks failed (FAIL, TIMEOUT, or NOTRUN for lack of time): {res.failed()}",
        "",
    ]
    env = res.read_log("env")
    if env is not None:
        lines = [l for l in env.splitlines() if not l.startswith("$ ")][:40]
        out += ["## Environment", "", render.code(lines), ""]

    out += [
        "## churn (8 threads, kernel-filled blocks, verified by kernel before free)",
        "",
        step_table(res, CHURN),
        "",
    ]
    for name in ("churn_pool_strict", "churn_pool_strict_few"):
        out += summary_section(res, name, f"Pool summary of {name}:")

    out += [
        "## hazard (a kernel still writing a freed block; 0x42 must survive)",
        "",
        step_table(res, HAZARD),
        "",
        "The hazard_blocking rows run the spinning kernel and the new owner's fill on two "
        "blocking streams: barrier mode then relies on its own barrier on the legacy stream, "
        "not on fences. The relaxed rows are informational: relaxed trusts stream order, so a "
        "clobber there is the documented behaviour.",
        "",
    ]

    out += [
        "## stream_reuse (a block freed on a stream under a running kernel; "
        "gpupool_malloc_async)",
        "",
        step_table(res, STREAM_REUSE),
        "",
    ]

    out += [
        "## PyTorch (tests/gpu/torch_train.py)",
        "",
        step_table(res, TORCH),
        "",
        "torch_native: PyTorch's caching allocator. torch_nocache: "
        "PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a cudaMalloc/cudaFree). "
        "torch_nocache_pool: the same under LD_PRELOAD=libgpupool.so (torch's own counters "
        "then see nothing; peak device used is total - free from cudaMemGetInfo).",
        "",
    ]
    out += summary_section(res, "torch_headline_pool", "Pool summary of torch_headline_pool:")
    out += summary_section(res, "torch_nocache_pool", "Pool summary of torch_nocache_pool:")

    out += [
        "## The static runtime through the driver hooks, cuBLAS, pitched images",
        "",
        step_table(res, STATIC_CHURN),
        "",
        step_table(res, STATIC_HAZARD),
        "",
        step_table(res, CUBLAS),
        "",
        step_table(res, PITCHED),
        "",
        "cache_back: the device filled into the pool's cache, then 3/4 of it asked of "
        "cudaMallocFromPoolAsync, which the pool leaves to CUDA (never worse on memory).",
        "",
        step_table(res, CACHE_BACK),
        "",
    ]
    out += summary_section(res, "cublas_pool_strict", "Pool summary of cublas_pool_strict:")

    out += [
        "## Expandable segments: fragment (7 MiB blocks, every other freed, then 14 MiB) and "
        "the driver's cost per granule",
        "",
        step_table(res, FRAGMENT),
        "",
        step_table(res, VMM),
        "",
    ]
    out += summary_section(
        res, "fragment_pool_expandable", "Pool summary of fragment_pool_expandable:"
    )

    out += ["## compute-sanitizer memcheck (churn under the pool, shared and static runtime)", ""]
    for name in ("sanitizer_memcheck_pool", "sanitizer_memcheck_static_pool"):
        out.append(f"- {name}: {res.status(name)}")
        san = res.read_log(name)
        if san is not None:
            line = next(
                (l for l in san.splitlines() if "ERROR SUMMARY" in l or "not supported" in l), ""
            )
            out.append(f"  {line}")
    out.append("")

    out += [
        "## overlap (malloc, ~1 ms kernel, free, 1 ms host work; legacy stream)",
        "",
        step_table(res, OVERLAP, status=False),
        "",
        "overlap_pool_barrier_api launches with an explicit cudaLaunchKernel (which the pool "
        "sees); the others use <<<>>> (with CUDA 13 that calls __cudaLaunchKernel, which it "
        "does not).",
        "",
    ]

    getdevice = "; ".join(f"{n} {res.value(n, 'getdevice_ns')}" for n in HIT)
    out += [
        "## hit_bench (ns per allocate+free pair)",
        "",
        render.table(
            [
                ("size", "r"),
                ("raw_ns", "r"),
                ("pool_ns", "r"),
                ("async_ns", "r"),
                ("pool_relaxed_ns", "r"),
            ],
            hit_rows(res),
        ),
        "",
        "raw: cudaMalloc+cudaFree without the pool. pool: the same under the preload "
        "(GPUPOOL_REUSE=strict). async: cudaMallocAsync+cudaFreeAsync, default mempool, "
        "release threshold UINT64_MAX, no preload.",
        "",
        "cudaGetDevice, ns per call (the pool calls it once in each cudaMalloc and cudaFree "
        f"it serves, unless the process sees one device): {getdevice}",
        "",
    ]

    out += [
        "## torch_hit (ns per torch.empty + del pair, from Python)",
        "",
        render.table(
            [
                ("size", "r"),
                ("native", "r"),
                ("native net", "r"),
                ("pluggable strict", "r"),
                ("net", "r"),
                ("pluggable relaxed", "r"),
                ("net", "r"),
            ],
            torch_hit_rows(res),
        ),
        "",
    ]
    for n in TORCH_HIT:
        if res.read_log(n) is not None:
            out.append(
                f"- {n}: {res.status(n)}; Python loop overhead "
                f"{res.value(n, 'python_overhead_ns')} ns, torch.empty on the meta device "
                f"(no allocator) {res.value(n, 'meta_pair_ns')} ns per pair"
            )
    out += [
        "",
        "native: PyTorch's caching allocator. pluggable: libgpupool as PyTorch's "
        "CUDAPluggableAllocator in that GPUPOOL_REUSE mode. net: the pair minus the Python "
        "loop's own overhead. The pair minus the meta-device figure is an upper bound of the "
        "allocator's share: it also holds PyTorch's CUDA-side work (device guard, current "
        "stream, and for the pluggable allocator its own lock and pointer map). In strict "
        "mode a freed block waits for a fence, taken once GPUPOOL_FENCE_BYTES (256 MiB) "
        "wait: the small sizes' pluggable strict rows also carve new blocks between fences, "
        "not only reuse.",
        "",
        "Logs: `logs/` beside this file (each starts with its command line)"
        + ("; logs.tgz where the results were copied" if meta["published"] else "")
        + ".",
    ]
    return "\n".join(out) + "\n"


def console(res, dry):
    """The lines printed at the end of a run: the steps, and on a GPU the headline figures."""
    out = [f"{'step':<26} {'kind':<6} {'result':<8} {'s':>5}  note"]
    out += [f"{n:<26} {k:<6} {s:<8} {t:>5}  {note[:90]}" for n, k, s, t, note in res.records]
    if dry:
        return out
    out.append("")
    out.append("hit_bench ns/pair: size raw pool async pool_relaxed")
    out += ["  " + " ".join(r) for r in hit_rows(res)]
    out.append(
        "torch_hit ns/pair (and net of Python): size native pluggable_strict " "pluggable_relaxed"
    )
    out += ["  " + " ".join(r) for r in torch_hit_rows(res)]
    wall = {n: res.value(n, "wall_ms") for n in OVERLAP}
    out.append(
        f"overlap wall ms (ideal/serial {res.value('overlap_nopool', 'ideal_ms')}/"
        f"{res.value('overlap_nopool', 'serial_ms')}): nopool {wall['overlap_nopool']} "
        f"strict {wall['overlap_pool_strict']} barrier {wall['overlap_pool_barrier']} "
        f"barrier_api {wall['overlap_pool_barrier_api']} relaxed {wall['overlap_pool_relaxed']}"
    )
    for n in FRAGMENT:
        out.append(
            f"{n}: blocks {res.value(n, 'blocks')}, double blocks {res.value(n, 'double_blocks')}"
        )
    out.append(
        "vmm_cost us per granule: "
        + " ".join(f"{k} {res.value('vmm_cost_nopool', k)}" for k in VMM_KEYS)
    )
    for n in TORCH:
        out.append(
            f"{n}: step {res.value(n, 'median_step_ms')} ms, peak used "
            f"{res.value(n, 'peak_device_used_mib')} MiB, reserved "
            f"{res.value(n, 'max_memory_reserved_mib')} MiB, loss "
            f"{res.value(n, 'final_loss')}"
        )
    return out
