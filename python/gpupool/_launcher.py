"""`python -m gpupool [options] -- COMMAND ARGS...`: runs COMMAND with libgpupool preloaded.

The options are those of scripts/gpupool-run, mapped to the same GPUPOOL_* variables. The
launcher then replaces itself with the command (`os.execvpe`): the pid, the exit status and the
signals are the command's own, as under a shell's `exec`.
"""
from __future__ import annotations

import errno
import os
import shlex
import shutil
import signal
import struct
import sys
from typing import Dict, List, NoReturn, Optional, Sequence, Tuple

from ._library import PACKAGE_LIBRARY

USAGE = """\
usage: python -m gpupool [options] [--] COMMAND [ARGS...]

Runs COMMAND with libgpupool preloaded: its cudaMalloc/cudaFree are served from a caching pool.

options:
  -s, --summary DEST     print a summary at exit: stderr, stdout, or a file path
                         (%p -> pid, %r -> rank, %h -> host)          GPUPOOL_SUMMARY
  -t, --threshold SIZE   cached bytes to keep per device: 512MiB, 4GiB, 40%, none
                                                                      GPUPOOL_RELEASE_THRESHOLD
  -r, --reuse MODE       when freed memory is reused: strict (default), barrier, relaxed
                                                                      GPUPOOL_REUSE
  -l, --limit SIZE       the most the pool reserves per device: 20GiB, 50%, none
                                                                      GPUPOOL_LIMIT
      --max-split SIZE   never split cached blocks this large         GPUPOOL_MAX_SPLIT_SIZE
      --disable          load the library but pass every call through GPUPOOL_DISABLE=1
      --lib PATH         the library to preload (default: $GPUPOOL_LIBRARY, else the one in
                         this package)
  -n, --dry-run          print the environment and command instead of running it
  -h, --help             this text

Unless PYTORCH_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF or PYTORCH_NO_CUDA_MEMORY_CACHING is set,
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync sends PyTorch's tensors to the pool.

example:
  python -m gpupool --summary stderr --threshold 4GiB -- python train.py
"""

#: Options that take a value, by every spelling, and the variable each one sets.
_VALUED = {
    "-s": "GPUPOOL_SUMMARY", "--summary": "GPUPOOL_SUMMARY",
    "-t": "GPUPOOL_RELEASE_THRESHOLD", "--threshold": "GPUPOOL_RELEASE_THRESHOLD",
    "-r": "GPUPOOL_REUSE", "--reuse": "GPUPOOL_REUSE",
    "-l": "GPUPOOL_LIMIT", "--limit": "GPUPOOL_LIMIT",
    "--max-split": "GPUPOOL_MAX_SPLIT_SIZE",
    "--lib": "",
}
_REUSE_MODES = ("strict", "barrier", "relaxed")
#: PyTorch's own allocator settings: when the user set any of them, the launcher keeps out.
PYTORCH_SETTINGS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
                    "PYTORCH_NO_CUDA_MEMORY_CACHING")
PYTORCH_ASYNC = "backend:cudaMallocAsync"


class UsageError(Exception):
    """A bad command line: one line on stderr, exit 2."""


class Options:
    """What the command line asked for."""

    def __init__(self) -> None:
        self.variables: Dict[str, str] = {}
        self.lib: Optional[str] = None
        self.dry_run = False
        self.help = False
        self.command: List[str] = []


def _split(arg: str) -> Tuple[str, Optional[str]]:
    """`--name=value` into its two halves; anything else with no value."""
    if arg.startswith("--") and "=" in arg:
        name, value = arg.split("=", 1)
        return name, value
    return arg, None


def _set(options: Options, name: str, value: str) -> None:
    # `--summary -- prog`: the value was forgotten, and `--` is where the command starts.
    if not value or value == "--":
        raise UsageError(f"{name} needs a value (see --help)")
    if name in ("-r", "--reuse") and value not in _REUSE_MODES:
        raise UsageError(f"--reuse is strict, barrier or relaxed (got '{value}')")
    if name == "--lib":
        options.lib = value
    else:
        options.variables[_VALUED[name]] = value


def parse(argv: Sequence[str]) -> Options:
    """The options up to `--` or the first word that is not an option, then the command."""
    options, args = Options(), list(argv)
    while args:
        arg = args.pop(0)
        name, value = _split(arg)
        if name in _VALUED:
            _set(options, name, value if value is not None else (args.pop(0) if args else ""))
        elif arg == "--disable":
            options.variables["GPUPOOL_DISABLE"] = "1"
        elif arg in ("-n", "--dry-run"):
            options.dry_run = True
        elif arg in ("-h", "--help"):
            options.help = True
            return options
        elif arg == "--":
            break
        elif arg.startswith("-") and arg != "-":
            raise UsageError(f"unknown option '{arg}' (see --help)")
        else:
            args.insert(0, arg)
            break
    options.command = args
    if not options.command:
        raise UsageError("no command to run (see --help)")
    return options


