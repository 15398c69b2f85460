#!/usr/bin/env bash
# Real-GPU checks of libgpupool (the tests everywhere else run against cudasim/).
#
# Builds tests/gpu/*.cu with nvcc (-cudart shared, so LD_PRELOAD interposes the runtime), runs
# them with and without target/release/libgpupool.so preloaded, runs a small PyTorch training
# loop several ways (native, without caching, under the preload, as a pluggable allocator), times
# torch.empty + del pairs with PyTorch's allocator and with ours (tests/gpu/torch_hit.py), and
# compute-sanitizer's memcheck on the churn test. Every step has its own
# timeout; a failing step is recorded and the script goes on. Results: RESULTS/gpu-results.md
# (Markdown summary), RESULTS/steps.tsv, RESULTS/logs/*.log; a short table is printed at the end.
# Where $OUT is set (the lent GPU machine's folder whose files come back: at most 8), the
# results go to ./gpu-results and, after every step, gpu-results.md, steps.tsv and logs.tgz (the
# logs) are copied into $OUT, so that a run stopped at its time limit still brings them back.
#
# usage: scripts/gpu-check.sh [--dry-run] [--out DIR]
#   --dry-run   no GPU needed: check the library, nvcc (build the sources when it is there),
#               python syntax, this script's syntax, and print what a real run would run.
#   --out DIR   results directory (default: ./gpu-results)
# Environment: GPUPOOL_LIB (library, default target/release/libgpupool.so), NVCC, PYTHON
# (default /opt/torch/.venv/bin/python3 if present, else python3), GPU_CHECK_BUDGET (seconds for
# the whole run, default 390; steps that would start after it are skipped), GPU_CHECK_QUICK=1
# (smaller iteration counts), GPU_CHECK_COMMIT (the commit the report names, for a copy of the
# tree without .git).
#
# Exit status: 0 when every correctness check passed or was skipped as unsupported (benchmarks and
# informational runs never fail the script), 1 otherwise (a check that failed, timed out, or was
# not run for lack of time), 2 for bad arguments.
set -uo pipefail

