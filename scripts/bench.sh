#!/usr/bin/env bash
# CPU-side benchmark of libgpupool against the CUDA simulator (no GPU needed).
#
# Measures, in one run: the cudaMalloc+cudaFree pair of a cached size through the preloaded
# hooks next to glibc's malloc+free of the same size (with 0, 1, 1 000 and 100 000 other blocks
# live), the simulator's own pair without the pool, the pass-through cost with
# GPUPOOL_DISABLE=1, and the wall time of the overlap loop (tests/c/overlap.c) in each
# GPUPOOL_REUSE mode against no pool and against the ideal. Prints a Markdown report and
# rewrites the section of BENCHMARKS.md between <!-- bench:begin --> and <!-- bench:end -->.
# Then the policy comparison: the generated workloads (training, inference, RMM's random
# allocations) replayed through our pool and the policies it is compared with
# (`gpupool-trace compare`), the trace replay's own speed, and the pool API's multi-thread
# scaling (benches/threads.rs); rewrites the section between <!-- policies:begin --> and
# <!-- policies:end -->, and the charts in bench/figures/. Targets are reported, never asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# A clean environment: no inherited pool or simulator settings, no foreign preload.
while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(GPUPOOL|CUDASIM)_' || true)
unset LD_PRELOAD

SIZE=4096           # the cached size of the hit-path pairs
HIT_ITERS=500000    # pairs per repetition (hit_path times 7 repetitions, prints the median)
RAW_ITERS=30000     # the same for pairs that reach the simulator (about 3 us each)
TRACE_ITERS=100000  # pairs per repetition with the trace on (80 bytes of trace per pair)
LIVE_COUNTS=(0 1 1000 100000)
MODES=(strict barrier relaxed)
OVERLAP_ITERS=300
OVERLAP_BYTES=$((1 << 20))
OVERLAP_CASES=("2000 1000" "1000 3000") # "KERNEL_US HOST_US"
SEED=1              # the generated workloads' seed
INFERENCE_SEEDS=24  # the inference workload is also compared over seeds 1..N
WORKLOADS=(training inference)
for max in 1MiB 64MiB 1GiB; do for n in 10000 100000; do WORKLOADS+=("random:$max:$n"); done; done
THREAD_STEPS=500000 # churn steps per thread in benches/threads.rs

# Build the library and the simulator, and the link directory the tests also make; and the
# library once more without its hit-path counters (the `stats` feature), to price them.
cargo build --release --workspace --quiet >&2
cargo build --release --quiet -p gpupool --lib --no-default-features \
    --target-dir "$root/target/bench-nostats" >&2
lib_nostats=$root/target/bench-nostats/release/libgpupool.so
rel=$root/target/release
lib=$rel/libgpupool.so
PROFILE=release
# shellcheck source=scripts/simlib.sh
source scripts/simlib.sh

bin=$root/target/bench
mkdir -p "$bin"
for src in bench/*.c tests/c/overlap.c; do
    sim_cc "$bin/$(basename "$src" .c)" "$src"
done

# Pin the hit-path runs to one CPU (the last one this process may use) when taskset works.
pin=()
if command -v taskset >/dev/null 2>&1; then
    cpus=$(taskset -pc $$ 2>/dev/null | sed 's/.*: *//') || cpus=
    cpu=${cpus##*[,-]}
    if [ -n "$cpu" ] && taskset -c "$cpu" true 2>/dev/null; then
        pin=(taskset -c "$cpu")
    fi
fi

log=$bin/bench.log
: >"$log"

# run PROGRAM ARGS... [-- VAR=VALUE...]: runs it (pinned if asked by $PIN), logs its output,
# prints it; stops the script if it fails.
run() {
    local args=() envs=() out
    while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    envs=("$@")
    local prefix=()
    [ "${PIN:-0}" = 1 ] && prefix=(${pin[@]+"${pin[@]}"})
    echo "\$ ${envs[*]+${envs[*]} }${args[*]}" >>"$log"
    if ! out=$(${prefix[@]+"${prefix[@]}"} env ${envs[@]+"${envs[@]}"} "${args[@]}" 2>&1); then
        printf 'bench: failed: %s %s\n%s\n' "${envs[*]+${envs[*]}}" "${args[*]}" "$out" >&2
        exit 1
    fi
    echo "$out" >>"$log"
    echo "$out"
}
# field NAME: the number after NAME in the output read from stdin.
field() { awk -v k="$1" '$1 == k { print $2; found = 1 } END { exit !found }'; }
# ratio A B [DIGITS]: A / B.
ratio() { awk -v a="$1" -v b="$2" -v d="${3:-1}" 'BEGIN { printf "%.*f", d, a / b }'; }
# le A B: whether A <= B.
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }
hit() { # hit LIVE ITERS cuda|glibc [VAR=VALUE...]
    local live=$1 iters=$2 what=$3
    shift 3
    PIN=1 run "$bin/hit_path" "$live" "$SIZE" "$iters" "$what" -- "$@" | field ns_per_pair
}
pooled=("LD_PRELOAD=$lib")

