"""Steps as data, and what decides a step's result: the command it runs (program, arguments,
environment), what its output must show for a pass, and how a finished run is judged."""

from __future__ import annotations  # `str | None` fields on Pythons before 3.10

import re
from dataclasses import dataclass

import kv

# What a step can need besides its program: a GPU (a dry run lists such a step without running
# it), PyTorch in $PYTHON, compute-sanitizer.
GPU, TORCH, SANITIZER = "gpu", "torch", "compute-sanitizer"

# Every step runs without an inherited preload, pool or PyTorch allocator settings, with Python
# unbuffered so that a step killed at its timeout still leaves what it printed.
CLEAN_UNSET = (
    "LD_PRELOAD",
    "GPUPOOL_DISABLE",
    "GPUPOOL_DRIVER_HOOKS",
    "GPUPOOL_EXPANDABLE",
    "GPUPOOL_RELEASE_THRESHOLD",
    "GPUPOOL_REUSE",
    "GPUPOOL_MAX_SPLIT_SIZE",
    "GPUPOOL_FENCE_BYTES",
    "GPUPOOL_SUMMARY",
    "GPUPOOL_CUDART",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUDA_LAUNCH_BLOCKING",
)
CLEAN_SET = (("PYTHONUNBUFFERED", "1"),)


def clean_prefix():
    """env(1)'s arguments for the clean environment (its options first: env takes everything
    after the first NAME=VALUE as the command)."""
    out = ["env"]
    for name in CLEAN_UNSET:
        out += ["-u", name]
    return out + [f"{k}={v}" for k, v in CLEAN_SET]


# How a dry run shows the clean environment.
CLEAN_SHOWN = "env -u LD_PRELOAD -u GPUPOOL_* -u PYTORCH_..."


@dataclass(frozen=True)
class Is:
    """A record of the program's output has key=value."""

    key: str
    value: str

    def holds(self, recs, lines):
        return any(r.get(self.key) == self.value for r in recs)

    def __str__(self):
        return f"{self.key}={self.value}"


@dataclass(frozen=True)
class Positive:
    """A record of the program's output has key=N with N > 0."""

    key: str

    def holds(self, recs, lines):
        return any(_number(r.get(self.key)) > 0 for r in recs)

    def __str__(self):
        return f"{self.key}>0"


@dataclass(frozen=True)
class Has:
    """A record of the program's output has the key."""

    key: str

    def holds(self, recs, lines):
        return any(self.key in r for r in recs)

    def __str__(self):
        return f"{self.key}=..."


@dataclass(frozen=True)
class Line:
    """A line of the log matches the extended regex: for text the program does not print as
    key=value (the pool's summary on stderr, compute-sanitizer's report)."""

    regex: str

    def holds(self, recs, lines):
        pattern = re.compile(self.regex)
        return any(pattern.search(line) for line in lines)

    def __str__(self):
        return f"a line matching '{self.regex}'"


@dataclass(frozen=True)
class Absent:
    """No line of the log matches the extended regex: for what must not be printed (the
    pool's out-of-memory report in a run that never ran out)."""

    regex: str

    def holds(self, recs, lines):
        return not Line(self.regex).holds(recs, lines)

    def __str__(self):
        return f"no line matching '{self.regex}'"


def _number(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


@dataclass(frozen=True)
class Step:
    """One run of a program. `argv` runs in the clean environment plus `env` (or, with clean
    False, in the caller's environment plus `env`). `program`: the test program it runs, whose
    build must have passed. `expect`: what the log must show for a pass. `skip_if`: a regex
    (any case) whose match in the log makes it SKIP: the tool says it is not supported here.
    `diagnoses`: the step runs only when that earlier step failed. `reads`: the keys the report
    takes from its output."""

    name: str
    kind: str  # check (a failure fails the run) | bench | info (recorded only)
    needs: tuple
    argv: tuple
    timeout: int
    env: tuple = ()
    expect: tuple = ()
    program: str | None = None
    skip_if: str | None = None
    diagnoses: str | None = None
    reads: tuple = ()
    clean: bool = True

    def command(self):
        """The whole command line, environment included, as it runs."""
        pairs = [f"{k}={v}" for k, v in self.env]
        if self.clean:
            return clean_prefix() + pairs + list(self.argv)
        return (["env"] + pairs if pairs else []) + list(self.argv)

    def shown(self):
        """The command line as a dry run prints it."""
        line = " ".join(self.command())
        return line.replace(" ".join(clean_prefix()), CLEAN_SHOWN, 1)


FAILED = ("FAIL", "TIMEOUT", "NOTRUN")
# The first line of a failed step's log that says why.
_WHY = re.compile(r"FAIL|rror|CLOBBERED")


def judge(step, rc, log_text, timeout):
    """(status, note) of a finished run: SKIP when the tool says it is not supported here (a
    tool that says so and then hangs has not failed), TIMEOUT, FAIL with the first line that
    says why, FAIL when an expected line is missing, else PASS."""
    lines = log_text.splitlines()
    if step.skip_if:
        m = re.search(step.skip_if, log_text, re.IGNORECASE)
        if m:
            return "SKIP", m.group(0)
    if rc in (124, 137):
        return "TIMEOUT", f"killed after {timeout}s"
    if rc != 0:
        why = next((l for l in lines if _WHY.search(l) and not l.startswith("$ ")), "")
        return "FAIL", f"rc {rc}: {why[:160]}"
    recs = kv.records(log_text)
    for e in step.expect:
        if not e.holds(recs, lines):
            return "FAIL", f"rc 0 but no {e}"
    return "PASS", "rc 0"