DRY=0
RES=""
# Where the results are copied after every step (see the header).
PUBLISH="${OUT:-}"
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) DRY=1 ;;
    --out)
        shift
        RES="${1:-}"
        ;;
    -h | --help)
        sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "gpu-check: unknown argument '$1' (try --help)" >&2
        exit 2
        ;;
    esac
    shift
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$ROOT/scripts/gpu-check.sh"
cd "$ROOT" || exit 2
[ -n "$RES" ] || RES="$ROOT/gpu-results"
mkdir -p "$RES/logs" || exit 2
RES="$(cd "$RES" && pwd -P)"
# Resolved too, so that --out naming $OUT another way never copies files onto themselves.
[ -z "$PUBLISH" ] || PUBLISH="$(mkdir -p "$PUBLISH" && cd "$PUBLISH" && pwd -P)"
LOGS="$RES/logs"
BUILD="$ROOT/target/gpu-check"
mkdir -p "$BUILD"
LIB="${GPUPOOL_LIB:-$ROOT/target/release/libgpupool.so}"
case "$LIB" in /*) ;; *) LIB="$ROOT/$LIB" ;; esac
SRC="$ROOT/tests/gpu"
BUDGET="${GPU_CHECK_BUDGET:-390}"
START=$SECONDS
QUICK="${GPU_CHECK_QUICK:-0}"

# Iteration counts (modest: the whole run must fit in ~7 minutes on one GPU).
CHURN_THREADS=8
CHURN_ITERS=1500
HAZARD_ROUNDS=5
OVERLAP_ARGS=(300 1000 1000 1048576) # iterations, kernel us, host us, bytes
TORCH_ARGS=(--steps 30 --warmup 5)
SAN_ARGS=(1 200 1 1048576) # churn: threads, iterations, seed, max block bytes
if [ "$QUICK" = 1 ]; then
    CHURN_ITERS=300
    HAZARD_ROUNDS=3
    OVERLAP_ARGS=(100 1000 1000 1048576)
    TORCH_ARGS=(--steps 12 --warmup 3)
    SAN_ARGS=(1 50 1 1048576)
fi

if [ -z "${PYTHON:-}" ]; then
    if [ -x /opt/torch/.venv/bin/python3 ]; then PYTHON=/opt/torch/.venv/bin/python3; else PYTHON=python3; fi
fi

# A clean environment for every run: no inherited preload, pool or PyTorch allocator settings.
# Python unbuffered: a step killed at its timeout still leaves what it printed. (env's options
# first: it takes everything after the first NAME=VALUE as the command; the harness step
# `clean_env` below runs both, so a dry run catches that.)
CLEAN=(env -u LD_PRELOAD -u GPUPOOL_DISABLE -u GPUPOOL_RELEASE_THRESHOLD -u GPUPOOL_REUSE
    -u GPUPOOL_MAX_SPLIT_SIZE -u GPUPOOL_FENCE_BYTES -u GPUPOOL_SUMMARY -u GPUPOOL_CUDART
    -u PYTORCH_NO_CUDA_MEMORY_CACHING -u PYTORCH_CUDA_ALLOC_CONF -u CUDA_LAUNCH_BLOCKING
    PYTHONUNBUFFERED=1)
# pool MODE: the clean environment plus the preloaded pool in that reuse mode, summary on stderr.
pool() { POOL=("${CLEAN[@]}" "LD_PRELOAD=$LIB" "GPUPOOL_REUSE=$1" GPUPOOL_SUMMARY=stderr); }
# The summary's "calls" line with a non-zero malloc count: the pool intercepted allocations.
INTERCEPTED='calls +[1-9][0-9]* mallocs'

# ---------------------------------------------------------------------------------------------
# Recording

NAMES=() KINDS=() STATS=() SECS=() NOTES=()
: >"$RES/steps.tsv"

record() { # NAME KIND STATUS SECONDS NOTE
    NAMES+=("$1") KINDS+=("$2") STATS+=("$3") SECS+=("$4") NOTES+=("$5")
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$RES/steps.tsv"
    [ "${RECORD_QUIET:-0}" = 1 ] || printf 'gpu-check: %-26s %-6s %-8s %4ss  %s\n' "$1" "$2" "$3" "$4" "$5"
    write_report
}

left() { echo $((BUDGET - (SECONDS - START))); }
# Seconds one nvcc attempt may take: a quarter of what is left, 10 to 90 (a build takes seconds;
# a hung one must not eat the steps' time).
build_limit() {
    local l=$(($(left) / 4))
    [ "$l" -gt 90 ] && l=90
    [ "$l" -lt 10 ] && l=10
    echo "$l"
}

# run_step NAME KIND TIMEOUT EXPECT -- COMMAND...
#   KIND: check (a failure fails the script) | bench | info (recorded only).
#   EXPECT: extended regexes separated by ';;' that the log must contain for a pass ('' = none).
#   STEP_SKIP_RE (global, optional): a log matching it makes the step SKIP (not supported here).
# The log is $LOGS/NAME.log: the command line, then its stdout and stderr.
run_step() {
    local name=$1 kind=$2 tmo=$3 expect=$4
    shift 5
    local log="$LOGS/$name.log" rem status note rc t0
    if [ "$DRY" = 1 ]; then
        local shown="$*"
        shown="${shown/"${CLEAN[*]}"/env -u LD_PRELOAD -u GPUPOOL_* -u PYTORCH_...}"
        printf '[dry-run] would run %s (%s, timeout %ss): %s\n' "$name" "$kind" "$tmo" "$shown"
        RECORD_QUIET=1 record "$name" "$kind" SKIP 0 "dry run"
        return 0
    fi
    rem=$(left)
    if [ "$rem" -lt 15 ]; then
        # A correctness check that never ran is not a pass: NOTRUN counts as a failure.
        record "$name" "$kind" "$([ "$kind" = check ] && echo NOTRUN || echo SKIP)" 0 "time budget (${BUDGET}s) spent"
        return 1
    fi
    [ "$tmo" -gt $((rem - 5)) ] && tmo=$((rem - 5))
    printf '$ %s\n' "$*" >"$log"
    t0=$SECONDS
    timeout -k 5 "$tmo" "$@" </dev/null >>"$log" 2>&1
    rc=$?
    status=PASS note="rc 0"
    # "Not supported here" first: a tool that says so and then hangs is not a failed check.
    if [ -n "${STEP_SKIP_RE:-}" ] && grep -Eiq "$STEP_SKIP_RE" "$log"; then
        status=SKIP note="$(grep -Eio "$STEP_SKIP_RE" "$log" | head -n 1)"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        status=TIMEOUT note="killed after ${tmo}s"
    elif [ $rc -ne 0 ]; then
        status=FAIL note="rc $rc: $(grep -E 'FAIL|rror|CLOBBERED' "$log" | grep -v '^\$ ' | head -n 1 | cut -c1-160)"
    else
        local re
        while IFS= read -r re; do
            [ -n "$re" ] || continue
            if ! grep -Eq -- "$re" "$log"; then
                status=FAIL note="rc 0 but no line matching '$re'"
                break
            fi
        done <<<"${expect//;;/$'\n'}"
    fi
    record "$name" "$kind" "$status" $((SECONDS - t0)) "$note"
    [ "$status" = PASS ]
}

# ---------------------------------------------------------------------------------------------
# Report

kv() { # KEY FILE: the word after KEY on its first line starting with KEY
    [ -f "$2" ] && awk -v k="$1" '$1 == k { print $2; exit }' "$2"
}
status_of() { # NAME
    local i
    for i in "${!NAMES[@]}"; do
        [ "${NAMES[$i]}" = "$1" ] && { echo "${STATS[$i]}"; return; }
    done
    echo "-"
}
summary_block() { # LOG: the pool's exit summary from a log
    [ -f "$1" ] && awk '/gpupool summary/ { on = 1; print prev } on { print } { prev = $0 }' "$1" | head -n 40
}

write_report() {
    local md="$RES/gpu-results.md.tmp" i f mode
    {
        echo "# libgpupool GPU check"
        echo
        echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
        echo "- mode: $([ "$DRY" = 1 ] && echo 'dry run (nothing ran on a GPU)' || echo 'real run')"
        echo "- library: \`$LIB\`$([ -f "$LIB" ] && echo " (sha256 $(sha256sum "$LIB" | cut -c1-16))")"
        echo "- commit: ${GPU_CHECK_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo ' (+ uncommitted changes)')}"
        echo "- elapsed: $((SECONDS - START)) s of a ${BUDGET} s budget"
        echo
        echo "## Steps"
        echo
        echo "| step | kind | result | s | note |"
        echo "| --- | --- | --- | ---: | --- |"
        for i in "${!NAMES[@]}"; do
            echo "| ${NAMES[$i]} | ${KINDS[$i]} | ${STATS[$i]} | ${SECS[$i]} | ${NOTES[$i]//|/\\|} |"
        done
        echo
        echo "Correctness checks failed (FAIL, TIMEOUT, or NOTRUN for lack of time): $(count_failed)"
        echo
        if [ -f "$LOGS/env.log" ]; then
            echo "## Environment"
            echo
            echo '```'
            grep -v '^\$ ' "$LOGS/env.log" | head -n 40
            echo '```'
            echo
        fi
        echo "## churn (8 threads, kernel-filled blocks, verified by kernel before free)"
        echo
        echo "| run | result | program mallocs | churn ms |"
        echo "| --- | --- | ---: | ---: |"
        for f in churn_nopool churn_pool_strict churn_pool_barrier churn_pool_relaxed churn_pool_relaxed_few churn_pool_strict_few; do
            echo "| $f | $(status_of $f) | $(awk '/^program mallocs/ { print $3 }' "$LOGS/$f.log" 2>/dev/null) | $(awk '/^init_ms/ { print $4 }' "$LOGS/$f.log" 2>/dev/null) |"
        done
        echo
        for f in churn_pool_strict churn_pool_strict_few; do
            if [ -f "$LOGS/$f.log" ]; then
                echo "Pool summary of $f:"
                echo
                echo '```'
                summary_block "$LOGS/$f.log"
                echo '```'
                echo
            fi
        done
        echo "## hazard (a kernel still writing a freed block; 0x42 must survive)"
        echo
        echo "| run | result | rounds with the same address | clobbered rounds |"
        echo "| --- | --- | ---: | ---: |"
        for f in hazard_nopool hazard_pool_strict hazard_pool_barrier hazard_pool_relaxed \
            hazard_blocking_nopool hazard_blocking_pool_strict hazard_blocking_pool_barrier \
            hazard_blocking_pool_relaxed; do
            echo "| $f | $(status_of $f) | $(awk '/^rounds / { print $4 }' "$LOGS/$f.log" 2>/dev/null) | $(awk '/^rounds / { print $6 }' "$LOGS/$f.log" 2>/dev/null) |"
        done
        echo
        echo "The hazard_blocking rows run the spinning kernel and the new owner's fill on two blocking streams: barrier mode then relies on its own barrier on the legacy stream, not on fences. The relaxed rows are informational: relaxed trusts stream order, so a clobber there is the documented behaviour."
        echo
        echo "## stream_reuse (a block freed on a stream under a running kernel; gpupool_malloc_async)"
        echo
        echo "| run | result | summary |"
        echo "| --- | --- | --- |"
        for f in stream_reuse_nopool stream_reuse_pool_relaxed stream_reuse_pool_strict stream_reuse_pool_barrier; do
            echo "| $f | $(status_of $f) | $(grep -E '^rounds ' "$LOGS/$f.log" 2>/dev/null | tail -n 1) |"
        done
        echo
        echo "## PyTorch (tests/gpu/torch_train.py)"
        echo
        echo "| run | result | median step ms | max_memory_reserved MiB | peak device used MiB | base used MiB | final loss |"
        echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
        for f in torch_native torch_nocache torch_nocache_pool torch_nocache_pool_barrier torch_pluggable torch_pluggable_barrier torch_pluggable_relaxed; do
            local l="$LOGS/$f.log"
            echo "| $f | $(status_of $f) | $(kv median_step_ms "$l") | $(kv max_memory_reserved_mib "$l") | $(kv peak_device_used_mib "$l") | $(kv base_device_used_mib "$l") | $(kv final_loss "$l") |"
        done
        echo
        echo "torch_native: PyTorch's caching allocator. torch_nocache: PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a cudaMalloc/cudaFree). torch_nocache_pool: the same under LD_PRELOAD=libgpupool.so (torch's own counters then see nothing; peak device used is total - free from cudaMemGetInfo)."
        echo
        if [ -f "$LOGS/torch_nocache_pool.log" ]; then
            echo '```'
            summary_block "$LOGS/torch_nocache_pool.log"
            echo '```'
            echo
        fi
        echo "## compute-sanitizer memcheck (churn under the pool)"
        echo
        echo "- result: $(status_of sanitizer_memcheck_pool)"
        [ -f "$LOGS/sanitizer_memcheck_pool.log" ] &&
            echo "- $(grep -E 'ERROR SUMMARY|Device not supported|not supported' "$LOGS/sanitizer_memcheck_pool.log" | head -n 1)"
        echo
        echo "## overlap (malloc, ~1 ms kernel, free, 1 ms host work; legacy stream)"
        echo
        echo "| run | wall ms | ideal ms | serial ms |"
        echo "| --- | ---: | ---: | ---: |"
        for f in overlap_nopool overlap_pool_strict overlap_pool_barrier overlap_pool_barrier_api overlap_pool_relaxed; do
            local l="$LOGS/$f.log"
            echo "| $f | $(kv wall_ms "$l") | $(kv ideal_ms "$l") | $(kv serial_ms "$l") |"
        done
        echo
        echo "overlap_pool_barrier_api launches with an explicit cudaLaunchKernel (which the pool sees); the others use <<<>>> (with CUDA 13 that calls __cudaLaunchKernel, which it does not)."
        echo
        echo "## hit_bench (ns per allocate+free pair)"
        echo
        echo "| size | raw_ns | pool_ns | async_ns | pool_relaxed_ns |"
        echo "| ---: | ---: | ---: | ---: | ---: |"
        hit_table | awk '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }'
        echo
        echo "raw: cudaMalloc+cudaFree without the pool. pool: the same under the preload (GPUPOOL_REUSE=strict). async: cudaMallocAsync+cudaFreeAsync, default mempool, release threshold UINT64_MAX, no preload."
        echo
        echo "cudaGetDevice, ns per call (the pool calls it once in each cudaMalloc and cudaFree it serves, unless the process sees one device): $(for f in hit_raw hit_pool hit_async hit_pool_relaxed; do printf '%s %s; ' "$f" "$(kv getdevice_ns "$LOGS/$f.log")"; done)"
        echo
        echo "## torch_hit (ns per torch.empty + del pair, from Python)"
        echo
        echo "| size | native | native net | pluggable strict | net | pluggable relaxed | net |"
        echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        torch_hit_table | awk '{ printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }'
        echo
        for f in torch_hit_native torch_hit_pluggable torch_hit_pluggable_relaxed; do
            [ -f "$LOGS/$f.log" ] && echo "- $f: $(status_of $f); Python loop overhead $(kv python_overhead_ns "$LOGS/$f.log") ns, torch.empty on the meta device (no allocator) $(kv meta_pair_ns "$LOGS/$f.log") ns per pair"
        done
        echo
        echo "native: PyTorch's caching allocator. pluggable: libgpupool as PyTorch's CUDAPluggableAllocator in that GPUPOOL_REUSE mode. net: the pair minus the Python loop's own overhead. The pair minus the meta-device figure is an upper bound of the allocator's share: it also holds PyTorch's CUDA-side work (device guard, current stream, and for the pluggable allocator its own lock and pointer map). In strict mode a freed block waits for a fence, taken once GPUPOOL_FENCE_BYTES (256 MiB) wait: the small sizes' pluggable strict rows also carve new blocks between fences, not only reuse."
        echo
        echo "Logs: \`logs/\` beside this file (each starts with its command line)$([ -n "$PUBLISH" ] && echo '; logs.tgz where the results were copied')."
    } >"$md"
    mv -f "$md" "$RES/gpu-results.md"
    publish
}

# Copy the report, the steps and the logs (one archive) into $PUBLISH, if set.
publish() {
    [ -n "$PUBLISH" ] && [ "$PUBLISH" != "$RES" ] || return 0
    mkdir -p "$PUBLISH" &&
        cp -f "$RES/gpu-results.md" "$RES/steps.tsv" "$PUBLISH/" &&
        tar czf "$PUBLISH/logs.tgz.tmp" -C "$RES" logs &&
        mv -f "$PUBLISH/logs.tgz.tmp" "$PUBLISH/logs.tgz"
}

# size raw pool async pool_relaxed, one line per size, '-' where a run is missing
hit_table() {
    local f
    for f in hit_raw hit_pool hit_async hit_pool_relaxed; do
        if [ -f "$LOGS/$f.log" ]; then
            awk '$1 == "hit" { print $2, $3 }' "$LOGS/$f.log" >"$BUILD/$f.tsv"
        else
            : >"$BUILD/$f.tsv"
        fi
    done
    awk '
        FILENAME ~ /hit_raw/ { raw[$1] = $2; seen[$1] = 1 }
        FILENAME ~ /hit_pool\.tsv/ { pl[$1] = $2; seen[$1] = 1 }
        FILENAME ~ /hit_async/ { as[$1] = $2; seen[$1] = 1 }
        FILENAME ~ /hit_pool_relaxed/ { rl[$1] = $2; seen[$1] = 1 }
        END {
            for (s in seen) {
                printf "%s %s %s %s %s\n", s, (s in raw) ? raw[s] : "-", (s in pl) ? pl[s] : "-",
                    (s in as) ? as[s] : "-", (s in rl) ? rl[s] : "-"
            }
        }' "$BUILD/hit_raw.tsv" "$BUILD/hit_pool.tsv" "$BUILD/hit_async.tsv" "$BUILD/hit_pool_relaxed.tsv" | sort -n
}

# size, then pair and net ns of native, pluggable strict and pluggable relaxed; '-' where missing
torch_hit_table() {
    local f
    for f in torch_hit_native torch_hit_pluggable torch_hit_pluggable_relaxed; do
        if [ -f "$LOGS/$f.log" ]; then
            awk '$1 == "torch_hit" && NF >= 4 { print $2, $3, $4 }' "$LOGS/$f.log" >"$BUILD/$f.tsv"
        else
            : >"$BUILD/$f.tsv"
        fi
    done
    awk '
        { seen[$1] = 1; v[FILENAME, $1] = $2 " " $3 }
        END {
            n = split(ARGV[1] " " ARGV[2] " " ARGV[3], files, " ")
            for (s in seen) {
                line = s
                for (i = 1; i <= n; i++)
                    line = line " " (((files[i], s) in v) ? v[files[i], s] : "- -")
                print line
            }
        }' "$BUILD/torch_hit_native.tsv" "$BUILD/torch_hit_pluggable.tsv" "$BUILD/torch_hit_pluggable_relaxed.tsv" | sort -n
}

count_failed() {
    local i n=0
    for i in "${!NAMES[@]}"; do
        if [ "${KINDS[$i]}" = check ] && case "${STATS[$i]}" in FAIL | TIMEOUT | NOTRUN) true ;; *) false ;; esac then
            n=$((n + 1))
        fi
    done
    echo $n
}

on_signal() {
    record interrupted info FAIL $((SECONDS - START)) "the script was stopped by a signal"
    exit 1
}
trap on_signal TERM INT

# ---------------------------------------------------------------------------------------------
# 0. The harness itself

t0=$SECONDS
if bash -n "$SELF" 2>"$LOGS/self_syntax.log"; then
    record self_syntax check PASS $((SECONDS - t0)) "bash -n"
else
    record self_syntax check FAIL $((SECONDS - t0)) "bash -n: $(head -n 1 "$LOGS/self_syntax.log")"
fi

if [ -f "$LIB" ]; then
    record library check PASS 0 "$LIB"
elif [ "$DRY" = 1 ]; then
    record library info WARN 0 "missing: $LIB (a real run would fail; build with cargo build --release)"
else
    record library check FAIL 0 "missing: $LIB"
fi

# The environments every step runs in (a program that uses no CUDA: the pool stays silent).
t0=$SECONDS
pool strict
if "${CLEAN[@]}" true >"$LOGS/clean_env.log" 2>&1 && "${POOL[@]}" true >>"$LOGS/clean_env.log" 2>&1; then
    if [ -s "$LOGS/clean_env.log" ]; then
        # The pool must print nothing in a process that used no CUDA, summary asked or not.
        record clean_env check FAIL $((SECONDS - t0)) "a program without CUDA printed: $(head -n 1 "$LOGS/clean_env.log")"
    else
        record clean_env check PASS $((SECONDS - t0)) "the clean and pooled environments run a program, silently"
    fi
else
    record clean_env check FAIL $((SECONDS - t0)) "$(head -n 1 "$LOGS/clean_env.log")"
fi

for py in pluggable torch_train torch_hit; do
    t0=$SECONDS
    if "$PYTHON" -c "import py_compile, sys; py_compile.compile(sys.argv[1], cfile='$BUILD/$py.pyc', doraise=True)" \
        "$SRC/$py.py" >"$LOGS/${py}_syntax.log" 2>&1; then
        record "${py}_syntax" check PASS $((SECONDS - t0)) "py_compile ($PYTHON)"
    else
        record "${py}_syntax" check FAIL $((SECONDS - t0)) "$(tail -n 1 "$LOGS/${py}_syntax.log")"
    fi
done

# ---------------------------------------------------------------------------------------------
# 1. Environment

find_nvcc() {
    local c
    if [ -n "${NVCC:-}" ] && [ -x "$NVCC" ]; then echo "$NVCC"; return; fi
    if command -v nvcc >/dev/null 2>&1; then command -v nvcc; return; fi
    for c in "${CUDA_HOME:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc /opt/cuda/bin/nvcc; do
        [ -x "$c" ] && { echo "$c"; return; }
    done
}
find_sanitizer() {
    local c
    if command -v compute-sanitizer >/dev/null 2>&1; then command -v compute-sanitizer; return; fi
    for c in "$(dirname "${NVCC_BIN:-/nonexistent/x}")/compute-sanitizer" \
        "$(dirname "${NVCC_BIN:-/nonexistent/x}")/../compute-sanitizer/compute-sanitizer" \
        /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
        /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
        [ -x "$c" ] && { echo "$c"; return; }
    done
}
NVCC_BIN="$(find_nvcc)"
SANITIZER="$(find_sanitizer)"

# shellcheck disable=SC2089,SC2090 # Python source, run with python -c
TORCH_PROBE='
import sys, torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("cuda_available", torch.cuda.is_available())
if torch.cuda.is_available():
    torch.zeros(1, device="cuda")
    print("device", torch.cuda.get_device_name(0))
    maps = open("/proc/self/maps").read().splitlines()
    libs = sorted({l.split()[-1] for l in maps if "libcudart" in l})
    print("torch_libcudart", " ".join(libs) or "none (static?)")
'
env_probe() {
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
    if [ -n "$NVCC_BIN" ]; then echo "$NVCC_BIN"; "$NVCC_BIN" --version | tail -n 2; else echo "nvcc: not found"; fi
    echo "== compute-sanitizer"
    if [ -n "$SANITIZER" ]; then echo "$SANITIZER"; "$SANITIZER" --version 2>&1 | tail -n 1; else echo "compute-sanitizer: not found"; fi
    echo "== python / torch"
    timeout 90 "$PYTHON" -c "$TORCH_PROBE" 2>&1 | grep -v Warning || echo "torch probe failed"
}
export -f env_probe
# shellcheck disable=SC2090
export NVCC_BIN SANITIZER PYTHON TORCH_PROBE
if [ "$DRY" = 1 ]; then
    {
        echo "== dry run: no GPU probes"
        uname -srm
        echo "nvcc: ${NVCC_BIN:-not found}"
        echo "compute-sanitizer: ${SANITIZER:-not found}"
        echo "python: $PYTHON"
    } >"$LOGS/env.log" 2>&1
    record env info SKIP 0 "dry run (GPU probes not run)"
else
    run_step env info 120 '' -- bash -c env_probe
fi

# ---------------------------------------------------------------------------------------------
# 2. Build

PROGRAMS=(churn hazard stream_reuse overlap hit_bench)
declare -A BUILT=()

cuda_lib_dir() { # the directory with the toolkit's libcudart, next to nvcc
    local top d
    top="$(cd "$(dirname "$(readlink -f "$NVCC_BIN")")/.." && pwd)"
    for d in "$top/lib64" "$top/lib" "$top"/targets/*/lib; do
        if compgen -G "$d/libcudart.so*" >/dev/null; then echo "$d"; return; fi
    done
}

