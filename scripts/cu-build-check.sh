#!/usr/bin/env bash
# Builds the GPU check's CUDA programs (tests/gpu/*.cu) with nvcc 13.0 from PyPI, the version
# on the GPU machine, as scripts/gpu-check.sh builds them there (-O2 -cudart shared
# -arch=sm_90), with the host compiler's warnings as errors. No GPU is needed: this only
# proves that the next GPU run's programs compile. The compiler goes into target/nvcc (about
# 300 MB, installed once). Usage: scripts/cu-build-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$PWD/target/nvcc
pins=("nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*"
      "nvidia-nvvm==13.0.*")
if [ ! -x "$venv/bin/python3" ] || ! "$venv/bin/python3" -c 'import nvidia' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "${pins[@]}"
fi
cuda=$("$venv/bin/python3" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')
ln -sfn libcudart.so.13 "$cuda/lib/libcudart.so"
out=$PWD/target/cu-build
mkdir -p "$out"
passed=0 failed=0
for src in tests/gpu/*.cu; do
    name=$(basename "$src" .cu)
    # cuBLAS is not installed here (hundreds of MB): its program is compiled, not linked.
    link=(-L"$cuda/lib" -lpthread -ldl)
    [ "$name" = cublas_loop ] && link=(-c)
    if "$cuda/bin/nvcc" -O2 -cudart shared -arch=sm_90 -Xcompiler -Wall,-Wextra,-Werror \
        -o "$out/$name" "$src" "${link[@]}" >"$out/$name.log" 2>&1; then
        echo "cu-build: $name ok"
        passed=$((passed + 1))
    else
        echo "cu-build: $name FAILED"
        cat "$out/$name.log"
        failed=$((failed + 1))
    fi
done
echo "cu-build: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
