"""torch.cuda.memory as PyTorch has it for a pluggable allocator, recording what it is asked.

CUDAPluggableAllocator opens the library and takes both functions by name, as PyTorch's C++
does with dlopen and dlsym. change_current_allocator refuses once "CUDA is initialized"
(FAKE_TORCH_INITIALIZED=1), with PyTorch's message. The statistics calls raise as PyTorch's do.
"""
import ctypes
import os

calls = []
current = None

_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)


class CUDAPluggableAllocator:
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        calls.append(("CUDAPluggableAllocator", path_to_so_file, alloc_fn_name, free_fn_name))
        lib = ctypes.CDLL(path_to_so_file)
        self.malloc = _ALLOC(ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value)
        self.free = _FREE(ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value)
        if os.environ.get("FAKE_TORCH_CPU") == "1":
            # PyTorch's class then calls torch._C._cuda_customAllocator, which a build without
            # CUDA does not have.
            raise AttributeError("module 'torch._C' has no attribute '_cuda_customAllocator'")


def change_current_allocator(allocator):
    global current
    if os.environ.get("FAKE_TORCH_INITIALIZED") == "1":
        raise RuntimeError("Can't swap an already initialized allocator")
    calls.append(("change_current_allocator", allocator))
    current = allocator


def _not_supported(*args, **kwargs):
    raise RuntimeError("CUDAPluggableAllocator does not yet support this call")


empty_cache = memory_allocated = max_memory_allocated = _not_supported
memory_reserved = max_memory_reserved = memory_stats = memory_summary = _not_supported
reset_peak_memory_stats = _not_supported