if [ -z "$NVCC_BIN" ]; then
    for p in "${PROGRAMS[@]}"; do
        if [ "$DRY" = 1 ]; then
            record "build_$p" info SKIP 0 "nvcc not found: build skipped (dry run)"
        else
            record "build_$p" check FAIL 0 "nvcc not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda*/bin)"
        fi
    done
else
    CUDA_LIB="$(cuda_lib_dir)"
    LINK_FLAGS=()
    if [ -n "$CUDA_LIB" ]; then
        LINK_FLAGS+=(-L"$CUDA_LIB" -Xlinker -rpath -Xlinker "$CUDA_LIB")
        if [ ! -e "$CUDA_LIB/libcudart.so" ]; then # wheel layouts ship only libcudart.so.13
            mkdir -p "$BUILD/linkdir"
            for f in "$CUDA_LIB"/libcudart.so.*; do
                ln -sf "$f" "$BUILD/linkdir/libcudart.so"
                break
            done
            LINK_FLAGS+=(-L"$BUILD/linkdir")
        fi
    fi
    # Build all programs in parallel; each with -arch=sm_90 first, then without -arch.
    t0=$SECONDS
    for p in "${PROGRAMS[@]}"; do
        (
            log="$LOGS/build_$p.log"
            cmd=("$NVCC_BIN" -O2 -cudart shared -arch=sm_90 -o "$BUILD/$p" "$SRC/$p.cu" "${LINK_FLAGS[@]}" -lpthread -ldl)
            rm -f "$BUILD/$p"
            echo "\$ ${cmd[*]}" >"$log"
            if timeout -k 5 "$(build_limit)" "${cmd[@]}" >>"$log" 2>&1; then
                echo "sm_90" >"$BUILD/$p.rc"
            else
                cmd=("$NVCC_BIN" -O2 -cudart shared -o "$BUILD/$p" "$SRC/$p.cu" "${LINK_FLAGS[@]}" -lpthread -ldl)
                echo "\$ ${cmd[*]}   (retry without -arch)" >>"$log"
                if timeout -k 5 "$(build_limit)" "${cmd[@]}" >>"$log" 2>&1; then
                    echo "default arch (sm_90 failed)" >"$BUILD/$p.rc"
                else
                    echo "FAIL" >"$BUILD/$p.rc"
                fi
            fi
        ) &
    done
    wait
    for p in "${PROGRAMS[@]}"; do
        how="$(cat "$BUILD/$p.rc" 2>/dev/null || echo FAIL)"
        if [ "$how" != FAIL ] && [ -x "$BUILD/$p" ]; then
            BUILT[$p]=1
            record "build_$p" check PASS $((SECONDS - t0)) "$how"
        else
            record "build_$p" check FAIL $((SECONDS - t0)) "$(grep -E 'error' "$LOGS/build_$p.log" | head -n 1 | cut -c1-160)"
        fi
    done
    if [ -n "${BUILT[churn]:-}" ]; then
        {
            echo "== imported launch entry points (a preload sees cudaLaunchKernel, not __cudaLaunchKernel)"
            for p in "${!BUILT[@]}"; do
                echo "$p: $(nm -D "$BUILD/$p" 2>/dev/null | awk '/U .*[Ll]aunch/ { print $2 }' | tr '\n' ' ')"
            done
            echo "== ldd churn"
            ldd "$BUILD/churn" 2>&1 | grep -E 'cudart|not found'
        } >"$LOGS/build_info.log" 2>&1
        note="churn imports: $(nm -D "$BUILD/churn" 2>/dev/null | awk '/U .*[Ll]aunch/ { sub(/@.*/, "", $2); print $2 }' | tr '\n' ' ')"
        record build_info info INFO 0 "$note"
    fi
