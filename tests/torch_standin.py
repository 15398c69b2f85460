"""A training loop through the PyTorch stand-in (tests/c/torch_standin.c), loaded RTLD_LOCAL
as PyTorch loads libc10_cuda. Prints key=value lines for tests/pytorch.rs.

usage: torch_standin.py LIBC10_CUDA STEPS

Each step allocates a batch of tensors of mixed sizes, frees them, and reads the figures
PyTorch's memory calls would give. Then everything is freed, empty_cache runs, and the figures
are read again, with cudaMemGetInfo before and after."""
import ctypes
import json
import os
import sys

MIB = 1 << 20
SIZES = [4096, 300_000, MIB, 3 * MIB, 7 * MIB, 24 * MIB]


def main() -> None:
    lib = ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL | os.RTLD_NOW)
    steps = int(sys.argv[2])
    u64 = ctypes.c_ulonglong
    for name in ("reserved", "allocated", "reserved_peak", "allocated_peak"):
        getattr(lib, f"standin_{name}").restype = u64
    lib.standin_alloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.standin_free.argtypes = [ctypes.c_void_p]
    cudart = ctypes.CDLL("libcudart.so.12")

    def mem_get_info() -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        check("cudaMemGetInfo", cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)))
        return free.value, total.value

    def check(what: str, status: int) -> None:
        if status != 0:
            sys.exit(f"{what} failed with CUDA error {status}")

    print(f"backend={lib.standin_backend()}")
    print(f"free_at_start={mem_get_info()[0]}")
    tensors = []
    peak_live = 0
    for _ in range(steps):
        batch = []
        for size in SIZES:
            p = ctypes.c_void_p()
            check("alloc", lib.standin_alloc(ctypes.byref(p), size))
            batch.append(p.value)
        peak_live = max(peak_live, lib.standin_allocated())
        for p in batch:
            check("free", lib.standin_free(p))
    # A few tensors that stay live over the reset and the empty_cache.
    for size in SIZES[:2]:
        p = ctypes.c_void_p()
        check("alloc", lib.standin_alloc(ctypes.byref(p), size))
        tensors.append(p.value)
    print(f"allocations={steps * len(SIZES) + 2}")
    print(f"allocated_in_step={peak_live}")
    print(f"allocated_kept={lib.standin_allocated()}")
    print(f"reserved_before_empty={lib.standin_reserved()}")
    print(f"reserved_peak_before_reset={lib.standin_reserved_peak()}")
    check("reset_peak", lib.standin_reset_peak())
    print(f"allocated_peak_after_reset={lib.standin_allocated_peak()}")
    print(f"reserved_peak_after_reset={lib.standin_reserved_peak()}")
    check("empty_cache", lib.standin_empty_cache())
    print(f"reserved_after_empty={lib.standin_reserved()}")
    print(f"free_after_empty={mem_get_info()[0]}")
    for p in tensors:
        check("free", lib.standin_free(p))
    check("empty_cache", lib.standin_empty_cache())
    print(f"reserved_at_end={lib.standin_reserved()}")
    print(f"free_at_end={mem_get_info()[0]}")
    stats = pool_stats()
    if stats is not None and stats["devices"]:
        device = stats["devices"][0]
        print(f"pool_allocations={device['allocations']}")
        print(f"pool_reserved_peak={device['reserved_bytes']['peak']}")


def pool_stats() -> "dict | None":
    """The pool's JSON summary when the pool is loaded (the preload), else None."""
    try:
        pool = ctypes.CDLL(None).gpupool_get_summary
    except AttributeError:
        return None
    length = ctypes.c_size_t()
    if pool(1, None, 0, ctypes.byref(length)) != 0:
        return None
    buf = ctypes.create_string_buffer(length.value + 1)
    pool(1, buf, length.value + 1, ctypes.byref(length))
    return json.loads(buf.value.decode())


if __name__ == "__main__":
    main()
