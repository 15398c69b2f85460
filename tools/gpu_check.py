"""Real-GPU checks of libgpupool (the tests everywhere else run against cudasim/).

Builds tests/gpu/*.cu with nvcc (-cudart shared, so LD_PRELOAD interposes the runtime), runs
them with and without target/release/libgpupool.so preloaded, runs a small PyTorch training
loop several ways (native, without caching, under the preload, as a pluggable allocator), times
torch.empty + del pairs with PyTorch's allocator and with ours (tests/gpu/torch_hit.py), and
compute-sanitizer's memcheck on the churn test. The steps are listed in tools/gpu_manifest.py.
Every step has its own timeout; a failing step is recorded and the run goes on. Results:
RESULTS/gpu-results.md (Markdown summary), RESULTS/steps.tsv, RESULTS/logs/*.log; a short table
is printed at the end. Where $OUT is set (the lent GPU machine's folder whose files come back:
at most 8), the results go to ./gpu-results and, after every step, gpu-results.md, steps.tsv
and logs.tgz (the logs) are copied into $OUT, so that a run stopped at its time limit still
brings them back.

usage: scripts/gpu-check.sh [--dry-run] [--out DIR]
  --dry-run   no GPU needed: check the library, nvcc (build the sources when it is there),
              python syntax, this tool's syntax, and print what a real run would run.
  --out DIR   results directory (default: ./gpu-results)
Environment: GPUPOOL_LIB (library, default target/release/libgpupool.so), NVCC, PYTHON
(default /opt/torch/.venv/bin/python3 if present, else python3), GPU_CHECK_BUDGET (seconds for
the whole run, default 390; steps that would start after it are skipped), GPU_CHECK_QUICK=1
(smaller iteration counts), GPU_CHECK_COMMIT (the commit the report names, for a copy of the
tree without .git).

Exit status: 0 when every correctness check passed or was skipped as unsupported (benchmarks and
informational runs never fail the run), 1 otherwise (a check that failed, timed out, or was
not run for lack of time), 2 for bad arguments.
"""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import gpu_build
import gpu_manifest as manifest
import gpu_report
import steps
from steps import FAILED, SANITIZER, TORCH

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
WRAPPER = ROOT / "scripts" / "gpu-check.sh"


class Stopped(Exception):
    """The run was stopped by a signal."""


def _stop(signum, frame):
    raise Stopped()


def git(*args):
    try:
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    except OSError:
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def commit():
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"]
    head = git("rev-parse", "--short", "HEAD")
    if head is None:
        return "unknown"
    return head + (" (+ uncommitted changes)" if git("status", "--porcelain") else "")