fi

have() { [ -n "${BUILT[$1]:-}" ] || [ "$DRY" = 1 ]; }
missing() { record "$1" "$2" "$([ "$2" = check ] && echo FAIL || echo SKIP)" 0 "not built"; }

# ---------------------------------------------------------------------------------------------
# 3. The test programs

# churn: the test's own correctness without the pool, then under the pool in each mode.
if have churn; then
    run_step churn_nopool check 120 'churn ok' -- "${CLEAN[@]}" "$BUILD/churn" $CHURN_THREADS $CHURN_ITERS 1
    for mode in strict barrier relaxed; do
        pool $mode
        run_step "churn_pool_$mode" check 120 "churn ok;;$INTERCEPTED" -- "${POOL[@]}" "$BUILD/churn" $CHURN_THREADS $CHURN_ITERS 1
    done
    # Repeating sizes: what the thread caches serve (several threads, one device; in strict mode
    # once the threads compete for the device's lock, blocks waiting in the caches for fences).
    for mode in relaxed strict; do
        pool $mode
        run_step "churn_pool_${mode}_few" check 120 "churn ok;;$INTERCEPTED" -- "${POOL[@]}" "$BUILD/churn" $CHURN_THREADS $CHURN_ITERS 1 1073741824 few
    done
else
    for f in churn_nopool churn_pool_strict churn_pool_barrier churn_pool_relaxed churn_pool_relaxed_few churn_pool_strict_few; do missing $f check; done