def library(requested: Optional[str], env: Dict[str, str]) -> str:
    """The absolute path to preload; LD_PRELOAD splits at spaces and colons, so those fail.

    `--lib` and `GPUPOOL_LIBRARY` keep a symbolic link as it is: a link from a path without
    spaces is the way round a library in a directory with them.
    """
    chosen = requested or env.get("GPUPOOL_LIBRARY")
    path = os.path.abspath(chosen) if chosen else str(PACKAGE_LIBRARY)
    # An error names the variable when the path came from it: that is what to change.
    named = " (named by GPUPOOL_LIBRARY)" if chosen and not requested else ""
    if not chosen and not os.path.isfile(path):
        raise UsageError(f"{path}: no such file (the package lacks its library: "
                         "`pip install .` builds it; or pass --lib)")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file{named}")
    if not _is_shared_library(path):
        raise UsageError(f"{path}: not a shared library that can be read{named}")
    if any(c.isspace() or c == ":" for c in path):
        raise UsageError(f"{path}: LD_PRELOAD cannot hold a path with spaces or colons "
                         "(pass --lib a symbolic link to it from a path without them)")
    return path


_ET_DYN = 3
_PT_DYNAMIC = 2
_DT_FLAGS_1 = 0x6FFFFFFB
_DF_1_PIE = 0x08000000


def _elf_kind(path: str) -> Optional[Tuple[int, int, int]]:
    """(class, machine, type) of the ELF file `path`, or None when it is none."""
    with open(path, "rb") as file:
        head = file.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[5] not in (1, 2):
        return None
    e_type, e_machine = struct.unpack_from("<HH" if head[5] == 1 else ">HH", head, 16)
    return head[4], e_machine, e_type


def _is_pie(path: str) -> bool:
    """Whether the ELF object `path` is a position-independent executable (`DF_1_PIE` in its
    dynamic section): an ET_DYN file, as a library is, that the dynamic linker will not load."""
    with open(path, "rb") as file:
        head = file.read(64)
        wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
        # e_phoff, then e_phentsize and e_phnum; a program header's p_type, p_offset, p_filesz.
        phoff, (phentsize, phnum) = (
            struct.unpack_from(order + ("Q" if wide else "I"), head, 32 if wide else 28)[0],
            struct.unpack_from(order + "HH", head, 54 if wide else 42))
        header = struct.Struct(order + ("I4xQ16xQ" if wide else "II8xI"))
        entry = struct.Struct(order + ("qQ" if wide else "iI"))
        for i in range(min(phnum, 256)):
            file.seek(phoff + i * phentsize)
            p_type, offset, size = header.unpack(file.read(header.size))
            if p_type != _PT_DYNAMIC:
                continue
            file.seek(offset)
            data = file.read(min(size, 1 << 16))
            for tag, value in entry.iter_unpack(data[:len(data) - len(data) % entry.size]):
                if tag == _DT_FLAGS_1:
                    return bool(value & _DF_1_PIE)
    return False


def _is_shared_library(path: str) -> bool:
    """Whether `path` can be read and is an ELF shared library for this machine (the class
    and machine of the running interpreter). The dynamic linker skips any other preload (an
    object file, an executable, another architecture's library) with one line, and the
    command would then run without the pool."""
    try:
        kind = _elf_kind(path)
        if kind is None or kind[2] != _ET_DYN:
            return False
        try:
            native = _elf_kind("/proc/self/exe")
        except OSError:
            native = None
        if native is not None and kind[:2] != native[:2]:
            return False
        return not _is_pie(path)
    except (OSError, struct.error, IndexError):
        return False


def preload(existing: str, lib: str) -> str:
    """`existing` with `lib` appended once: what is preloaded already keeps its place."""
    entries = existing.replace(":", " ").split()
    if lib in entries:
        return existing
    return f"{existing}:{lib}" if existing else lib


def _truthy(value: str) -> bool:
    """A boolean variable as the library reads it (`config::parse_bool`)."""
    return value.strip().lower() in ("1", "true", "yes", "on")


def environment(options: Options, env: Dict[str, str]) -> Dict[str, str]:
    """The variables the launcher sets, in the order it prints them."""
    added = dict(options.variables)
    added["LD_PRELOAD"] = preload(env.get("LD_PRELOAD", ""), library(options.lib, env))
    disabled = _truthy(added.get("GPUPOOL_DISABLE", env.get("GPUPOOL_DISABLE", "")))
    if not disabled and not any(name in env for name in PYTORCH_SETTINGS):
        added["PYTORCH_CUDA_ALLOC_CONF"] = PYTORCH_ASYNC
        # As the library's constructor marks it: the summary then says the pool chose it.
        added["GPUPOOL_SET_PYTORCH_CUDA_ALLOC_CONF"] = "1"
    return added