echo "bench: hit path ($SIZE B pairs)..." >&2
declare -A ns
for live in "${LIVE_COUNTS[@]}"; do
    ns[glibc,$live]=$(hit "$live" "$HIT_ITERS" glibc)
    for mode in "${MODES[@]}"; do
        ns[$mode,$live]=$(hit "$live" "$HIT_ITERS" cuda "${pooled[@]}" "GPUPOOL_REUSE=$mode")
    done
done
ns[raw]=$(hit 1 "$RAW_ITERS" cuda)
# PyTorch's pluggable allocator entry points, on the legacy stream and on a stream of its own.
for mode in "${MODES[@]}"; do
    ns[torch,$mode]=$(hit 1 "$HIT_ITERS" torch "${pooled[@]}" "GPUPOOL_REUSE=$mode")
    ns[torch_stream,$mode]=$(hit 1 "$HIT_ITERS" torch-stream "${pooled[@]}" "GPUPOOL_REUSE=$mode")
done

echo "bench: counters and trace..." >&2
# Counters: the same pairs, alternating the two builds three times (medians of medians).
for round in 1 2 3; do
    for mode in strict relaxed; do
        ns[stats,$mode,$round]=$(hit 1 "$HIT_ITERS" cuda "${pooled[@]}" "GPUPOOL_REUSE=$mode")
        ns[nostats,$mode,$round]=$(hit 1 "$HIT_ITERS" cuda "LD_PRELOAD=$lib_nostats" "GPUPOOL_REUSE=$mode")
    done
done
median3() { printf '%s\n' "$@" | sort -g | sed -n 2p; }
for mode in strict relaxed; do
    ns[stats,$mode]=$(median3 "${ns[stats,$mode,1]}" "${ns[stats,$mode,2]}" "${ns[stats,$mode,3]}")
    ns[nostats,$mode]=$(median3 "${ns[nostats,$mode,1]}" "${ns[nostats,$mode,2]}" "${ns[nostats,$mode,3]}")
done
# Trace: pairs with GPUPOOL_TRACE to a real file (two records per pair).
trace_file=$bin/bench.trace
ns[notrace]=$(hit 1 "$TRACE_ITERS" cuda "${pooled[@]}" GPUPOOL_REUSE=relaxed)
ns[trace]=$(hit 1 "$TRACE_ITERS" cuda "${pooled[@]}" GPUPOOL_REUSE=relaxed "GPUPOOL_TRACE=$trace_file")
trace_bytes=$(stat -c %s "$trace_file" 2>/dev/null || echo 0)
rm -f "$trace_file"
ns[disabled]=$(hit 1 "$RAW_ITERS" cuda "${pooled[@]}" GPUPOOL_DISABLE=1)

echo "bench: overlap loop..." >&2
declare -A wall
for case in "${OVERLAP_CASES[@]}"; do
    read -r k h <<<"$case"
    a=("$bin/overlap" "$OVERLAP_ITERS" "$k" "$h" "$OVERLAP_BYTES")
    out=$(run "${a[@]}")
    wall[$case,none]=$(field wall_ms <<<"$out")
    wall[$case,ideal]=$(field ideal_ms <<<"$out")
    wall[$case,serial]=$(field serial_ms <<<"$out")
    for mode in "${MODES[@]}"; do
        wall[$case,$mode]=$(run "${a[@]}" -- "${pooled[@]}" "GPUPOOL_REUSE=$mode" | field wall_ms)
    done
done