fi

# hazard: must pass without the pool and under strict and barrier; relaxed is informational.
if have hazard; then
    run_step hazard_nopool check 60 'hazard ok' -- "${CLEAN[@]}" "$BUILD/hazard" $HAZARD_ROUNDS
    for mode in strict barrier; do
        pool $mode
        run_step "hazard_pool_$mode" check 60 "hazard ok;;$INTERCEPTED" -- "${POOL[@]}" "$BUILD/hazard" $HAZARD_ROUNDS
    done
    pool relaxed
    run_step hazard_pool_relaxed info 60 "hazard ok;;$INTERCEPTED" -- "${POOL[@]}" "$BUILD/hazard" $HAZARD_ROUNDS
    # The same on two blocking streams: barrier mode's own barrier, not a fence, guards the reuse.
    run_step hazard_blocking_nopool check 60 'hazard ok' -- "${CLEAN[@]}" "$BUILD/hazard" $HAZARD_ROUNDS 100 blocking
    for mode in strict barrier; do
        pool $mode
        expect="hazard ok;;$INTERCEPTED"
        # In barrier mode the point is the pool's own barrier: the block must have come back
        # behind one (on the simulator: every round, 5 barriers, 1 cudaMalloc).
        [ "$mode" = barrier ] && expect="$expect;;reused_address [1-9];;barriers [1-9]"
        run_step "hazard_blocking_pool_$mode" check 60 "$expect" -- "${POOL[@]}" "$BUILD/hazard" $HAZARD_ROUNDS 100 blocking
    done
    pool relaxed
    run_step hazard_blocking_pool_relaxed info 60 "hazard ok;;$INTERCEPTED" -- "${POOL[@]}" "$BUILD/hazard" $HAZARD_ROUNDS 100 blocking
