#!/usr/bin/env bash
# The GPU machine as gpu-check's report describes it: host, GPU and driver, nvcc,
# compute-sanitizer, Python and PyTorch. Reads NVCC_BIN, SANITIZER and PYTHON (empty: not found).
echo "== host"
uname -srm
echo "cores $(nproc)"
echo "== nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
else
    echo "nvidia-smi: not found"
fi
echo "== nvcc"
if [ -n "${NVCC_BIN:-}" ]; then echo "$NVCC_BIN"; "$NVCC_BIN" --version | tail -n 2; else echo "nvcc: not found"; fi
echo "== compute-sanitizer"
if [ -n "${SANITIZER:-}" ]; then echo "$SANITIZER"; "$SANITIZER" --version 2>&1 | tail -n 1; else echo "compute-sanitizer: not found"; fi
echo "== python / torch"
timeout 90 "$PYTHON" "$(dirname "$0")/torch_probe.py" 2>&1 | grep -v Warning || echo "torch probe failed"
