"""Every run of the CPU-side benchmark (scripts/bench.sh), in the order they run: the program,
its environment, whether it is pinned to one CPU, and what is read from its output."""

import re
import shutil
from dataclasses import dataclass

import kv

SIZE = 4096  # the cached size of the hit-path pairs
HIT_ITERS = 500000  # pairs per repetition (hit_path times 7 repetitions, prints the median)
RAW_ITERS = 30000  # the same for pairs that reach the simulator (about 3 us each)
TRACE_ITERS = 100000  # pairs per repetition with the trace on (80 bytes of trace per pair)
LIVE_COUNTS = (0, 1, 1000, 100000)
MODES = ("strict", "barrier", "relaxed")
COUNTER_MODES = ("strict", "relaxed")
COUNTER_ROUNDS = 3
OVERLAP_ITERS = 300
OVERLAP_BYTES = 1 << 20
OVERLAP_CASES = ((2000, 1000), (1000, 3000))  # (kernel us, host us)
SEED = 1  # the generated workloads' seed
INFERENCE_SEEDS = 24  # the inference workload is also compared over seeds 1..N
WORKLOADS = ("training", "inference") + tuple(
    f"random:{m}:{n}" for m in ("1MiB", "64MiB", "1GiB") for n in (10000, 100000)
)
REPLAYS = 5  # the trace replay's speed: the best of this many
THREAD_STEPS = 500000  # churn steps per thread in crates/gpupool-lab/benches/threads.rs
H200_CALLS = ("preload", "pluggable")


@dataclass(frozen=True)
class Measure:
    """One run: `argv` with `env` added, pinned to one CPU when `pin`; `parse` turns its
    output into the figure kept under `name` (None: nothing is read; its wall time always is);
    `build`: a build step, whose output goes to stderr and is not kept; `requires`: programs
    it needs, without which it is skipped (`missing`)."""

    name: str
    argv: tuple
    env: tuple = ()
    pin: bool = False
    parse: object = None
    build: bool = False
    requires: tuple = ()


def missing(m, which=shutil.which):
    """The first program `m` requires that is not on the PATH, or None."""
    return next((p for p in m.requires if which(p) is None), None)


def not_measured(program):
    """The figure of a run skipped for want of `program`."""
    return f"Not measured: `{program}` was not found."


# What the runs measure, by the first part of their names: the progress lines on stderr.
STAGES = {
    "the hit path in instructions": ("instructions",),
    "counters and trace": ("stats", "nostats", "notrace", "trace", "disabled"),
    "overlap loop": ("overlap",),
    "policy comparison": ("compare", "generate", "replay", "seed"),
    "the H200 PyTorch trace": ("h200",),
    "threads": ("threads",),
}


def stage(name):
    first = name.split("/")[0]
    return next((s for s, names in STAGES.items() if first in names), f"hit path ({SIZE} B pairs)")


def field(key):
    """The value of `key=value` in a program's output."""

    def parse(text):
        v = kv.first(kv.records(text), key)
        if v is None:
            raise ValueError(f"no {key}= in the output")
        return v

    return parse


def word(key):
    """The word after `key` on its line (tests/c/overlap.c prints `key value`)."""

    def parse(text):
        v = kv.words(text, key)
        if v is None:
            raise ValueError(f"no '{key}' line in the output")
        return v

    return parse


def overlap_figures(text):
    return {k: word(k)(text) for k in ("wall_ms", "ideal_ms", "serial_ms")}


def whole(text):
    return text.rstrip("\n")


def inference_row(text):
    """(peak reserved, cudaMalloc calls) against the PyTorch rules, from the summary row of
    `gpupool-trace compare inference`."""
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) > 3 and cells[1] == " inference ":
            return cells[2].strip(), cells[3].strip()
    raise ValueError("no inference row in gpupool-trace compare's output")


_PEAK = re.compile(r"peak reserved ([0-9.]+ [KMGT]?i?B)")


def replay_rows(text):
    """(peak reserved, cudaMalloc calls, fences, barriers) per device of `gpupool-trace replay`:
    "device 0: peak reserved 5.96 GiB (...)" then "driver calls: 148 cudaMalloc, 3 cudaFree;
    fences 610, barriers 0; ..."."""
    rows, peak = [], None
    for line in text.splitlines():
        m = _PEAK.search(line)
        if m:
            peak = m.group(1)
        if "driver calls" in line:
            w = re.sub(r"[;,]", "", line).split()
            rows.append((peak, w[2], w[7], w[9]))
    if not rows:
        raise ValueError("no figures from gpupool-trace replay")
    return rows


def thread_figures(text):
    """{(mode, case): operations per second} from crates/gpupool-lab/benches/threads.rs ("MODE CASE VALUE")."""
    out = {}
    for line in text.splitlines():
        w = line.split()
        if len(w) == 3:
            out[(w[0], w[1])] = w[2]
    return out


