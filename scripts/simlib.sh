# Sourced by scripts: locate the CUDA runtime simulator built by cargo and the link directory
# programs are built against. Expects PROFILE (debug|release), sets SIM_INCLUDE and SIMLIB.
# The driver (libcuda.so.1) is a second name of the same library; libcuda.so is the link-time
# stub (soname libcuda.so.1) that `-lcuda` needs, as in cudasim/tests/common/mod.rs.
# Sets TARGET_DIR too: cargo's, `CARGO_TARGET_DIR` where set (a worktree's own), else ./target.
# shellcheck shell=bash
TARGET_DIR=$(realpath -m "${CARGO_TARGET_DIR:-$PWD/target}")
SIM_INCLUDE="$PWD/cudasim/include"
SIMLIB="$TARGET_DIR/${PROFILE:-release}/simlib"
mkdir -p "$SIMLIB"
for name in libcudart.so libcudart.so.12 libcuda.so.1; do
    ln -sfn ../libcudasim.so "$SIMLIB/$name"
done
if [ ! -f "$SIMLIB/libcuda.so" ] || [ -L "$SIMLIB/libcuda.so" ] ||
    [ cudasim/stub/libcuda.c -nt "$SIMLIB/libcuda.so" ]; then
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 cudasim/stub/libcuda.c -o "$SIMLIB/libcuda.so.tmp$$"
    mv -f "$SIMLIB/libcuda.so.tmp$$" "$SIMLIB/libcuda.so"
fi
# Compile a C program against the simulator: sim_cc OUTPUT SOURCE [FLAGS...]
sim_cc() {
    local out=$1 src=$2
    shift 2
    cc -std=c11 -O2 -Wall -Wextra -Werror -I "$SIM_INCLUDE" "$@" "$src" -o "$out" \
        -L "$SIMLIB" -lcudart -Wl,-rpath,"$SIMLIB" -lpthread
}
