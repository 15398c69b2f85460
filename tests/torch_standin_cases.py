"""Single scenarios through the PyTorch stand-in (tests/c/torch_standin.c), loaded RTLD_LOCAL as
PyTorch loads libc10_cuda. Prints key=value lines for tests/pytorch.rs.

usage: torch_standin_cases.py LIBC10_CUDA CASE

record_stream  a tensor of the default stream, used by a slow kernel on a side stream and
               recorded there (Tensor.record_stream), is dropped; the next tensor of its size
               on the default stream is written at once, and must not be clobbered when that
               kernel completes.
two_devices    tensors on device 1 only: its figures, device 0's (never set up: 0), and
               empty_cache over the devices set up.
cache_info     cuDNN's workspace guess (cacheInfo) after tensors were freed into the cache."""
import ctypes
import os
import sys

MIB = 1 << 20


def check(what: str, status: int) -> None:
    if status != 0:
        sys.exit(f"{what} failed with CUDA error {status}")


def main() -> None:
    lib = ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL | os.RTLD_NOW)
    case = sys.argv[2]
    u64, vp = ctypes.c_ulonglong, ctypes.c_void_p
    for name in ("reserved", "allocated", "reserved_peak", "allocated_peak"):
        getattr(lib, f"standin_{name}").restype = u64
    lib.standin_alloc.argtypes = [ctypes.POINTER(vp), ctypes.c_size_t]
    lib.standin_alloc_on.argtypes = [ctypes.POINTER(vp), ctypes.c_size_t, vp]
    lib.standin_free.argtypes = [vp]
    lib.standin_tag_intact.argtypes = [vp]
    lib.standin_record_stream.argtypes = [vp, vp]
    lib.standin_kernel.argtypes = [vp, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, vp]
    cudart = ctypes.CDLL("libcudart.so.12")

    def alloc(size: int, stream: "int | None" = None) -> int:
        p = vp()
        check("alloc", lib.standin_alloc_on(ctypes.byref(p), size, stream))
        return p.value

    def side_stream() -> int:
        # PyTorch's stream pool: non-blocking streams (cudaStreamNonBlocking = 1).
        s = vp()
        check("cudaStreamCreateWithFlags", cudart.cudaStreamCreateWithFlags(ctypes.byref(s), 1))
        return s.value

    print(f"backend={lib.standin_backend()}")
    if case == "record_stream":
        side = side_stream()
        reused = intact = 0
        for _ in range(3):
            a = alloc(MIB)
            # The side stream's kernel reads the tensor for 200 ms, then writes over it.
            check("kernel", lib.standin_kernel(a, MIB, 200_000, 0xAB, side))
            check("record_stream", lib.standin_record_stream(a, side))
            check("free", lib.standin_free(a))
            b = alloc(MIB)
            reused += b == a
            check("cudaDeviceSynchronize", cudart.cudaDeviceSynchronize())
            intact += lib.standin_tag_intact(b) == 1
            check("free", lib.standin_free(b))
        print(f"same_address={reused}")
        print(f"intact={intact}")
    elif case == "two_devices":
        check("cudaSetDevice", cudart.cudaSetDevice(1))
        side = side_stream()
        kept = [alloc(3 * MIB), alloc(5 * MIB, side)]
        dropped = alloc(7 * MIB)
        check("record_stream", lib.standin_record_stream(kept[0], side))
        check("free", lib.standin_free(dropped))
        print(f"dev1_allocated={lib.standin_allocated()}")
        print(f"dev1_reserved={lib.standin_reserved()}")
        check("cudaSetDevice", cudart.cudaSetDevice(0))
        print(f"dev0_reserved={lib.standin_reserved()}")
        check("empty_cache", lib.standin_empty_cache())
        check("cudaSetDevice", cudart.cudaSetDevice(1))
        print(f"dev1_reserved_after_empty={lib.standin_reserved()}")
        for p in kept:
            check("free", lib.standin_free(p))
        check("empty_cache", lib.standin_empty_cache())
        print(f"dev1_reserved_at_end={lib.standin_reserved()}")
        print(f"dev1_allocated_at_end={lib.standin_allocated()}")
    elif case == "cache_info":
        lib.standin_cache_info.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
        for size in (64 * MIB, 24 * MIB, 3 * MIB):
            check("free", lib.standin_free(alloc(size)))
        print(f"reserved_before={lib.standin_reserved()}")
        guess = ctypes.c_size_t()
        check("cache_info", lib.standin_cache_info(ctypes.byref(guess)))
        print(f"guess={guess.value}")
        print(f"reserved_after={lib.standin_reserved()}")
    else:
        sys.exit(f"unknown case {case}")
    print("done=1")


if __name__ == "__main__":
    main()
