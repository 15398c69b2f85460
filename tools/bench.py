"""CPU-side benchmark of libgpupool against the CUDA simulator (no GPU needed).

Measures, in one run: the cudaMalloc+cudaFree pair of a cached size through the preloaded
hooks next to glibc's malloc+free of the same size (with 0, 1, 1 000 and 100 000 other blocks
live), the same pair in instructions (bench/hit_instructions.sh, with valgrind), the
simulator's own pair without the pool, the pass-through cost with
GPUPOOL_DISABLE=1, and the wall time of the overlap loop (tests/c/overlap.c) in each
GPUPOOL_REUSE mode against no pool and against the ideal. Then the policy comparison: the
generated workloads (training, inference, RMM's random allocations) replayed through our pool
and the policies it is compared with (`gpupool-trace compare`), the trace replay's own speed,
the trace recorded on an H200, and the pool API's multi-thread scaling (crates/gpupool-lab/benches/threads.rs).
The runs are listed in tools/bench_manifest.py. Targets are reported, never asserted.

Writes bench/results/cpu.md and bench/results/policies.md, the same tables into the sections
of BENCHMARKS.md between <!-- bench:begin --> / <!-- bench:end --> and <!-- policies:begin -->
/ <!-- policies:end -->, and the charts into bench/figures/; prints both reports. Raw program
output: target/bench/bench.log (under CARGO_TARGET_DIR where it is set, as cargo builds there).

usage: scripts/bench.sh
"""

import gzip
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import bench_manifest as manifest
import bench_report
import render

ROOT = Path(__file__).resolve().parent.parent
CPU_TITLE = "CPU side: the hit path, the counters, the overlap loop"
POLICIES_TITLE = "CPU side: the policies side by side, the replay, the threads"


class Failed(Exception):
    """A run failed; the benchmark stops."""


def clean_environment():
    """No inherited pool or simulator settings, no foreign preload."""
    for name in list(os.environ):
        if name.startswith(("GPUPOOL_", "CUDASIM_")) or name == "LD_PRELOAD":
            del os.environ[name]


def pinning():
    """taskset's arguments that pin a run to the last CPU this process may use, when taskset
    works; else none."""
    if not shutil.which("taskset"):
        return []
    cpu = str(max(os.sched_getaffinity(0)))
    ok = subprocess.run(["taskset", "-c", cpu, "true"], capture_output=True).returncode == 0
    return ["taskset", "-c", cpu] if ok else []


def target_dir():
    """Where cargo builds: CARGO_TARGET_DIR where set (relative to the checkout, as
    scripts/simlib.sh reads it), else ./target."""
    return (ROOT / os.environ.get("CARGO_TARGET_DIR", "target")).resolve()


def build(bench):
    """The library and the simulator, and the library once more without its hit-path counters
    (the `stats` feature), to price them; then the benchmark programs against the simulator."""

    def to_stderr(argv):
        if subprocess.run(argv, stdout=sys.stderr).returncode != 0:
            raise Failed(" ".join(argv))

    to_stderr(["cargo", "build", "--release", "--workspace", "--quiet"])
    to_stderr(
        [
            "cargo",
            "build",
            "--release",
            "--quiet",
            "-p",
            "gpupool",
            "--lib",
            "--no-default-features",
            "--target-dir",
            str(target_dir() / "bench-nostats"),
        ]
    )
    bench.mkdir(parents=True, exist_ok=True)
    # scripts/simlib.sh's sim_cc, the one definition of how programs build against the simulator.
    sim_cc = 'PROFILE=release; source scripts/simlib.sh; sim_cc "$@"'
    for src in [*sorted((ROOT / "bench").glob("*.c")), ROOT / "tests/c/overlap.c"]:
        to_stderr(["bash", "-c", sim_cc, "sim_cc", str(bench / src.stem), str(src)])