else
    for f in hazard_nopool hazard_pool_strict hazard_pool_barrier hazard_blocking_nopool \
        hazard_blocking_pool_strict hazard_blocking_pool_barrier; do missing $f check; done
    missing hazard_pool_relaxed info
    missing hazard_blocking_pool_relaxed info
fi

# stream_reuse: stream-ordered reuse (relaxed: the block freed on a stream serves that stream at
# once, written in stream order; never another stream, nor a new stream after a destroyed one).
# Without the pool it runs on cudaMallocAsync, whose pool has the same rule.
if have stream_reuse; then
    run_step stream_reuse_nopool check 60 'stream_reuse ok' -- "${CLEAN[@]}" "$BUILD/stream_reuse"
    pool relaxed
    run_step stream_reuse_pool_relaxed check 60 "stream_reuse ok;;same_stream_reuse [1-9];;$INTERCEPTED" -- \
        "${POOL[@]}" "$BUILD/stream_reuse"
    # Other modes: no reuse before the barrier or fence, not even on the same stream.
    for mode in strict barrier; do
        pool $mode
        run_step "stream_reuse_pool_$mode" check 60 "stream_reuse ok;;same_stream_reuse 0;;$INTERCEPTED" -- \
            "${POOL[@]}" "$BUILD/stream_reuse"
    done
