#!/usr/bin/env bash
# The main job: build libgpupool and run a training-like allocation workload twice, without and
# with the pool, then print the pool's exit summary. On a machine with an NVIDIA GPU and the CUDA
# toolkit it runs on the GPU; otherwise on the project's CUDA runtime simulator.
#
# usage: scripts/demo.sh [STEPS] [LAYERS]     (default 20 steps of a 12-layer model)
set -euo pipefail
case ${1:-} in
    -h|--help)
        echo "usage: scripts/demo.sh [STEPS] [LAYERS]     (default 20 steps of a 12-layer model)"
        echo "Builds libgpupool and runs a training-like allocation workload without and with it,"
        echo "then prints the pool's exit summary (on a GPU if there is one, else on the simulator)."
        exit 0 ;;
esac
cd "$(dirname "$0")/.."
steps=${1:-20}
layers=${2:-12}
export CARGO_TERM_COLOR=never
echo "== building libgpupool (cargo build --release)"
cargo build --release --workspace --quiet
# Where cargo built: CARGO_TARGET_DIR where set, as scripts/simlib.sh reads it too.
target_dir=$(realpath -m "${CARGO_TARGET_DIR:-$PWD/target}")
lib=$target_dir/release/libgpupool.so
out=$target_dir/demo
mkdir -p "$out"
# LD_PRELOAD splits at spaces and colons, and a program's library search path (its rpath) at
# colons: a checkout whose path holds one is reached through links in a plain temporary directory.
case $lib in
    *[[:space:]:]*)
        link_dir=$(mktemp -d)
        trap 'rm -rf "$link_dir"' EXIT
        ln -s "$lib" "$link_dir/libgpupool.so"
        lib=$link_dir/libgpupool.so ;;
esac

nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -n 1 || true)
if nvidia-smi -L >/dev/null 2>&1 && [ -n "$nvcc" ]; then
    where="on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
    "$nvcc" -O2 -cudart shared -x cu examples/train_workload.c -o "$out/train_workload"
    run_env=()
else
    where="on the CUDA runtime simulator (no GPU found); it adds 20 us to every real"
    where+=" cudaMalloc/cudaFree to model the driver's cost"
    PROFILE=release
    # shellcheck source=scripts/simlib.sh
    source scripts/simlib.sh
    if [ -n "${link_dir:-}" ]; then
        ln -s "$SIMLIB" "$link_dir/simlib"
        SIMLIB=$link_dir/simlib
    fi
    sim_cc "$out/train_workload" examples/train_workload.c
    run_env=(CUDASIM_MALLOC_US=20 CUDASIM_FREE_US=20)
fi
echo "== running ${steps} steps of a ${layers}-layer transformer's allocations ${where}"
echo
echo "-- without the pool: every tensor is a real cudaMalloc/cudaFree"
env "${run_env[@]}" "$out/train_workload" "$steps" "$layers"
echo
echo "-- with the pool: LD_PRELOAD=$lib"
env "${run_env[@]}" GPUPOOL_SUMMARY=stderr LD_PRELOAD="$lib" \
    "$out/train_workload" "$steps" "$layers"
