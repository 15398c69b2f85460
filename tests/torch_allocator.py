"""Calls libgpupool's PyTorch entry points the way torch.cuda.memory.CUDAPluggableAllocator does:
the library is opened with ctypes, the two functions are taken by name as raw addresses, and
called through those addresses with PyTorch's signatures
    void *alloc(ssize_t size, int device, cudaStream_t stream)
    void free(void *ptr, ssize_t size, int device, cudaStream_t stream)
on the CUDA runtime simulator, loaded first as PyTorch's extension modules load the runtime:
RTLD_LOCAL, or RTLD_GLOBAL with CUDART_GLOBAL=1 (torch's own wheels, where the runtime then
precedes libgpupool in the global scope: the library's calls to its own hooks must still bind
inside it).

usage: torch_allocator.py LIBGPUPOOL LIBCUDART   (with CUDASIM_DEVICES=2)"""
import ctypes
import os
import sys

MIB = 1 << 20

scope = os.RTLD_GLOBAL if os.environ.get("CUDART_GLOBAL") == "1" else os.RTLD_LOCAL
cudart = ctypes.CDLL(sys.argv[2], mode=scope | os.RTLD_NOW)
allocator = ctypes.CDLL(sys.argv[1])  # what CUDAPluggableAllocator does with path_to_so_file

ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
RESET = ctypes.CFUNCTYPE(None)


def address(name):
    return ctypes.cast(getattr(allocator, name), ctypes.c_void_p).value


alloc = ALLOC(address("gpupool_torch_malloc"))
free = FREE(address("gpupool_torch_free"))
empty_cache = RESET(address("gpupool_torch_empty_cache"))


class SimStats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t)] + [
        (name, ctypes.c_ulonglong)
        for name in (
            "malloc_calls malloc_failures free_calls live_allocations live_bytes peak_live_bytes "
            "device_syncs stream_syncs event_syncs implicit_syncs event_records "
            "stream_wait_events kernels_launched kernel_writes"
        ).split()
    ]


def sim(device):
    st = SimStats(struct_size=ctypes.sizeof(SimStats))
    assert cudart.cudasimGetStats(device, ctypes.byref(st)) == 0
    return st


def current_device():
    d = ctypes.c_int(-1)
    assert cudart.cudaGetDevice(ctypes.byref(d)) == 0
    return d.value


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


# Device 1 is current; PyTorch asks for memory on device 0: it lands there, and device 1 stays
# current.
assert cudart.cudaSetDevice(1) == 0
p = alloc(3 * MIB, 0, None)
check(p, "alloc on device 0 returned NULL")
check(p % 256 == 0, f"pointer {p:#x} not aligned")
check(current_device() == 1, f"current device changed to {current_device()}")
check(sim(0).live_bytes >= 3 * MIB and sim(1).live_bytes == 0, "memory on the wrong device")
ctypes.memset(p, 0xAB, 3 * MIB)  # simulator memory is host memory

q = alloc(5 * MIB, 1, None)
check(q and sim(1).live_bytes >= 5 * MIB, "alloc on device 1")
check(current_device() == 1, "current device changed")

# A stream of device 0, made current for its creation only.
assert cudart.cudaSetDevice(0) == 0
stream = ctypes.c_void_p()
assert cudart.cudaStreamCreate(ctypes.byref(stream)) == 0
assert cudart.cudaSetDevice(1) == 0
blocks = [alloc(MIB, 0, stream) for _ in range(8)]
check(all(blocks) and len(set(blocks)) == 8, "stream allocations")
spans = sorted(blocks + [p])
check(all(b - a >= MIB for a, b in zip(spans, spans[1:])), "blocks overlap")
for b in blocks:
    free(b, MIB, 0, stream)

# Refused: a negative size, a device that does not exist; the current device is kept.
check(alloc(-1, 0, None) is None, "negative size")
check(alloc(MIB, 7, None) is None, "device 7")
check(current_device() == 1, "a refused call changed the device")
cudart.cudaGetLastError()
free(None, 0, 0, None)

# Churn in PyTorch's way is served from the cache. In strict mode (the default), blocks freed
# in stream order wait for a fence, which the pool takes once GPUPOOL_FENCE_BYTES (256 MiB) of
# them wait: 1 000 allocations of 1 MiB need about 128 segments of 2 MiB, not 500.
before = sim(0).malloc_calls
for _ in range(1000):
    x = alloc(MIB, 0, None)
    check(x, "churn alloc")
    free(x, MIB, 0, None)
real = sim(0).malloc_calls - before
check(real <= 200, f"{real} real cudaMalloc calls for 1000 allocations")

if os.environ.get("GPUPOOL_REUSE") == "relaxed":
    # PyTorch's own rule: a block freed on a stream serves the next allocation on that stream
    # at once, before any barrier; a churn on one stream needs one block.
    # On the program's stream, and on the legacy stream (NULL), PyTorch's default stream.
    for on in (stream, None):
        before = sim(0).malloc_calls
        first = alloc(3 * MIB, 0, on)
        for _ in range(1000):
            free(first, 3 * MIB, 0, on)
            x = alloc(3 * MIB, 0, on)
            check(x == first, f"churn on {on} got {x:#x}, not the block {first:#x} freed on it")
        free(first, 3 * MIB, 0, on)
        real = sim(0).malloc_calls - before
        check(real <= 1, f"{real} real cudaMalloc calls for a churn on stream {on}")

# A free that names another device than the block's still frees it (the device named is only
# where the pool looks first): nothing stays live for empty_cache below.
wrong = alloc(2 * MIB, 0, None)
check(wrong, "alloc for the wrong-device free")
free(wrong, 2 * MIB, 1, None)

free(p, 3 * MIB, 0, None)
free(q, 5 * MIB, 1, None)
empty_cache()  # what CUDAPluggableAllocator's reset function would do
check(sim(0).live_bytes == 0 and sim(1).live_bytes == 0,
      f"empty cache left {sim(0).live_bytes} + {sim(1).live_bytes} bytes")
print("torch allocator ok")