else
    for f in stream_reuse_nopool stream_reuse_pool_relaxed stream_reuse_pool_strict stream_reuse_pool_barrier; do
        missing $f check
    done
fi

# ---------------------------------------------------------------------------------------------
# 4. PyTorch: under the pool first (the check), then the two references.

TORCH="$SRC/torch_train.py"
pool strict
run_step torch_nocache_pool check 150 "torch_train ok;;loss_finite 1;;$INTERCEPTED" -- \
    "${POOL[@]}" PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$PYTHON" "$TORCH" "${TORCH_ARGS[@]}"
run_step torch_pluggable check 150 "torch_train ok;;loss_finite 1;;$INTERCEPTED" -- \
    "${CLEAN[@]}" "$PYTHON" "$TORCH" "${TORCH_ARGS[@]}" --pluggable "$LIB"
run_step torch_native bench 150 'torch_train ok' -- "${CLEAN[@]}" "$PYTHON" "$TORCH" "${TORCH_ARGS[@]}"
pool barrier
run_step torch_nocache_pool_barrier bench 150 "torch_train ok;;$INTERCEPTED" -- \
    "${POOL[@]}" PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$PYTHON" "$TORCH" "${TORCH_ARGS[@]}"
# The pluggable allocator in barrier mode: its frees name PyTorch's stream (blocking), so their
# blocks wait for a barrier, not a fence (the strict run above pays fences).
run_step torch_pluggable_barrier bench 150 "torch_train ok;;loss_finite 1;;$INTERCEPTED" -- \
    "${CLEAN[@]}" GPUPOOL_REUSE=barrier "$PYTHON" "$TORCH" "${TORCH_ARGS[@]}" --pluggable "$LIB"
# And in relaxed mode, PyTorch's own rule: a block freed on PyTorch's stream serves that stream's
# next requests at once (stream-ordered reuse), other streams after a barrier.
run_step torch_pluggable_relaxed bench 150 "torch_train ok;;loss_finite 1;;$INTERCEPTED;;on the stream that freed them" -- \
    "${CLEAN[@]}" GPUPOOL_REUSE=relaxed "$PYTHON" "$TORCH" "${TORCH_ARGS[@]}" --pluggable "$LIB"
run_step torch_nocache bench 150 'torch_train ok' -- \
    "${CLEAN[@]}" PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$PYTHON" "$TORCH" "${TORCH_ARGS[@]}"

# ---------------------------------------------------------------------------------------------
# 5. compute-sanitizer memcheck on churn under the pool. The preload is set for the target only
# (a shell that appends it to whatever the sanitizer put in LD_PRELOAD, then execs churn), so
# the sanitizer's own process is untouched. "Device not supported" (gVisor) is a skip.

SAN_SKIP='Device not supported|not supported on this (platform|device)|Unable to (find|load) injection library'
if [ -z "$SANITIZER" ]; then
    record sanitizer_memcheck_pool info SKIP 0 "compute-sanitizer not found"
elif ! have churn; then
    missing sanitizer_memcheck_pool check