class Runner:
    """Runs the measures, appends each command and its output to the log, keeps the figures."""

    def __init__(self, log, pin):
        self.log = log
        self.pin = pin
        self.figures = {}
        self.wall_ns = {}
        log.write_text("")

    def run(self, m):
        program = manifest.missing(m)
        if program:
            print(f"bench: {m.name} skipped: no {program}", file=sys.stderr)
            self.figures[m.name] = manifest.not_measured(program)
            return
        if m.build:
            if subprocess.run(list(m.argv), stdout=sys.stderr).returncode != 0:
                raise Failed(" ".join(m.argv))
            return
        env = dict(os.environ, **dict(m.env))
        shown = " ".join([f"{k}={v}" for k, v in m.env] + list(m.argv))
        argv = (self.pin if m.pin else []) + list(m.argv)
        t0 = time.perf_counter_ns()
        r = subprocess.run(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.wall_ns[m.name] = time.perf_counter_ns() - t0
        with open(self.log, "a") as f:
            f.write(f"$ {shown}\n{r.stdout}")
        if r.returncode != 0:
            raise Failed(f"{shown}\n{r.stdout}")
        if m.parse:
            try:
                self.figures[m.name] = m.parse(r.stdout)
            except ValueError as e:
                raise Failed(f"{shown}: {e}") from e


def git_commit():
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    )
    commit = head.stdout.strip() if head.returncode == 0 else "unknown"
    status = subprocess.run(
        ["git", "status", "--porcelain"], capture_output=True, text=True, cwd=ROOT
    )
    return commit + (" (with uncommitted changes)" if status.stdout.strip() else "")


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main():
    os.chdir(ROOT)
    clean_environment()
    bench = target_dir() / "bench"
    rel = target_dir() / "release"
    figures = bench / "figures"
    scratch = {
        "trace_file": bench / "bench.trace",
        "replay_trace": bench / "inference.trace",
        "h200_trace": bench / "h200-torch-train.trace",
    }
    try:
        build(bench)
        figures.mkdir(parents=True, exist_ok=True)
        with gzip.open(ROOT / "bench/traces/h200-torch-train.trace.gz") as src, open(
            scratch["h200_trace"], "wb"
        ) as dst:
            shutil.copyfileobj(src, dst)
        pin = pinning()
        runner = Runner(bench / "bench.log", pin)
        steps = manifest.manifest(
            str(bench),
            str(rel),
            str(rel / "libgpupool.so"),
            str(target_dir() / "bench-nostats/release/libgpupool.so"),
            *(str(p) for p in scratch.values()),
            str(figures),
        )
        stage = None
        for m in steps:
            if manifest.stage(m.name) != stage:
                stage = manifest.stage(m.name)
                print(f"bench: {stage}...", file=sys.stderr)
            runner.run(m)
        trace = scratch["trace_file"]
        trace_bytes = trace.stat().st_size if trace.exists() else 0
        records = (scratch["replay_trace"].stat().st_size - 8) // 40
    except Failed as e:
        print(f"bench: failed: {e}", file=sys.stderr)
        return 1
    finally:
        for p in scratch.values():
            p.unlink(missing_ok=True)

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "system": " ".join(platform.uname()[i] for i in (0, 2, 4)),
        "cpus": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "commit": git_commit(),
        "pin": " ".join(pin) or "no",
        "trace_bytes": trace_bytes,
        "replay_records": records,
    }
    results = bench_report.Results(runner.figures, runner.wall_ns)
    # Each report goes into BENCHMARKS.md and into its own page in bench/results/, whose
    # links to the charts start one folder down.
    cpu = bench_report.cpu(results, meta)
    pages = (
        ("bench", "cpu.md", CPU_TITLE, cpu, cpu),
        (
            "policies",
            "policies.md",
            POLICIES_TITLE,
            bench_report.policies(results, meta),
            bench_report.policies(results, meta, figures="../figures"),
        ),
    )
    out_dir = ROOT / "bench/results"
    out_dir.mkdir(parents=True, exist_ok=True)
    doc_path = ROOT / "BENCHMARKS.md"
    doc = doc_path.read_text() if doc_path.exists() else "# Benchmarks\n"
    for marker, file, title, in_doc, in_page in pages:
        print(in_doc)
        (out_dir / file).write_text(f"# {title}\n\n{in_page}\n")
        doc = render.replace_section(doc, marker, in_doc)
    doc_path.write_text(doc)
    (ROOT / "bench/figures").mkdir(parents=True, exist_ok=True)
    for chart in ("training.svg", "inference.svg"):
        shutil.copyfile(figures / chart, ROOT / "bench/figures" / chart)
    print(
        f"bench: wrote {doc_path}, bench/results/ and bench/figures/ "
        f"(raw output: {bench / 'bench.log'})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
