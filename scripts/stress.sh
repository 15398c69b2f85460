#!/usr/bin/env bash
# Longer stress than the suite's: runs tests/c/churn (threads on two devices, every block tagged
# and checked, a third of the frees made by another thread) under the preloaded pool, in every
# reuse mode, with and without a release threshold, with random sizes and with a few repeating
# ones (which thread caches serve in relaxed mode), with a fresh seed each round, until
# DURATION seconds have passed. A failure prints the command that reproduces it.
#
# usage: scripts/stress.sh DURATION [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:?usage: scripts/stress.sh DURATION [THREADS]}
threads=${2:-16}
cargo build --quiet --release -p gpupool --lib -p cudasim
PROFILE=release
# shellcheck source=scripts/simlib.sh
source scripts/simlib.sh
lib=$TARGET_DIR/release/libgpupool.so
exe=$TARGET_DIR/release/stress-churn
sim_cc "$exe" tests/c/churn.c
end=$((SECONDS + duration))
seed=${STRESS_SEED:-$(date +%s)}
rounds=0
while ((SECONDS < end)); do
    for mode in strict barrier relaxed; do
        for variant in none:random 64MiB:random none:few; do
            threshold=${variant%%:*} sizes=${variant#*:}
            cmd=(env LD_PRELOAD="$lib" CUDASIM_DEVICES=2 CUDASIM_MEM=8GiB GPUPOOL_REUSE=$mode
                 GPUPOOL_RELEASE_THRESHOLD=$threshold "$exe" "$threads" 3000 2 "$seed" 35 "$sizes")
            if ! out=$(timeout 300 "${cmd[@]}" 2>&1); then
                echo "$out" | tail -20
                echo "FAILED (seed $seed); reproduce with:"
                printf '%q ' "${cmd[@]}"
                echo
                exit 1
            fi
            seed=$((seed + 1))
            rounds=$((rounds + 1))
        done
    done
done
echo "stress ok: $rounds runs in ${SECONDS}s, last seed $((seed - 1))"
