"""The C API of include/gpupool.h, through ctypes: argument types, error checks, results."""
from __future__ import annotations

import ctypes
import json
import operator
from typing import Any, Dict, Optional, Tuple

from . import _library

#: `GPUPOOL_ALL_DEVICES`: every device, where a function allows it.
ALL_DEVICES = -1
#: `GPUPOOL_KEEP_ALL`: the release threshold that keeps every cached byte.
KEEP_ALL = (1 << 64) - 1

_FORMAT_TEXT = 0
_FORMAT_JSON = 1

_ERRORS = {
    1: "invalid value",
    2: "out of memory",
    35: "no CUDA runtime",
    101: "invalid device",
    999: "internal error, a call from inside the pool, or a failed write",
}


class GpupoolError(RuntimeError):
    """A `gpupool_*` call returned a CUDA error code; `code` holds it."""

    def __init__(self, function: str, code: int) -> None:
        meaning = _ERRORS.get(code, "CUDA runtime error")
        super().__init__(f"{function} failed with CUDA error {code} ({meaning})")
        self.function = function
        self.code = code

    def __reduce__(self) -> Tuple[type, Tuple[str, int]]:
        # Pickled (multiprocessing sends a worker's exception to its parent) and copied from
        # what __init__ takes: the default would call it with the message alone.
        return type(self), (self.function, self.code)


_handle: Optional[ctypes.CDLL] = None
_path: Optional[str] = None


def _lib() -> ctypes.CDLL:
    """The library, found once: the process keeps one pool, so the answer never changes."""
    global _handle, _path
    if _handle is None:
        lib, path = _library.find()
        _declare(lib)
        _handle, _path = lib, path
    return _handle


def _declare(lib: ctypes.CDLL) -> None:
    """Argument and result types; ctypes would otherwise pass 64-bit values as C ints."""
    u64, size = ctypes.c_uint64, ctypes.c_size_t
    lib.gpupool_version.restype = ctypes.c_char_p
    lib.gpupool_version.argtypes = []
    lib.gpupool_enabled.restype = ctypes.c_int
    lib.gpupool_enabled.argtypes = []
    lib.gpupool_empty_cache.argtypes = [ctypes.c_int, ctypes.POINTER(u64)]
    lib.gpupool_set_release_threshold.argtypes = [ctypes.c_int, u64]
    lib.gpupool_get_summary.argtypes = [
        ctypes.c_int, ctypes.c_char_p, size, ctypes.POINTER(size)]
    lib.gpupool_reset_peak_stats.argtypes = [ctypes.c_int]
    lib.gpupool_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats)]
    for function in (lib.gpupool_empty_cache, lib.gpupool_set_release_threshold,
                     lib.gpupool_get_summary, lib.gpupool_reset_peak_stats,
                     lib.gpupool_get_stats):
        function.restype = ctypes.c_int


#: The counters of `gpupool_stats` (include/gpupool.h), in its order, after `size_t
#: struct_size`: each a uint64_t. New fields only ever come at the end.
_STATS_FIELDS = (
    "requested_bytes", "requested_bytes_peak", "allocated_bytes", "allocated_bytes_peak",
    "allocated_bytes_total", "reserved_bytes", "reserved_bytes_peak", "cached_bytes",
    "pending_bytes", "largest_free_block", "active_allocations", "active_allocations_peak",
    "segments", "segments_peak", "alloc_calls", "free_calls", "cache_hits", "cache_misses",
    "driver_mallocs", "driver_frees", "threshold_released_bytes",
    "empty_cache_released_bytes", "oom_released_bytes", "fences", "barriers", "oom_retries",
    "oom_recovered", "ooms", "invalid_frees", "resets", "outgrown_released_bytes",
    "stream_hits", "mapped_bytes", "address_space_bytes", "releasable_bytes",
    "stranded_bytes", "requested_bytes_peak_since_reset", "allocated_bytes_peak_since_reset",
    "reserved_bytes_peak_since_reset", "active_allocations_peak_since_reset",
    "segments_peak_since_reset",
)


class _Stats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t)] + [(n, ctypes.c_uint64) for n in _STATS_FIELDS]


def _check(function: str, code: int) -> None:
    if code != 0:
        raise GpupoolError(function, code)


_INVALID_DEVICE = 101
_INT_MAX = (1 << 31) - 1


