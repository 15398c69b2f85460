"""libgpupool as PyTorch's allocator, for the PyTorch programs of scripts/gpu-check.sh."""

import ctypes
import sys

import torch


def install(lib):
    """Make libgpupool at path `lib` PyTorch's CUDA allocator (before any CUDA tensor exists)."""
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        lib, "gpupool_torch_malloc", "gpupool_torch_free"
    )
    torch.cuda.memory.change_current_allocator(allocator)


def start(lib):
    """A program's start: libgpupool at path `lib` made PyTorch's allocator (None: PyTorch's
    own stays), then CUDA device 0, or None with a FAIL line when CUDA is not available."""
    if lib:
        install(lib)
    if not torch.cuda.is_available():
        print("FAIL: torch.cuda.is_available() is False", file=sys.stderr)
        return None
    return torch.device("cuda", 0)


def write_summary(lib):
    """The pool's summary on stderr, after what the program printed so far."""
    sys.stdout.flush()
    ctypes.CDLL(lib).gpupool_write_summary(2)


def finish(lib, last_line):
    """A program's end: the pool's summary if libgpupool at path `lib` was the allocator (None:
    it was not), then `last_line` (NAME=ok or NAME=done), which gpu-check looks for. Returns the
    exit status."""
    if lib:
        write_summary(lib)
    print(last_line)
    sys.stdout.flush()
    return 0