class Check:
    """One run of the GPU check: where its files go, what it found, what each step gave."""

    def __init__(self, dry, out):
        self.dry = dry
        self.start = time.monotonic()
        self.budget = int(os.environ.get("GPU_CHECK_BUDGET") or 390)
        res = Path(out) if out else ROOT / "gpu-results"
        res = res if res.is_absolute() else ROOT / res
        (res / "logs").mkdir(parents=True, exist_ok=True)
        self.res = res.resolve()
        self.logs = self.res / "logs"
        # Resolved too, so that --out naming $OUT another way never copies files onto themselves.
        self.publish_dir = None
        if os.environ.get("OUT"):
            pub = Path(os.environ["OUT"])
            pub.mkdir(parents=True, exist_ok=True)
            self.publish_dir = pub.resolve()
        self.build = ROOT / "target" / "gpu-check"
        self.build.mkdir(parents=True, exist_ok=True)
        lib = os.environ.get("GPUPOOL_LIB") or str(ROOT / "target/release/libgpupool.so")
        self.lib = lib if os.path.isabs(lib) else str(ROOT / lib)
        self.src = ROOT / "tests" / "gpu"
        default_py = "/opt/torch/.venv/bin/python3"
        self.python = os.environ.get("PYTHON") or (
            default_py if os.access(default_py, os.X_OK) else "python3"
        )
        counts = manifest.QUICK if os.environ.get("GPU_CHECK_QUICK") == "1" else manifest.Counts()
        self.nvcc = gpu_build.find_nvcc()
        self.sanitizer = gpu_build.find_sanitizer(self.nvcc)
        self.steps = manifest.manifest(
            str(self.build), str(self.src), self.lib, self.python, self.sanitizer, counts
        )
        self.records = []
        self.built = set()
        self.children = []
        self.stopping = False
        self._torch = None  # whether PYTHON can import torch, asked once
        (self.res / "steps.tsv").write_text("")

    def elapsed(self):
        return int(time.monotonic() - self.start)

    def left(self):
        return self.budget - self.elapsed()

    def status(self, name):
        return next((r[2] for r in self.records if r[0] == name), "-")

    # Recording ---------------------------------------------------------------------------

    def record(self, name, kind, status, secs, note, quiet=False):
        self.records.append((name, kind, status, secs, note))
        with open(self.res / "steps.tsv", "a") as f:
            f.write(f"{name}\t{kind}\t{status}\t{secs}\t{note}\n")
        if not quiet:
            print(f"gpu-check: {name:<26} {kind:<6} {status:<8} {secs:>4}s  {note}", flush=True)
        self.write_report()

    def results(self):
        def read_log(name):
            p = self.logs / f"{name}.log"
            return p.read_text(errors="replace") if p.is_file() else None

        return gpu_report.Results(self.records, self.steps, read_log)

    def write_report(self):
        lib_sha = ""
        if os.path.isfile(self.lib):
            lib_sha = hashlib.sha256(Path(self.lib).read_bytes()).hexdigest()[:16]
        meta = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "dry": self.dry,
            "lib": self.lib,
            "lib_sha": lib_sha,
            "commit": commit(),
            "elapsed": self.elapsed(),
            "budget": self.budget,
            "published": self.publish_dir is not None,
        }
        tmp = self.res / "gpu-results.md.tmp"
        tmp.write_text(gpu_report.report(self.results(), meta))
        tmp.replace(self.res / "gpu-results.md")
        self.publish()

    def publish(self):
        """Copy the report, the steps and the logs (one archive) into $OUT, if set."""
        pub = self.publish_dir
        if pub is None or pub == self.res:
            return
        for name in ("gpu-results.md", "steps.tsv"):
            shutil.copyfile(self.res / name, pub / name)
        with tarfile.open(pub / "logs.tgz.tmp", "w:gz") as tar:
            tar.add(self.logs, arcname="logs")
        (pub / "logs.tgz.tmp").replace(pub / "logs.tgz")

    # Running -----------------------------------------------------------------------------

    def timed(self, argv, log, limit, header):
        """Runs argv under timeout(1) with `limit` seconds (then KILL 5 s later), stdin from
        /dev/null, its output appended to `log` after the header line. Returns the exit code."""
        if self.stopping:
            return 143
        with open(log, "a") as f:
            f.write(header + "\n")
            f.flush()
            p = subprocess.Popen(
                ["timeout", "-k", "5", str(limit), *argv],
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
            )
            self.children.append(p)
            try:
                return p.wait()
            except Stopped:
                p.terminate()  # timeout(1) passes it on to the step's program
                raise
            finally:
                self.children.remove(p)

    def unmet(self, step):
        """Why `step` cannot run here (None: it can)."""
        if SANITIZER in step.needs and not self.sanitizer:
            return "SKIP", "compute-sanitizer not found"
        if TORCH in step.needs and not self.has_torch():
            return ("FAIL" if step.kind == "check" else "SKIP"), f"{self.python} has no torch"
        if step.program and step.program not in self.built:
            return ("FAIL" if step.kind == "check" else "SKIP"), "not built"
        return None

    def has_torch(self):
        if self._torch is None:
            probe = (
                "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
            )
            try:
                self._torch = subprocess.run([self.python, "-c", probe]).returncode == 0
            except OSError:
                self._torch = False
        return self._torch

    def run_step(self, step):
        if step.diagnoses and self.status(step.diagnoses) not in FAILED:
            return
        if self.dry:
            print(
                f"[dry-run] would run {step.name} ({step.kind}, timeout {step.timeout}s): "
                f"{step.shown()}"
            )
            self.record(step.name, step.kind, "SKIP", 0, "dry run", quiet=True)
            return
        why = self.unmet(step)
        if why:
            self.record(step.name, step.kind, why[0], 0, why[1])
            return
        rem = self.left()
        if rem < 15:
            # A correctness check that never ran is not a pass: NOTRUN counts as a failure.
            status = "NOTRUN" if step.kind == "check" else "SKIP"
            self.record(step.name, step.kind, status, 0, f"time budget ({self.budget}s) spent")
            return
        limit = min(step.timeout, rem - 5)
        log = self.logs / f"{step.name}.log"
        log.write_text("")
        t0 = time.monotonic()
        cmd = step.command()
        rc = self.timed(cmd, log, limit, "$ " + " ".join(cmd))
        status, note = steps.judge(step, rc, log.read_text(errors="replace"), limit)
        self.record(step.name, step.kind, status, int(time.monotonic() - t0), note)

    # The harness itself ------------------------------------------------------------------

    def harness(self):
        t0 = time.monotonic()
        log = self.logs / "self_syntax.log"
        r = subprocess.run(["bash", "-n", str(WRAPPER)], capture_output=True, text=True)
        errors = r.stderr.splitlines()
        for py in sorted(TOOLS.glob("*.py")):
            try:
                compile(py.read_text(), str(py), "exec")
            except SyntaxError as e:
                errors.append(f"{py.name}: {e}")
        log.write_text("\n".join(errors) + ("\n" if errors else ""))
        secs = int(time.monotonic() - t0)
        if errors:
            self.record("self_syntax", "check", "FAIL", secs, f"syntax: {errors[0]}")
        else:
            self.record("self_syntax", "check", "PASS", secs, "bash -n, compile")

        if os.path.isfile(self.lib):
            self.record("library", "check", "PASS", 0, self.lib)
        elif self.dry:
            self.record(
                "library",
                "info",
                "WARN",
                0,
                f"missing: {self.lib} (a real run would fail; build with cargo build --release)",
            )
        else:
            self.record("library", "check", "FAIL", 0, f"missing: {self.lib}")

        # The environments every step runs in (a program that uses no CUDA: the pool stays
        # silent).
        t0 = time.monotonic()
        log = self.logs / "clean_env.log"
        clean = steps.clean_prefix() + ["true"]
        pooled = steps.clean_prefix() + [f"{k}={v}" for k, v in manifest.pool(self.lib, "strict")]
        with open(log, "w") as f:
            ran = all(
                subprocess.run(c, stdout=f, stderr=subprocess.STDOUT).returncode == 0
                for c in (clean, pooled + ["true"])
            )
        printed = log.read_text().splitlines()
        secs = int(time.monotonic() - t0)
        if not ran:
            self.record("clean_env", "check", "FAIL", secs, printed[0] if printed else "")
        elif printed:
            # The pool must print nothing in a process that used no CUDA, summary asked or not.
            self.record(
                "clean_env", "check", "FAIL", secs, f"a program without CUDA printed: {printed[0]}"
            )
        else:
            self.record(
                "clean_env",
                "check",
                "PASS",
                secs,
                "the clean and pooled environments run a program, silently",
            )

        for py in manifest.PY_PROGRAMS:
            t0 = time.monotonic()
            log = self.logs / f"{py}_syntax.log"
            code = (
                "import py_compile, sys; py_compile.compile(sys.argv[1], "
                f"cfile='{self.build}/{py}.pyc', doraise=True)"
            )
            with open(log, "w") as f:
                rc = subprocess.run(
                    [self.python, "-c", code, str(self.src / f"{py}.py")],
                    stdout=f,
                    stderr=subprocess.STDOUT,
                ).returncode
            secs = int(time.monotonic() - t0)
            if rc == 0:
                self.record(f"{py}_syntax", "check", "PASS", secs, f"py_compile ({self.python})")
            else:
                last = (log.read_text().splitlines() or [""])[-1]
                self.record(f"{py}_syntax", "check", "FAIL", secs, last)

    def environment(self):
        if self.dry:
            (self.logs / "env.log").write_text(
                "== dry run: no GPU probes\n"
                f"{' '.join(os.uname()[i] for i in (0, 2, 4))}\n"
                f"nvcc: {self.nvcc or 'not found'}\n"
                f"compute-sanitizer: {self.sanitizer or 'not found'}\n"
                f"python: {self.python}\n"
            )
            self.record("env", "info", "SKIP", 0, "dry run (GPU probes not run)")
            return
        self.run_step(
            steps.Step(
                "env",
                "info",
                (steps.GPU,),
                ("bash", str(TOOLS / "env_probe.sh")),
                120,
                (("NVCC_BIN", self.nvcc), ("SANITIZER", self.sanitizer), ("PYTHON", self.python)),
                clean=False,
            )
        )

    # Build -------------------------------------------------------------------------------

    # The whole run -----------------------------------------------------------------------

    def run(self):
        self.harness()
        self.environment()
        gpu_build.build_all(self)
        for step in self.steps:
            self.run_step(step)

    def build_limit(self):
        """Seconds one nvcc attempt may take: a quarter of what is left, 10 to 90 (a build
        takes seconds; a hung one must not eat the steps' time)."""
        return max(10, min(90, self.left() // 4))

    def stop(self):
        self.stopping = True
        for p in list(self.children):
            p.terminate()
        self.record(
            "interrupted", "info", "FAIL", self.elapsed(), "the script was stopped by a signal"
        )


def main(argv):
    dry, out = False, ""
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--dry-run":
            dry = True
        elif a == "--out":
            out = args.pop(0) if args else ""
        elif a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        else:
            print(f"gpu-check: unknown argument '{a}' (try --help)", file=sys.stderr)
            return 2
    try:
        check = Check(dry, out)
    except OSError as e:
        print(f"gpu-check: {e}", file=sys.stderr)
        return 2
    # Line by line: a run stopped at the machine's time limit still shows what it printed.
    sys.stdout.reconfigure(line_buffering=True)
    os.chdir(ROOT)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        check.run()
    except Stopped:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        check.stop()
        return 1
    check.write_report()
    res = check.results()
    print()
    print(f"== gpu-check {'(dry run) ' if dry else ''}results: {check.res}/gpu-results.md")
    for line in gpu_report.console(res, dry):
        print(line)
    failed = res.failed()
    print(f"correctness checks failed: {failed}   (elapsed {check.elapsed()} s)")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
