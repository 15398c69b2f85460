#!/usr/bin/env bash
# Runs representative C test programs under valgrind's memcheck with the pool preloaded, against
# the CUDA runtime simulator: any memory error, or any definitely lost block, fails the run.
# (Possibly lost blocks are not errors: the pool's dump thread's stack and the simulator's
# tables live until exit by design.) No suppression file is needed today; add one here, with a
# comment per entry saying why, if a libc or toolchain report ever has to be silenced.
#
# usage: scripts/valgrind.sh        (called by scripts/test.sh; installs valgrind if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v valgrind >/dev/null; then
    echo "valgrind not found; installing it with apt-get" >&2
    apt-get update -qq && apt-get install -y -qq valgrind >/dev/null
fi
cargo build --quiet -p gpupool --lib -p cudasim
PROFILE=debug
# shellcheck source=scripts/simlib.sh
source scripts/simlib.sh
lib=$TARGET_DIR/debug/libgpupool.so
out=$TARGET_DIR/debug/valgrind
mkdir -p "$out"
for p in churn hostile reset oom faults lifecycle; do
    sim_cc "$out/$p" "tests/c/$p.c" -I include
done
# Fair scheduling: valgrind runs one thread at a time, and its default lock lets busy threads
# starve one that sleeps. The fork run's main thread, waking to reap a child among four
# allocating threads, then waited 90 s to 13 min instead of 4 s.
vg=(valgrind -q --error-exitcode=1 --errors-for-leak-kinds=definite --leak-check=full
    --trace-children=no --fair-sched=yes)
run() {
    local name=$1
    shift
    local log="$out/$name.log"
    if ! env LD_PRELOAD="$lib" "$@" >"$log" 2>&1; then
        cat "$log"
        echo "valgrind: $name FAILED (log: $log)"
        exit 1
    fi
    echo "valgrind: $name ok"
}
run churn env CUDASIM_DEVICES=2 GPUPOOL_REUSE=barrier "${vg[@]}" "$out/churn" 3 150 2 7 30
run hostile env CUDASIM_DEVICES=2 "${vg[@]}" "$out/hostile"
run reset "${vg[@]}" "$out/reset"
run oom env CUDASIM_MEM=1GiB CUDASIM_CONTEXT_BYTES=0 "${vg[@]}" "$out/oom"
run faults env GPUPOOL_REUSE=strict GPUPOOL_FENCE_BYTES=8MiB "${vg[@]}" "$out/faults" \
    cudaDeviceSynchronize 999
# A forked child inherits the parent's heap but not its threads, so what those threads own is
# "definitely lost" in the child when it exits: no leak check for this run (memory errors still
# fail it, in parent and children).
run fork env GPUPOOL_SUMMARY=stderr valgrind -q --error-exitcode=1 --leak-check=no \
    --fair-sched=yes --child-silent-after-fork=yes "$out/lifecycle" fork cuda 3
