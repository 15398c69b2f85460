#!/usr/bin/env bash
# Runs every test of the project: formatting, lints, the pool's unit tests, and the integration
# tests (C and Python programs run under the preloaded library against the CUDA simulator).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# --locked: a Cargo.lock that no longer matches a manifest fails here, not rewritten in the tree.
cargo build --workspace --locked
# tests/packaging.rs builds a program with pkg-config against an installed prefix.
if ! command -v pkg-config >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq pkgconf >/dev/null
fi
# tests/report/ validates the Prometheus summary with the reference parser.
python3 -c 'import prometheus_client' 2>/dev/null || python3 -m pip install --quiet prometheus_client
# The tools' own tests: gpu-check's steps and a whole run with stand-ins, bench's reports.
python3 -m unittest discover -q -s tools
cargo test --workspace
# The Python package, installed with pip into a fresh virtual environment (python3 -m venv needs
# Debian's python3-venv).
if ! python3 -c 'import ensurepip' 2>/dev/null && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi
python3 tests/python_package_test.py
# The C programs under valgrind's memcheck (installs valgrind if missing).
scripts/valgrind.sh
# The fuzz targets' corpus plus seeded mutations, on stable (cargo-fuzz itself needs nightly).
cargo test --locked --quiet --manifest-path fuzz/Cargo.toml
# The GPU check's CUDA programs still compile (nvcc 13.0 from PyPI; no GPU needed).
scripts/cu-build-check.sh
