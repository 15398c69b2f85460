"""PyTorch's allocator from libgpupool, without the preload: `gpupool.torch.use()`.

Importing this module does not import torch; `use()` does. The pluggable-allocator route
suits a program that cannot be started under `python -m gpupool`. Under the launcher or the
preload, PyTorch already allocates through the pool and nothing here is needed.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from . import _api

_ALLOC = "gpupool_torch_malloc"
_FREE = "gpupool_torch_free"

_allocator: Optional[Any] = None


def use() -> Any:
    """Makes libgpupool PyTorch's CUDA allocator, and PyTorch's memory calls the pool's.

    Call it before the first CUDA tensor: PyTorch refuses to change allocators after that.
    PyTorch's statistics calls raise "not supported" for a pluggable allocator, and its Python
    class hides `set_reset_fn`, which `torch.cuda.empty_cache()` would call. So this also
    replaces those calls in `torch.cuda` and `torch.cuda.memory` (see `_wire`). Returns the
    `CUDAPluggableAllocator`; a second call returns the same one.
    """
    global _allocator
    if _allocator is not None:
        return _allocator
    torch = _import_torch()
    path = _api.library_path()
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, _ALLOC, _FREE)
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as error:
        raise RuntimeError(
            "gpupool.torch.use() must run before PyTorch initializes CUDA (the first CUDA "
            f"tensor, or torch.cuda.init()): PyTorch cannot change its allocator then. "
            f"PyTorch said: {error}") from error
    _wire(torch)
    _allocator = allocator
    return allocator


def _import_torch() -> Any:
    """torch, if it can be imported and was built with CUDA; else an error that says so.

    A build without CUDA (the `+cpu` wheels) has `torch.cuda.memory.CUDAPluggableAllocator`,
    but constructing one fails on a missing binding (`torch._C._cuda_customAllocator`).
    """
    try:
        import torch
    except ImportError as error:
        raise ImportError(f"gpupool.torch.use() needs PyTorch, which cannot be imported: "
                          f"{error}", name=error.name, path=error.path) from error
    if getattr(getattr(torch, "version", None), "cuda", None) is None:
        raise RuntimeError(
            f"gpupool.torch.use() needs a CUDA build of PyTorch; torch "
            f"{getattr(torch, '__version__', '?')} was built without CUDA (torch.version.cuda "
            f"is None)")
    return torch


def _wire(torch: Any) -> None:
    """Points PyTorch's memory calls at the pool, in both places a program may call them.

    - `empty_cache()`: the pool's, on every device (`gpupool_empty_cache(-1)`).
    - `memory_allocated`, `memory_reserved` and their `max_` forms: the pool's figures for the
      device; peaks are since the last `reset_peak_memory_stats()`, as PyTorch's are.
    - `memory_stats()`: PyTorch's keys for what the pool counts (`allocated_bytes`,
      `reserved_bytes`, `requested_bytes`, `allocation`, `segment`, all with `.all.current`,
      `.peak`, `.allocated`, `.freed`; `num_alloc_retries`, `num_ooms`). The pool does not
      split its figures into PyTorch's small and large pools, so only `all` is given.
    - `memory_summary()`: the pool's summary table.
    - `reset_peak_memory_stats()`: the pool's `gpupool_reset_peak_stats`; the summary keeps
      the run's peaks.
    """
    calls = {
        "empty_cache": empty_cache,
        "memory_allocated": _reader(torch, "allocated_bytes", "current"),
        "max_memory_allocated": _reader(torch, "allocated_bytes", "peak_since_reset"),
        "memory_reserved": _reader(torch, "reserved_bytes", "current"),
        "max_memory_reserved": _reader(torch, "reserved_bytes", "peak_since_reset"),
        "memory_stats": lambda device=None: memory_stats(_index(torch, device)),
        "memory_summary": lambda device=None, abbreviated=False: _api.summary(),
        "reset_peak_memory_stats": lambda device=None: _api.reset_peak_stats(
            _index(torch, device)),
    }
    for module in (torch.cuda, torch.cuda.memory):
        for name, call in calls.items():
            setattr(module, name, call)


def empty_cache() -> None:
    """`torch.cuda.empty_cache()`: gives every device's free segments back to the driver."""
    _api.empty_cache(_api.ALL_DEVICES)


def _index(torch: Any, device: Any) -> int:
    """A device ordinal from what PyTorch's calls accept: None, an int, a str, a
    `torch.device`, a `torch.cuda.device`. What PyTorch refuses is refused: a device that is
    not CUDA's ("cpu"), and a negative ordinal, which the pool would read as every device."""
    if device is None:
        return int(torch.cuda.current_device())
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, int):
        index: Optional[int] = device
    else:
        if getattr(device, "type", "cuda") != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {device}")
        # `torch.cuda.device(1)` holds its ordinal as `idx`, `torch.device` as `index`.
        index = getattr(device, "idx", getattr(device, "index", None))
        if index is None:
            return int(torch.cuda.current_device())
    if index < 0:
        raise RuntimeError(f"Invalid device argument {index}")
    return int(index)


def _device(index: int) -> Dict[str, Any]:
    """The pool's figures for one device; empty for a device it has not used yet."""
    for entry in _api.stats()["devices"]:
        if entry["device"] == index:
            return entry
    return {}


def _reader(torch: Any, name: str, field: str) -> Callable[..., int]:
    """A `torch.cuda.memory_*(device=None)` call reading one field of one gauge of the pool:
    from `gpupool_get_stats` (a program may log it at every step: the JSON summary costs
    milliseconds with thousands of live blocks), or from the summary where that call cannot
    say (a device it does not know, a library without the field)."""
    counter = name if field == "current" else f"{name}_{field}"

    def read(device: Any = None) -> int:
        index = _index(torch, device)
        try:
            value = _api.counters(index).get(counter)
        except _api.GpupoolError:
            value = None
        if value is None:
            value = _device(index).get(name, {}).get(field, 0)
        return int(value)

    return read


def memory_stats(index: int) -> Dict[str, int]:
    """`torch.cuda.memory_stats()` in PyTorch's keys, for the figures the pool keeps."""
    entry = _device(index)
    names = {"allocated_bytes": "allocated_bytes", "reserved_bytes": "reserved_bytes",
             "requested_bytes": "requested_bytes", "allocation": "live_blocks",
             "segment": "segments"}
    out: Dict[str, int] = {}
    for torch_name, pool_name in names.items():
        gauge = entry.get(pool_name, {})
        for torch_field, pool_field in (("current", "current"), ("peak", "peak_since_reset"),
                                        ("allocated", "total_in"), ("freed", "total_out")):
            out[f"{torch_name}.all.{torch_field}"] = int(gauge.get(pool_field, 0))
    oom = entry.get("out_of_memory", {})
    out["num_alloc_retries"] = int(oom.get("retries", 0))
    out["num_ooms"] = int(oom.get("returned", 0))
    return dict(sorted(out.items()))
