# Sourced by scripts: locate the CUDA runtime simulator built by cargo and the link directory
# programs are built against. Expects PROFILE (debug|release), sets SIM_INCLUDE and SIMLIB.
# shellcheck shell=bash
SIM_INCLUDE="$PWD/cudasim/include"
SIMLIB="$PWD/target/${PROFILE:-release}/simlib"
mkdir -p "$SIMLIB"
for name in libcudart.so libcudart.so.12; do
    ln -sfn ../libcudasim.so "$SIMLIB/$name"
done
# Compile a C program against the simulator: sim_cc OUTPUT SOURCE [FLAGS...]
sim_cc() {
    local out=$1 src=$2
    shift 2
    cc -std=c11 -O2 -Wall -Wextra -Werror -I "$SIM_INCLUDE" "$@" "$src" -o "$out" \
        -L "$SIMLIB" -lcudart -Wl,-rpath,"$SIMLIB" -lpthread
}