def inherited() -> Dict[str, str]:
    """The environment the launcher was started with, which a shell's `exec` would pass on.

    Python changes its own at start-up: in the C or POSIX locale it sets LC_CTYPE=C.UTF-8
    (PEP 538), and `os.environ` holds that. The command would then run in another locale than
    without the launcher. /proc/self/environ still holds what the launcher was given.
    """
    try:
        with open("/proc/self/environ", "rb") as file:
            block = file.read()
    except OSError:
        return dict(os.environ)
    env: Dict[str, str] = {}
    for entry in block.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals and name:
            # The first of two entries with one name wins, as in getenv(3) and os.environ.
            env.setdefault(os.fsdecode(name), os.fsdecode(value))
    return env


#: Signals Python ignores at start-up (SIGPIPE, so that a write to a closed pipe raises instead;
#: SIGXFSZ, so that a write past the file size limit does). An ignored signal stays ignored
#: across `exec`, so the command would get EPIPE where it expects to die of SIGPIPE (`yes | head`
#: would print "Broken pipe"). They go back to the default first, as subprocess's
#: `restore_signals` does.
_RESTORED = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ")
                  if hasattr(signal, name))


def _say(message: str) -> None:
    """One line on stderr, or nothing when stderr is closed. Never on stdout, where
    `print(file=sys.stderr)` writes when Python started without a stderr (`sys.stderr` None)."""
    if sys.stderr is None:
        return
    try:
        sys.stderr.write(f"gpupool: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _out(text: str) -> None:
    """`text` on stdout, now. A reader that has gone (`--help | true`) ends the launcher by
    SIGPIPE, as it ends gpupool-run and any other shell tool, not with a traceback.

    Written as the bytes it came from (`os.fsencode`): arguments and variables that are not
    UTF-8 (a Latin-1 file name) come out as given, where stdout's own encoding would refuse
    them in a UTF-8 locale."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
            out = getattr(sys.stdout, "buffer", sys.stdout)
            out.write(os.fsencode(text) if out is not sys.stdout else text)
            out.flush()
    except BrokenPipeError:
        # Python would report the unflushed rest again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
        sys.exit(128 + signal.SIGPIPE)


def _run_as_script(command: List[str], env: Dict[str, str]) -> None:
    """An executable file that is no binary and has no `#!` line is a shell script: execvp(3),
    env(1) and a shell's `exec` run it with /bin/sh, and so does the launcher. Raises OSError
    when it cannot."""
    path = _found(command[0], env)
    if path is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command[0])
    os.execve("/bin/sh", ["/bin/sh", path, *command[1:]], env)


def _found(name: str, env: Dict[str, str]) -> Optional[str]:
    """The executable file `name` runs: itself when it holds a slash, else the first in PATH."""
    if "/" in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return shutil.which(name, path=env.get("PATH", os.defpath))


def _script_hint(command: List[str]) -> str:
    """For a Python script that did not run as a command (`python -m gpupool train.py`, as
    torchrun and `python -m cProfile` take one): how to run it, to end the line with."""
    if not (command[0].endswith(".py") and os.path.isfile(command[0])):
        return ""
    return f" (to run a Python script: python -m gpupool -- python {shlex.join(command)})"


def _run(command: List[str], env: Dict[str, str]) -> NoReturn:
    """Becomes `command`; exits 127 or 126 as a shell does when it cannot."""
    for signo in _RESTORED:
        signal.signal(signo, signal.SIG_DFL)
    try:
        try:
            if not command[0]:
                # Nothing to look for (Python's execvpe would raise ValueError): not found, as
                # in a shell.
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command[0])
            os.execvpe(command[0], command, env)
        except OSError as error:
            if error.errno != errno.ENOEXEC:
                raise
            _run_as_script(command, env)
    except OSError as error:
        for signo in _RESTORED:
            signal.signal(signo, signal.SIG_IGN)
        if isinstance(error, FileNotFoundError):
            # execve(2) also says ENOENT when the file is there but what it needs to start
            # is not. Then "command not found" would send the user looking for the wrong file.
            if _found(command[0], env) is not None:
                _say(f"{command[0]}: cannot execute: required file not found (the "
                     "interpreter its #! line names, or the loader of a binary)")
            elif "/" in command[0]:
                _say(f"{command[0]}: no such file")
            else:
                _say(f"{command[0]}: command not found{_script_hint(command)}")
            sys.exit(127)
        # execve(2) says EACCES for a directory too.
        reason = "is a directory" if os.path.isdir(command[0]) else error.strerror
        _say(f"{command[0]}: {reason}{_script_hint(command)}")
        sys.exit(126)


def main(argv: Sequence[str]) -> int:
    """The launcher's entry point; returns only for --help, --dry-run and errors."""
    try:
        options = parse(argv)
        if options.help:
            _out(USAGE)
            return 0
        env = inherited()
        added = environment(options, env)
    except UsageError as error:
        _say(str(error))
        return 2
    if options.dry_run:
        _out("".join(f"{name}={value}\n" for name, value in added.items())
             + shlex.join(options.command) + "\n")
        return 0
    _out("")
    _run(options.command, {**env, **added})