def manifest(bench, rel, lib, lib_nostats, trace_file, replay_trace, h200_trace, figures):
    """The runs, in order. `bench`: target/bench (the compiled programs); `rel`: target/release;
    `lib`, `lib_nostats`: the library with and without its counters; the rest: scratch files."""
    hit_path = f"{bench}/hit_path"
    tool = f"{rel}/gpupool-trace"
    ns = field("ns_per_pair")

    def hit(live, iters, what, *env):
        return (hit_path, str(live), str(SIZE), str(iters), what), tuple(env)

    def pool(mode, library=lib):
        return (("LD_PRELOAD", library), ("GPUPOOL_REUSE", mode))

    out = []
    for live in LIVE_COUNTS:
        out.append(Measure(f"glibc/{live}", *hit(live, HIT_ITERS, "glibc"), pin=True, parse=ns))
        for mode in MODES:
            out.append(
                Measure(
                    f"{mode}/{live}", *hit(live, HIT_ITERS, "cuda", *pool(mode)), pin=True, parse=ns
                )
            )
    out.append(Measure("raw", *hit(1, RAW_ITERS, "cuda"), pin=True, parse=ns))
    # The cached pair in instructions, counted by callgrind (its own build and table; about a
    # minute).
    out.append(
        Measure(
            "instructions",
            ("bash", "bench/hit_instructions.sh"),
            parse=whole,
            requires=("valgrind",),
        )
    )
    # PyTorch's pluggable allocator entry points, on the legacy stream and on a stream of its
    # own.
    for mode in MODES:
        out.append(
            Measure(f"torch/{mode}", *hit(1, HIT_ITERS, "torch", *pool(mode)), pin=True, parse=ns)
        )
        out.append(
            Measure(
                f"torch_stream/{mode}",
                *hit(1, HIT_ITERS, "torch-stream", *pool(mode)),
                pin=True,
                parse=ns,
            )
        )
    # Counters: the same pairs, alternating the two builds (medians of medians).
    for r in range(1, COUNTER_ROUNDS + 1):
        for mode in COUNTER_MODES:
            out.append(
                Measure(
                    f"stats/{mode}/{r}", *hit(1, HIT_ITERS, "cuda", *pool(mode)), pin=True, parse=ns
                )
            )
            out.append(
                Measure(
                    f"nostats/{mode}/{r}",
                    *hit(1, HIT_ITERS, "cuda", *pool(mode, lib_nostats)),
                    pin=True,
                    parse=ns,
                )
            )
    # Trace: pairs with GPUPOOL_TRACE to a real file (two records per pair).
    out.append(
        Measure("notrace", *hit(1, TRACE_ITERS, "cuda", *pool("relaxed")), pin=True, parse=ns)
    )
    out.append(
        Measure(
            "trace",
            *hit(1, TRACE_ITERS, "cuda", *pool("relaxed"), ("GPUPOOL_TRACE", trace_file)),
            pin=True,
            parse=ns,
        )
    )
    out.append(
        Measure(
            "disabled",
            *hit(1, RAW_ITERS, "cuda", ("LD_PRELOAD", lib), ("GPUPOOL_DISABLE", "1")),
            pin=True,
            parse=ns,
        )
    )

    for k, h in OVERLAP_CASES:
        argv = (f"{bench}/overlap", str(OVERLAP_ITERS), str(k), str(h), str(OVERLAP_BYTES))
        out.append(Measure(f"overlap/{k}/{h}/none", argv, parse=overlap_figures))
        for mode in MODES:
            out.append(Measure(f"overlap/{k}/{h}/{mode}", argv, pool(mode), parse=word("wall_ms")))

    out.append(
        Measure(
            "compare",
            (tool, "compare", *WORKLOADS, "--seed", str(SEED), "--svg-dir", figures),
            pin=True,
            parse=whole,
        )
    )
    # The trace replay itself (parse and replay a file), on the generated inference trace.
    out.append(
        Measure(
            "generate", (tool, "generate", "inference", "--seed", str(SEED), "--out", replay_trace)
        )
    )
    for i in range(1, REPLAYS + 1):
        out.append(Measure(f"replay/{i}", (tool, "replay", replay_trace), pin=True))
    # The inference workload's shapes come from the seed: how the comparison goes over many
    # seeds.
    for s in range(1, INFERENCE_SEEDS + 1):
        out.append(
            Measure(
                f"seed/{s}",
                (tool, "compare", "inference", "--seed", str(s), "--min-time", "0"),
                parse=inference_row,
            )
        )
    # A trace recorded on a real GPU (bench/traces/README.md): the policies side by side in
    # relaxed mode, and the pool's own modes, with the program's calls as recorded (the preload)
    # and as the pluggable allocator would make them (--one-stream).
    out.append(
        Measure(
            "h200/compare",
            (tool, "compare", h200_trace, "--reuse", "relaxed"),
            pin=True,
            parse=whole,
        )
    )
    for calls in H200_CALLS:
        for mode in MODES:
            argv = (tool, "replay", h200_trace, "--reuse", mode, "--fence-bytes", "256MiB")
            argv += ("--one-stream",) if calls == "pluggable" else ()
            out.append(Measure(f"h200/{calls}/{mode}", argv, parse=replay_rows))
    out.append(
        Measure(
            "threads/build",
            ("cargo", "bench", "--quiet", "-p", "gpupool-lab", "--bench", "threads", "--no-run"),
            build=True,
        )
    )
    out.append(
        Measure(
            "threads",
            ("cargo", "bench", "--quiet", "-p", "gpupool-lab", "--bench", "threads"),
            (("THREAD_STEPS", str(THREAD_STEPS)),),
            parse=thread_figures,
        )
    )
    return out