else
    STEP_SKIP_RE="$SAN_SKIP"
    # shellcheck disable=SC2016 # $0, $1 and LD_PRELOAD expand in the target's shell
    if ! run_step sanitizer_memcheck_pool check 150 'ERROR SUMMARY: 0 errors;;churn ok' -- \
        "${CLEAN[@]}" GPUPOOL_SUMMARY=stderr "$SANITIZER" --tool memcheck --target-processes all \
        sh -c 'LD_PRELOAD="$0${LD_PRELOAD:+:$LD_PRELOAD}"; export LD_PRELOAD; exec "$@"' "$LIB" \
        "$BUILD/churn" "${SAN_ARGS[@]}"; then
        # Diagnose: the same without the pool (informational).
        if [ "$(status_of sanitizer_memcheck_pool)" != SKIP ]; then
            run_step sanitizer_memcheck_nopool info 120 'ERROR SUMMARY: 0 errors' -- \
                "${CLEAN[@]}" "$SANITIZER" --tool memcheck "$BUILD/churn" "${SAN_ARGS[@]}"
        fi
    fi
    STEP_SKIP_RE=
fi

# ---------------------------------------------------------------------------------------------
# 6. Benchmarks

if have overlap; then
    run_step overlap_nopool bench 60 'wall_ms' -- "${CLEAN[@]}" "$BUILD/overlap" "${OVERLAP_ARGS[@]}"
    for mode in strict barrier relaxed; do
        pool $mode
        run_step "overlap_pool_$mode" bench 60 "wall_ms;;$INTERCEPTED" -- "${POOL[@]}" "$BUILD/overlap" "${OVERLAP_ARGS[@]}"
    done
    pool barrier
    run_step overlap_pool_barrier_api bench 60 "wall_ms;;$INTERCEPTED" -- "${POOL[@]}" "$BUILD/overlap" "${OVERLAP_ARGS[@]}" api
fi

if have hit_bench; then
    run_step hit_raw bench 90 'hit_bench malloc done' -- "${CLEAN[@]}" "$BUILD/hit_bench" malloc
    pool strict
    run_step hit_pool bench 90 "hit_bench malloc done;;$INTERCEPTED" -- "${POOL[@]}" "$BUILD/hit_bench" malloc
    run_step hit_async bench 90 'hit_bench async done' -- "${CLEAN[@]}" "$BUILD/hit_bench" async
    pool relaxed
    run_step hit_pool_relaxed bench 90 "hit_bench malloc done;;$INTERCEPTED" -- "${POOL[@]}" "$BUILD/hit_bench" malloc
fi

# The same pairs as PyTorch programs meet them: torch.empty + del per size, PyTorch's caching
# allocator against libgpupool as its pluggable allocator (Python's own overhead measured).
TORCH_HIT="$SRC/torch_hit.py"
run_step torch_hit_native bench 90 'torch_hit done' -- "${CLEAN[@]}" "$PYTHON" "$TORCH_HIT"
run_step torch_hit_pluggable bench 90 "torch_hit done;;$INTERCEPTED" -- \
    "${CLEAN[@]}" GPUPOOL_REUSE=strict "$PYTHON" "$TORCH_HIT" --pluggable "$LIB"
run_step torch_hit_pluggable_relaxed bench 90 "torch_hit done;;$INTERCEPTED;;on the stream that freed them" -- \
    "${CLEAN[@]}" GPUPOOL_REUSE=relaxed "$PYTHON" "$TORCH_HIT" --pluggable "$LIB"

# ---------------------------------------------------------------------------------------------
# Summary

write_report
FAILED=$(count_failed)
echo
echo "== gpu-check $([ "$DRY" = 1 ] && echo '(dry run) ')results: $RES/gpu-results.md"
printf '%-26s %-6s %-8s %5s  %s\n' step kind result s note
for i in "${!NAMES[@]}"; do
    printf '%-26s %-6s %-8s %5s  %s\n' "${NAMES[$i]}" "${KINDS[$i]}" "${STATS[$i]}" "${SECS[$i]}" "${NOTES[$i]:0:90}"
done
if [ "$DRY" != 1 ]; then
    echo
    echo "hit_bench ns/pair: size raw pool async pool_relaxed"
    hit_table | sed 's/^/  /'
    echo "torch_hit ns/pair (and net of Python): size native pluggable_strict pluggable_relaxed"
    torch_hit_table | sed 's/^/  /'
    echo "overlap wall ms (ideal/serial $(kv ideal_ms "$LOGS/overlap_nopool.log")/$(kv serial_ms "$LOGS/overlap_nopool.log")):" \
        "nopool $(kv wall_ms "$LOGS/overlap_nopool.log") strict $(kv wall_ms "$LOGS/overlap_pool_strict.log")" \
        "barrier $(kv wall_ms "$LOGS/overlap_pool_barrier.log") barrier_api $(kv wall_ms "$LOGS/overlap_pool_barrier_api.log")" \
        "relaxed $(kv wall_ms "$LOGS/overlap_pool_relaxed.log")"
    for f in torch_native torch_nocache torch_nocache_pool torch_nocache_pool_barrier torch_pluggable torch_pluggable_barrier torch_pluggable_relaxed; do
        echo "$f: step $(kv median_step_ms "$LOGS/$f.log") ms, peak used $(kv peak_device_used_mib "$LOGS/$f.log") MiB, reserved $(kv max_memory_reserved_mib "$LOGS/$f.log") MiB, loss $(kv final_loss "$LOGS/$f.log")"
    done
fi
echo "correctness checks failed: $FAILED   (elapsed $((SECONDS - START)) s)"
[ "$FAILED" -eq 0 ]
