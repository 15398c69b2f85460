#!/usr/bin/env bash
# Instructions per cached cudaMalloc+cudaFree pair through the preloaded library, counted by
# valgrind's callgrind, next to glibc's malloc+free of the same size in the same configuration
# (docs/design-notes.md, "Note: the hit path's budget"). Builds what it needs; prints a Markdown
# table on stdout. Instruction counts do not depend on the machine's load, unlike the
# nanoseconds (a native run of the same program, given for context).
#
# usage: bench/hit_instructions.sh [SIZE]   (default 1048576, a small pool's largest size)
#
# Each figure is (count(2N) - count(N)) / (7 N): bench/hit_path.c times 7 repetitions of N
# pairs, and the difference of two runs cancels the start-up and the warm-up.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
SIZE=${1:-1048576}
N=20000

command -v valgrind >/dev/null || { echo "hit_instructions.sh: valgrind is needed" >&2; exit 1; }
# A clean environment: no inherited pool or simulator settings, no foreign preload.
while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(GPUPOOL|CUDASIM)_' || true)
unset LD_PRELOAD

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
cargo build --release --quiet -p gpupool --lib >&2
cargo build --release --quiet -p cudasim >&2
lib=$CARGO_TARGET_DIR/release/libgpupool.so
PROFILE=release
# shellcheck source=scripts/simlib.sh
source scripts/simlib.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sim_cc "$work/hit_path" bench/hit_path.c -ldl

# count DEVICES REUSE LIVE MODE ITERATIONS: instructions of one whole run.
count() {
    env CUDASIM_DEVICES="$1" GPUPOOL_REUSE="$2" LD_PRELOAD="$lib" \
        valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
        "$work/hit_path" "$3" "$SIZE" "$5" "$4" >/dev/null 2>"$work/vg.log" ||
        { cat "$work/vg.log" >&2; exit 1; }
    grep -m1 'Collected' "$work/vg.log" | awk '{gsub(",", "", $4); print $4}'
}

# per_pair DEVICES REUSE LIVE MODE: instructions per pair.
per_pair() {
    local a b
    a=$(count "$@" "$N")
    b=$(count "$@" $((2 * N)))
    echo $(((b - a) / (7 * N)))
}

# ns DEVICES REUSE LIVE MODE: the median nanoseconds per pair of a native run.
ns() {
    env CUDASIM_DEVICES="$1" GPUPOOL_REUSE="$2" LD_PRELOAD="$lib" \
        "$work/hit_path" "$3" "$SIZE" 200000 "$4" | awk -F= '/^ns_per_pair=/ {print $2}'
}

# name DEVICES REUSE LIVE MODE
configs=(
    "strict, 2 devices|2 strict 0 cuda"
    "strict, 1 device|1 strict 0 cuda"
    "barrier, 2 devices|2 barrier 0 cuda"
    "relaxed, 2 devices|2 relaxed 0 cuda"
    "torch (legacy stream), strict|2 strict 0 torch"
    "torch-stream (own stream), strict|2 strict 0 torch-stream"
    "cudaMallocAsync (PyTorch's backend under the preload), strict|2 strict 0 async"
    "cudaMallocAsync on the program's own stream, strict, 1 device|1 strict 0 async-stream"
    "cuMemAlloc_v2 (the driver hooks: static runtimes, XLA), strict|2 strict 0 driver"
    "cuMemAllocAsync on the program's own stream, strict, 1 device|1 strict 0 driver-async-stream"
    "strict, 2 devices, 100 000 live blocks|2 strict 100000 cuda"
)

echo "Instructions per cached allocate+free pair of $SIZE bytes (callgrind; glibc: malloc+free"
echo "of the same size in the same configuration)."
echo
echo "| configuration | pool | glibc | ratio | pool ns | glibc ns |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for c in "${configs[@]}"; do
    name=${c%%|*}
    read -r dev reuse live mode <<<"${c#*|}"
    pool=$(per_pair "$dev" "$reuse" "$live" "$mode")
    glibc=$(per_pair "$dev" "$reuse" "$live" glibc)
    ratio=$(awk -v p="$pool" -v g="$glibc" 'BEGIN { printf "%.2f", p / g }')
    echo "| $name | $pool | $glibc | ${ratio}x | $(ns "$dev" "$reuse" "$live" "$mode") |" \
        "$(ns "$dev" "$reuse" "$live" glibc) |"
done