echo "bench: policy comparison..." >&2
tool=$rel/gpupool-trace
figures=$bin/figures
mkdir -p "$figures"
compare_md=$(PIN=1 run "$tool" compare "${WORKLOADS[@]}" --seed "$SEED" --svg-dir "$figures")
# The trace replay itself (gpupool-trace replay: parse and replay a file), on the generated
# inference trace.
replay_trace=$bin/inference.trace
"$tool" generate inference --seed "$SEED" --out "$replay_trace"
replay_records=$(( ($(stat -c %s "$replay_trace") - 8) / 40 ))
replay_best=
for _ in 1 2 3 4 5; do
    t0=$(date +%s%N)
    PIN=1 run "$tool" replay "$replay_trace" >/dev/null
    t1=$(date +%s%N)
    d=$(( t1 - t0 ))
    if [ -z "$replay_best" ] || [ "$d" -lt "$replay_best" ]; then replay_best=$d; fi
done
rm -f "$replay_trace"
# The inference workload's shapes come from the seed: how the comparison goes over many seeds
# (peak reserved against the PyTorch rules, and cudaMalloc calls, from the summary row).
declare -a seed_rows
for s in $(seq 1 "$INFERENCE_SEEDS"); do
    row=$("$tool" compare inference --seed "$s" --min-time 0 |
        awk -F'|' '$2 ~ /^ inference $/ { gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); print $3 "|" $4 }')
    if [ -z "$row" ]; then
        echo "bench: no inference row in gpupool-trace compare's output for seed $s" >&2
        exit 1
    fi
    seed_rows+=("$s|$row")
done