def _device(function: str, device: Any) -> int:
    """`device` as the C `int` the library takes. ctypes would wrap a larger int to 32 bits
    (2**32 - 1 to -1, every device; 2**32 to device 0), so one out of range is refused here
    with the library's own answer for a device that does not exist."""
    try:
        index = operator.index(device)
    except TypeError:
        raise TypeError(f"{function}: device is an int (-1 for every device), not "
                        f"{type(device).__name__}") from None
    if not -1 <= index <= _INT_MAX:
        raise GpupoolError(function, _INVALID_DEVICE)
    return index


def library_path() -> str:
    """The path of the libgpupool this process uses."""
    _lib()
    assert _path is not None
    return _path


def version() -> str:
    """The loaded library's version, such as "0.1.0"."""
    return _lib().gpupool_version().decode()


def enabled() -> bool:
    """True when the pool serves allocations: not `GPUPOOL_DISABLE=1`, and a runtime found."""
    return _lib().gpupool_enabled() == 1


def _summary_bytes(format: int) -> bytes:
    """The summary in `format`, asking again with a larger buffer while it grows."""
    lib = _lib()
    length = ctypes.c_size_t(0)
    _check("gpupool_get_summary", lib.gpupool_get_summary(format, None, 0, ctypes.byref(length)))
    while True:
        buf = ctypes.create_string_buffer(length.value + 1)
        _check("gpupool_get_summary",
               lib.gpupool_get_summary(format, buf, len(buf), ctypes.byref(length)))
        if length.value < len(buf):
            return buf.value


def summary() -> str:
    """The summary table that `GPUPOOL_SUMMARY` prints at exit, as of now."""
    return _summary_bytes(_FORMAT_TEXT).decode("utf-8", errors="replace")


def stats() -> Dict[str, Any]:
    """The JSON summary as a dict, with its field names: one entry of "devices" per device the
    pool has used, in order, its ordinal in "device" (not its index in the list).

    Sizes are in bytes and times in nanoseconds. A gauge such as `allocated_bytes` is a dict
    of `current`, `peak`, `peak_since_reset`, `total_in` and `total_out` (docs/reports.md
    explains each figure).
    """
    return json.loads(_summary_bytes(_FORMAT_JSON))


def counters(device: int = ALL_DEVICES) -> Dict[str, int]:
    """The counters of `gpupool_get_stats` for `device` (-1: sums over every device), by the
    field names of include/gpupool.h's `gpupool_stats`.

    Cheaper than `stats()`, which writes and parses the whole JSON summary (its live blocks and
    their holders included): for a figure read at every step. A library older than this
    package fills fewer fields; those it left out are absent.
    """
    index = _device("gpupool_get_stats", device)
    out = _Stats(struct_size=ctypes.sizeof(_Stats))
    _check("gpupool_get_stats", _lib().gpupool_get_stats(index, ctypes.byref(out)))
    return {name: getattr(out, name) for name in _STATS_FIELDS
            if getattr(_Stats, name).offset + 8 <= out.struct_size}


def empty_cache(device: int = ALL_DEVICES) -> int:
    """Gives whole free segments of `device` (-1: every device) back to the driver.

    Returns the bytes released. Live allocations are untouched.
    """
    index = _device("gpupool_empty_cache", device)
    released = ctypes.c_uint64(0)
    _check("gpupool_empty_cache", _lib().gpupool_empty_cache(index, ctypes.byref(released)))
    return released.value


def reset_peak_stats(device: int = ALL_DEVICES) -> None:
    """Starts each figure's `peak_since_reset` over from its current value (-1: every device).

    The run's `peak`, which the summary reports, stays.
    """
    index = _device("gpupool_reset_peak_stats", device)
    _check("gpupool_reset_peak_stats", _lib().gpupool_reset_peak_stats(index))


def set_release_threshold(threshold: Optional[int], device: int = ALL_DEVICES) -> None:
    """Cached bytes to keep on `device` (-1: every device, now and later); None keeps all.

    Above it, whole free segments go back to the driver at the next synchronization or
    allocation, as with `cudaMemPoolAttrReleaseThreshold`. Call `empty_cache()` to release now.
    """
    if threshold is None:
        value = KEEP_ALL
    else:
        try:
            value = operator.index(threshold)
        except TypeError:
            raise TypeError(f"the release threshold is an int byte count or None, not "
                            f"{type(threshold).__name__} ({threshold!r})") from None
    if not 0 <= value <= KEEP_ALL:
        raise ValueError(f"release threshold {threshold} is not a byte count")
    index = _device("gpupool_set_release_threshold", device)
    _check("gpupool_set_release_threshold",
           _lib().gpupool_set_release_threshold(index, value))
