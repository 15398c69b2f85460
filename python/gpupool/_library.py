"""Finds the libgpupool of this process: the one already loaded, else the package's own copy.

A process has one pool only if every caller talks to the same copy of the library. A second copy
would keep a second pool, whose figures would describe none of the program's memory. So the
search looks at what the dynamic linker already holds before it loads anything.
"""
from __future__ import annotations

import ctypes
import os
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Iterator, Optional, Tuple


def _package_library() -> Path:
    """The library file in this package's directory. A wheel names it `libgpupool.abi3.so`; an
    editable install (`pip install -e .`) builds it in place under this interpreter's suffix,
    such as `libgpupool.cpython-311-x86_64-linux-gnu.so`. The wheel's name when there is none."""
    here = Path(__file__).resolve().parent
    names = ["libgpupool.abi3.so", *(f"libgpupool{suffix}" for suffix in EXTENSION_SUFFIXES)]
    return next((here / name for name in names if (here / name).is_file()), here / names[0])


#: The library file shipped in this package (LD_PRELOAD takes this path as it is).
PACKAGE_LIBRARY = _package_library()

_PROBE = "gpupool_version"
#: What /proc/self/maps appends to the path of a mapped file that was removed since.
_DELETED = " (deleted)"


def own_library() -> Path:
    """The library this package loads or preloads: `GPUPOOL_LIBRARY` when set (one built or
    installed elsewhere, as on a machine the wheel was not built for), else the package's own."""
    override = os.environ.get("GPUPOOL_LIBRARY")
    return Path(override).resolve() if override else PACKAGE_LIBRARY


def _mappings() -> Iterator[Tuple[int, int, str]]:
    """Yields (start, end, path) for each file mapped into this process.

    The paths are the file system's bytes, decoded as Python decodes file names (`os.fsdecode`):
    a name that is not UTF-8 then opens the same file again, where a replacement character
    would name none."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(b"/"):
                    start, end = fields[0].split(b"-")
                    yield int(start, 16), int(end, 16), os.fsdecode(fields[5].rstrip(b"\n"))
    except OSError:
        return


def _path_of(address: int) -> Optional[str]:
    """The file whose mapping holds `address`: where a symbol found by name came from."""
    for start, end, path in _mappings():
        if start <= address < end:
            return path
    return None


def _is_gpupool_file(path: str) -> bool:
    """A mapped file that may be libgpupool: any name starting `libgpupool`, or our own copy."""
    return os.path.basename(path).startswith("libgpupool") or path == str(own_library())


def _from_global_scope() -> Optional[Tuple[ctypes.CDLL, str]]:
    """The library preloaded or linked (`-lgpupool`): visible to a lookup by name."""
    process = ctypes.CDLL(None)
    if not hasattr(process, _PROBE):
        return None
    address = ctypes.cast(getattr(process, _PROBE), ctypes.c_void_p).value or 0
    path = _path_of(address)
    if path is None:
        return None
    if path.endswith(_DELETED):
        # The file was removed or replaced since it was loaded (a reinstall of the package): a
        # load by its path would open another copy, or none. The global scope still resolves
        # every name to the loaded one.
        return process, path[: -len(_DELETED)]
    return _already_loaded(path)


def _already_loaded(path: str) -> Optional[Tuple[ctypes.CDLL, str]]:
    """A handle on `path` only if the dynamic linker holds it already (RTLD_NOLOAD).

    RTLD_NOLOAD never loads a second copy, and RTLD_LOCAL never makes a library loaded locally
    (as PyTorch's pluggable allocator loads it) visible to later lookups by name.
    """
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY | os.RTLD_LOCAL)
    except OSError:
        return None
    return (lib, path) if hasattr(lib, _PROBE) else None


def _from_mappings() -> Optional[Tuple[ctypes.CDLL, str]]:
    """The library loaded with RTLD_LOCAL, which lookups by name cannot see."""
    seen = set()
    for _, _, path in _mappings():
        if path in seen or path.endswith(_DELETED) or not _is_gpupool_file(path):
            continue
        seen.add(path)
        found = _already_loaded(path)
        if found is not None:
            return found
    return None


def _own_copy() -> Tuple[ctypes.CDLL, str]:
    """The package's library, loaded RTLD_LOCAL: its hooks then serve nobody else's calls.

    Raises OSError naming what to change when it cannot be loaded.
    """
    path = str(own_library())
    try:
        return ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW), path
    except OSError as error:
        if os.environ.get("GPUPOOL_LIBRARY"):
            fix = "GPUPOOL_LIBRARY names it: point it at a libgpupool.so, or unset it"
        elif not os.path.isfile(path):
            fix = ("the package lacks its library: `pip install .` builds it; or set "
                   "GPUPOOL_LIBRARY to a libgpupool.so")
        else:
            # A wheel built on a newer system than this one, for example.
            fix = "set GPUPOOL_LIBRARY to a libgpupool.so built on this machine"
        raise OSError(f"gpupool cannot load its library: {error} ({fix})") from None


def find() -> Tuple[ctypes.CDLL, str]:
    """The library this process already uses, else the package's copy, with its path."""
    return _from_global_scope() or _from_mappings() or _own_copy()