# A trace recorded on a real GPU (bench/traces/README.md): the policies side by side in
# relaxed mode (as the generated workloads), and the pool's own modes, with the program's calls
# as recorded (the preload) and as the pluggable allocator would make them (--one-stream).
echo "bench: the H200 PyTorch trace..." >&2
h200=$bin/h200-torch-train.trace
gzip -dc "$root/bench/traces/h200-torch-train.trace.gz" >"$h200"
h200_md=$(PIN=1 run "$tool" compare "$h200" --reuse relaxed)
declare -a h200_rows
for calls in preload pluggable; do
    for mode in strict barrier relaxed; do
        args=(replay "$h200" --reuse "$mode" --fence-bytes 256MiB)
        [ "$calls" = pluggable ] && args+=(--one-stream)
        row=$("$tool" "${args[@]}" | awk '
            /peak reserved/ { match($0, /peak reserved [0-9.]+ [KMGT]?i?B/); peak = substr($0, RSTART + 14, RLENGTH - 14) }
            /driver calls/ { gsub(/[;,]/, ""); print peak "|" $3 "|" $8 "|" $10 }')
        [ -n "$row" ] || { echo "bench: no figures from gpupool-trace ${args[*]}" >&2; exit 1; }
        h200_rows+=("$calls|$mode|$row")
    done
done
rm -f "$h200"

echo "bench: threads..." >&2
cargo bench --quiet --bench threads --no-run >&2
threads_out=$(run cargo bench --quiet --bench threads -- "THREAD_STEPS=$THREAD_STEPS")
declare -A thr
while read -r mode case value; do thr[$mode,$case]=$value; done <<<"$threads_out"

# The report.
report=$(mktemp)
policies=$(mktemp)
trap 'rm -f "$report" "$policies"' EXIT
{
    cpu_model=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    [ -n "$(git status --porcelain 2>/dev/null)" ] && commit="$commit (with uncommitted changes)"
    echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') on \`$(uname -srm)\`, $(nproc) CPUs" \
        "(${cpu_model:-unknown CPU}), commit $commit, by \`scripts/bench.sh\`" \
        "(hit-path runs pinned: ${pin[*]:-no})."
    echo
    echo "### Hit path: one cudaMalloc+cudaFree pair of $SIZE B vs glibc malloc+free"
    echo
    echo "Median ns per pair of 7 runs of $HIT_ITERS pairs; *live* blocks (512 B–64 KiB, mixed)"
    echo "are allocated first and held during the timing. ×glibc: the pool's pair over glibc's."
    echo
    printf '| live blocks | glibc ns |'
    for mode in "${MODES[@]}"; do printf ' pool %s ns | ×glibc |' "$mode"; done
    echo
    printf '| ---: | ---: |'
    for _ in "${MODES[@]}"; do printf ' ---: | ---: |'; done
    echo
    for live in "${LIVE_COUNTS[@]}"; do
        printf '| %s | %s |' "$(sed ':a;s/\B[0-9]\{3\}\>/ &/;ta' <<<"$live")" "${ns[glibc,$live]}"
        for mode in "${MODES[@]}"; do
            printf ' %s | %s× |' "${ns[$mode,$live]}" "$(ratio "${ns[$mode,$live]}" "${ns[glibc,$live]}")"
        done
        echo
    done
    echo
    echo "Targets (reported, not asserted): pair ≤ 4× glibc's; flat within 1.5× from 1 to 100 000 live blocks."
    echo
    echo "| mode | worst ×glibc | ≤ 4×? | 100 000 live / 1 live | ≤ 1.5×? |"
    echo "| --- | ---: | --- | ---: | --- |"
    for mode in "${MODES[@]}"; do
        worst=0
        for live in "${LIVE_COUNTS[@]}"; do
            r=$(ratio "${ns[$mode,$live]}" "${ns[glibc,$live]}" 2)
            le "$r" "$worst" || worst=$r
        done
        flat=$(ratio "${ns[$mode,100000]}" "${ns[$mode,1]}" 2)
        met4=no; le "$worst" 4 && met4=yes
        met15=no; le "$flat" 1.5 && met15=yes
        echo "| $mode | $worst× | $met4 | $flat× | $met15 |"
    done
    echo
    echo "### PyTorch's pluggable allocator entry points (1 live block, $SIZE B pairs)"
    echo
    echo "\`gpupool_torch_malloc\` + \`gpupool_torch_free\` as \`CUDAPluggableAllocator\` calls them"
    echo "(\`hit_path ... torch\`): on the legacy stream (PyTorch's default stream) and on a"
    echo "non-blocking stream of the program's own, against the cudaMalloc+cudaFree pair above. In"
    echo "\`relaxed\` mode each free names its stream and the next allocation on it takes the block back."
    echo
    echo "| mode | cudaMalloc pair ns | torch, legacy stream ns | ×pair | torch, own stream ns | ×pair |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: |"
    for mode in "${MODES[@]}"; do
        echo "| $mode | ${ns[$mode,1]} | ${ns[torch,$mode]} | $(ratio "${ns[torch,$mode]}" "${ns[$mode,1]}" 2)× | ${ns[torch_stream,$mode]} | $(ratio "${ns[torch_stream,$mode]}" "${ns[$mode,1]}" 2)× |"
    done
    echo
    echo "### What the counters and the trace cost (1 live block, $SIZE B pairs)"
    echo
    echo "The same pairs with the hit-path counters compiled out (\`--no-default-features\`, the"
    echo "\`stats\` feature), alternating the two builds three times; and with \`GPUPOOL_TRACE\` writing"
    echo "to a file ($TRACE_ITERS pairs, 7 runs: two 40-byte records per pair). Target: counters ≤ 10%."
    echo
    echo "| mode | with counters ns | without ns | counters cost |"
    echo "| --- | ---: | ---: | ---: |"
    for mode in strict relaxed; do
        echo "| $mode | ${ns[stats,$mode]} | ${ns[nostats,$mode]} | $(awk -v a="${ns[stats,$mode]}" -v b="${ns[nostats,$mode]}" 'BEGIN { printf "%+.1f%%", (a / b - 1) * 100 }') |"
    done
    echo
    echo "Trace (relaxed): ${ns[notrace]} ns per pair without, ${ns[trace]} ns with:" \
        "$(awk -v a="${ns[trace]}" -v b="${ns[notrace]}" 'BEGIN { printf "%.1f", (a - b) / 2 }') ns per event;" \
        "the file grew by $(awk -v b="$trace_bytes" 'BEGIN { printf "%.1f", b / 1048576 }') MiB."
    echo
    echo "### What the pool avoids: the runtime's own pair ($SIZE B, 1 live block, 7 × $RAW_ITERS pairs)"
    echo
    echo "| path | ns per pair |"
    echo "| --- | ---: |"
    echo "| simulator's cudaMalloc+cudaFree, no pool (CUDASIM_MALLOC_US unset) | ${ns[raw]} |"
    echo "| preloaded with GPUPOOL_DISABLE=1 (pass-through) | ${ns[disabled]} ($(awk -v a="${ns[disabled]}" -v b="${ns[raw]}" 'BEGIN { printf "%+.0f", a - b }') ns) |"
    echo "| pool hit, strict (from the table above, 1 live block) | ${ns[strict,1]} |"
    echo
    echo "On a GPU the driver's pair costs far more than the simulator's mmap+munmap; see"
    echo "\`scripts/gpu-check.sh\`."
    echo
    echo "### Overlap loop: cudaMalloc, kernel, cudaFree, host work ($OVERLAP_ITERS iterations, $((OVERLAP_BYTES >> 20)) MiB blocks)"
    echo
    echo "Wall ms (wall/ideal). No pool: the same program without LD_PRELOAD, whose cudaFree waits"
    echo "for the kernel each time. Ideal: max(kernel, host) per iteration; serial: their sum."
    echo
    printf '| kernel µs | host µs | ideal ms | serial ms | no pool |'
    for mode in "${MODES[@]}"; do printf ' pool %s |' "$mode"; done
    echo
    printf '| ---: | ---: | ---: | ---: | ---: |'
    for _ in "${MODES[@]}"; do printf ' ---: |'; done
    echo
    for case in "${OVERLAP_CASES[@]}"; do
        read -r k h <<<"$case"
        ideal=${wall[$case,ideal]}
        printf '| %s | %s | %s | %s | %s (%s×) |' "$k" "$h" "$ideal" "${wall[$case,serial]}" \
            "${wall[$case,none]}" "$(ratio "${wall[$case,none]}" "$ideal" 2)"
        for mode in "${MODES[@]}"; do
            printf ' %s (%s×) |' "${wall[$case,$mode]}" "$(ratio "${wall[$case,$mode]}" "$ideal" 2)"
        done
        echo
    done
} >"$report"

{
    echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') on \`$(uname -srm)\`, $(nproc) CPUs" \
        "(${cpu_model:-unknown CPU}), commit $commit, by \`scripts/bench.sh\`" \
        "(\`gpupool-trace compare ${WORKLOADS[*]} --seed $SEED\`, pinned: ${pin[*]:-no})."
    echo
    echo "Each workload is generated from seed $SEED and replayed through every policy, each on"
    echo "its own simulated driver. *Peak reserved*: the most bytes the policy held from the"
    echo "driver; *÷ peak requested*: that over the most bytes the program held at once (1.000 is"
    echo "no overhead at all); *cudaMalloc per 1 000 requests*: real allocation calls (the cost a"
    echo "cache exists to avoid); *OOMs*: requests that failed, after the policy's own recovery,"
    echo "with the driver capped (RMM's 16 GiB for the random workloads, 1.1 × peak requested"
    echo "otherwise); *replay events/s*: allocations and frees per second through the policy on"
    echo "one core (median of repeated replays). The threshold policy releases cached memory above"
    echo "1 GiB. Frees are stream-ordered (\`relaxed\`: reusable at once), as PyTorch's allocator"
    echo "assumes and as the PyTorch-rules policy works."
    echo
    echo "$compare_md"
    echo
    echo "Charts (reserved bytes over the run, one line per policy):"
    echo "[training](bench/figures/training.svg), [inference](bench/figures/inference.svg)."
    echo
    echo "**Trace replay** (\`gpupool-trace replay\` of the generated inference trace, parse"
    echo "included, best of 5): $replay_records records in $(awk -v n="$replay_best" 'BEGIN { printf "%.0f", n / 1e6 }') ms," \
        "$(awk -v r="$replay_records" -v n="$replay_best" 'BEGIN { printf "%.1f", r / (n / 1e9) / 1e6 }') million records/s."
    echo
    echo "**Inference across seeds** (\`gpupool-trace compare inference --seed N --min-time 0\`,"
    echo "N = 1–$INFERENCE_SEEDS; the target: at least 10% less peak reserved than the PyTorch rules with"
    echo "no more \`cudaMalloc\` calls):"
    echo
    echo "| seed | peak reserved vs PyTorch rules | cudaMalloc calls vs PyTorch rules |"
    echo "| ---: | ---: | ---: |"
    for r in "${seed_rows[@]}"; do
        IFS='|' read -r s mem calls <<<"$r"
        echo "| $s | $mem | $calls |"
    done
    echo
    printf '%s\n' "${seed_rows[@]}" | awk -F'|' '
        { m = $2; gsub(/[ %+]/, "", m); m += 0; sum += m; n++
          split($3, c, /[()]/); split(c[2], v, / vs /); gsub(/ /, "", v[1]); gsub(/ /, "", v[2])
          if (m <= -10 && v[1] + 0 <= v[2] + 0) met++ }
        END { printf "Mean %+.1f%%; the target met on %d of %d seeds.\n", sum / n, met, n }'
    echo
    echo "**A trace recorded on a GPU** (\`bench/traces/h200-torch-train.trace.gz\`: the PyTorch"
    echo "training loop of \`tests/gpu/torch_train.py\` on an H200 under the preload, 2026-11-30; see"
    echo "\`bench/traces/README.md\`). The policies side by side with stream-ordered frees, as above"
    echo "(\`gpupool-trace compare TRACE --reuse relaxed\`):"
    echo
    echo "$h200_md"
    echo
    echo "The pool's own modes on the same trace (\`gpupool-trace replay TRACE --reuse MODE"
    echo "--fence-bytes 256MiB\`, and with \`--one-stream\` for the calls PyTorch's pluggable allocator"
    echo "makes: every allocation and free on PyTorch's stream). PyTorch's own allocator reserved"
    echo "5.73 GiB in that run."
    echo
    echo "| calls | mode | peak reserved | cudaMalloc calls | fences | barriers |"
    echo "| --- | --- | ---: | ---: | ---: | ---: |"
    for r in "${h200_rows[@]}"; do
        IFS='|' read -r calls mode peak mallocs fences barriers <<<"$r"
        echo "| $calls | $mode | $peak | $mallocs | $fences | $barriers |"
    done
    echo
    echo "**Threads** (\`THREAD_STEPS=$THREAD_STEPS cargo bench --bench threads\`: the pool API, a churn of"
    echo "64 held blocks of 512 B–4 MiB per thread, one free and one allocation per step; million"
    echo "operations per second, median of 5 runs; this machine has $(nproc) CPUs):"
    echo
    echo "| mode | one thread | two threads, two devices | ×one | two threads, one device | ×one | same, thread caches off | ×one |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for mode in strict barrier relaxed; do
        one=${thr[$mode,one_thread]}
        two=${thr[$mode,two_threads_two_devices]}
        same=${thr[$mode,two_threads_one_device]}
        off=${thr[$mode,two_threads_one_device_no_thread_cache]}
        echo "| $mode | $(ratio "$one" 1e6) | $(ratio "$two" 1e6) | $(ratio "$two" "$one" 2)× | $(ratio "$same" 1e6) | $(ratio "$same" "$one" 2)× | $(ratio "$off" 1e6) | $(ratio "$off" "$one" 2)× |"
    done
    echo
    echo "Thread caches (\`GPUPOOL_THREAD_CACHE\`, 64 MiB per thread by default) start with the second"
    echo "thread in \`relaxed\` mode, and in \`strict\` and \`barrier\` once the threads compete for the device's lock."
} >"$policies"

cat "$report" "$policies"

# Rewrite a marked section of BENCHMARKS.md (append the markers if the file lacks them).
doc=$root/BENCHMARKS.md
[ -f "$doc" ] || echo "# Benchmarks" >"$doc"
rewrite() { # rewrite NAME FILE
    local begin="<!-- $1:begin -->" end="<!-- $1:end -->"
    grep -qxF "$begin" "$doc" && grep -qxF "$end" "$doc" || printf '\n%s\n%s\n' "$begin" "$end" >>"$doc"
    awk -v b="$begin" -v e="$end" -v f="$2" '
        $0 == b { print; print ""; while ((getline l < f) > 0) print l; print ""; skip = 1; next }
        $0 == e { skip = 0 }
        !skip
    ' "$doc" >"$doc.tmp"
    mv "$doc.tmp" "$doc"
}
rewrite bench "$report"
rewrite policies "$policies"
mkdir -p bench/figures
cp "$figures/training.svg" "$figures/inference.svg" bench/figures/
echo "bench: wrote $doc and bench/figures/ (raw output: $log)" >&2
