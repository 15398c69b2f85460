"""libgpupool from Python: the pool's figures and controls, in the process that uses it.

`import gpupool` finds the libgpupool already loaded, however it came (LD_PRELOAD,
`-lgpupool`, or PyTorch's pluggable allocator, which loads it privately). It loads the
package's own copy only when none is loaded, so the figures are those of the pool that serves
the program. `python -m gpupool -- COMMAND` runs a command under the pool; `gpupool.torch.use()`
makes it PyTorch's allocator. docs/pytorch.md describes all three.
"""
from ._api import (
    ALL_DEVICES,
    KEEP_ALL,
    GpupoolError,
    counters,
    empty_cache,
    enabled,
    library_path,
    reset_peak_stats,
    set_release_threshold,
    stats,
    summary,
    version,
)
from ._library import PACKAGE_LIBRARY

__all__ = [
    "ALL_DEVICES",
    "KEEP_ALL",
    "PACKAGE_LIBRARY",
    "GpupoolError",
    "counters",
    "empty_cache",
    "enabled",
    "library_path",
    "reset_peak_stats",
    "set_release_threshold",
    "stats",
    "summary",
    "version",
]
