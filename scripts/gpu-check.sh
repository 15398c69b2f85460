#!/usr/bin/env bash
# Real-GPU checks of libgpupool: the one command run on a GPU machine.
#
# usage: scripts/gpu-check.sh [--dry-run] [--out DIR]   (--help: the options and variables)
#
# The steps, the build, the runs and the report are in tools/gpu_check.py and the files beside
# it (Python 3.8 or newer, standard library only: the GPU machine has no network). This finds
# an interpreter for it: python3 on PATH, else PyTorch's.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for py in python3 /opt/torch/.venv/bin/python3; do
    if command -v "$py" >/dev/null 2>&1; then
        exec "$py" "$root/tools/gpu_check.py" "$@"
    fi
done
echo "gpu-check: no python3 found (PATH, /opt/torch/.venv/bin)" >&2
exit 2
