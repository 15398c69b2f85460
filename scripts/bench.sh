#!/usr/bin/env bash
# CPU-side benchmark of libgpupool against the CUDA simulator (no GPU needed): the hit path,
# the overlap loop, the policy comparison, the trace replay and the threads. The runs and the
# reports are in tools/bench.py and the files beside it; it writes bench/results/,
# BENCHMARKS.md's marked sections and bench/figures/. Targets are reported, never asserted.
#
# usage: scripts/bench.sh
set -euo pipefail
exec python3 "$(dirname "$0")/../tools/bench.py"
