#!/usr/bin/env bash
# Data races and undefined behaviour in the pool's own code, with nightly Rust's tools (not run
# by scripts/test.sh or CI: they need a nightly toolchain with rust-src and miri, and take
# several minutes):
#   - ThreadSanitizer over the library's unit tests (the pool, its thread caches and spin lock
#     driven by real threads against the model backend): any race report fails the run;
#   - Miri (two schedules each) over the spin lock's tests and the thread caches' multi-thread
#     tests that finish there in minutes: any undefined behaviour, data race or weak-memory
#     violation Miri finds fails the run.
#
# usage: scripts/sanitize.sh [tsan|miri]   (both when no argument; about 10 and 2 minutes on a
#        2-core machine)
#   rustup toolchain install nightly && rustup component add rust-src miri --toolchain nightly
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
case $what in
    all | tsan | miri) ;;
    *)
        echo "usage: scripts/sanitize.sh [tsan|miri]" >&2
        exit 2
        ;;
esac
if ! rustc +nightly --version >/dev/null 2>&1; then
    echo "sanitize.sh: needs a nightly toolchain: rustup toolchain install nightly" >&2
    exit 2
fi
target=$(rustc +nightly -vV | sed -n 's/^host: //p')
out=target/sanitize
mkdir -p "$out"

if [[ $what == all || $what == tsan ]]; then
    if ! rustup +nightly component list --installed 2>/dev/null | grep -q '^rust-src'; then
        echo "sanitize.sh: ThreadSanitizer needs rust-src: rustup component add rust-src --toolchain nightly" >&2
        exit 2
    fi
    echo "== ThreadSanitizer: the library's unit tests"
    # std is rebuilt with the sanitizer (-Zbuild-std), so its atomics and locks are seen too.
    TSAN_OPTIONS="halt_on_error=0 exitcode=66" RUSTFLAGS="-Zsanitizer=thread" \
        cargo +nightly test -q -Zbuild-std --target "$target" --lib --target-dir "$out/tsan" \
        -- --test-threads=1 2>&1 | tee "$out/tsan.log" | grep -E '^test result|WARNING: ThreadSanitizer' || true
    if grep -q 'WARNING: ThreadSanitizer' "$out/tsan.log"; then
        echo "ThreadSanitizer reported races: $out/tsan.log" >&2
        exit 1
    fi
    grep -q '^test result: ok' "$out/tsan.log" || { echo "tests failed: $out/tsan.log" >&2; exit 1; }
fi

if [[ $what == all || $what == miri ]]; then
    if ! cargo +nightly miri --version >/dev/null 2>&1; then
        echo "sanitize.sh: needs miri: rustup component add miri --toolchain nightly" >&2
        exit 2
    fi
    echo "== Miri: the spin lock and the thread caches"
    # The tests that drive the caches from several threads and finish under Miri in minutes (the
    # stress tests with thousands of operations would take hours there; ThreadSanitizer runs them).
    MIRIFLAGS="-Zmiri-disable-isolation -Zmiri-many-seeds=0..2" \
        cargo +nightly miri test -q --lib --target-dir "$out/miri" -- \
        pool::spin:: a_block_from_one_threads_cache_is_freed_by_another \
        a_device_reset_empties_thread_caches a_device_reset_with_thread_caches \
        a_double_free_into_a_thread_cache_is_refused \
        a_fence_budget_of_none_with_thread_caches_does_not_overflow
fi
echo "sanitize.sh: no reports"
