"""The Python package, installed with `pip install .` into a fresh virtual environment.

The wheel's contents, the launcher (`python -m gpupool`), `import gpupool` under the preload
and without it, and `gpupool.torch` with a stand-in for torch (tests/python/fake_torch). The
programs run on the project's CUDA runtime simulator. The package is built with
CARGO_TARGET_DIR set to the repository's target directory, so a warm build takes seconds.

usage: python3 tests/python_package_test.py   (from scripts/test.sh, after cargo build)
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import unittest
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")).resolve()
SIMLIB = TARGET / "debug" / "simlib"
VENV = TARGET / "python-package-venv"
PYTHON = VENV / "bin" / "python"
FAKE_TORCH = ROOT / "tests" / "python" / "fake_torch"
MIB = 1 << 20

# Set in setUpModule.
PACKAGE_LIBRARY = Path()
LAUNCHED = Path()


def clean_env(**extra: str) -> Dict[str, str]:
    """The environment without anything of ours or PyTorch's, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUPOOL_", "CUDASIM_", "PYTORCH_")) and k != "LD_PRELOAD"}
    env.update(extra)
    return env


def run(cmd: List[str], env: Optional[Dict[str, str]] = None,
        check: bool = True) -> subprocess.CompletedProcess:
    """Runs `cmd` with a deadline; with `check`, fails the test with its output on failure."""
    done = subprocess.run([str(c) for c in cmd], env=env or clean_env(), capture_output=True,
                          text=True, timeout=300)
    if check and done.returncode != 0:
        raise AssertionError(f"{cmd} exited {done.returncode}\n--- stdout\n{done.stdout}"
                             f"\n--- stderr\n{done.stderr}")
    return done


def sim_cc(out: Path, src: Path, *flags: str) -> None:
    """A C program built against the simulator: scripts/simlib.sh's sim_cc, for this target."""
    SIMLIB.mkdir(parents=True, exist_ok=True)
    for name in ("libcudart.so", "libcudart.so.12", "libcuda.so.1"):
        link = SIMLIB / name
        if not link.is_symlink():
            link.symlink_to("../libcudasim.so")
    run(["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror",
         "-I", ROOT / "cudasim" / "include", "-I", ROOT / "tests" / "c", src, "-o", out,
         "-L", SIMLIB, "-lcudart", f"-Wl,-rpath,{SIMLIB}", "-lpthread", *flags])


def setUpModule() -> None:
    global PACKAGE_LIBRARY, LAUNCHED
    env = dict(os.environ, CARGO_TARGET_DIR=str(TARGET))
    run(["cargo", "build", "--quiet", "-p", "cudasim", "-p", "gpupool", "--lib"], env=env)
    LAUNCHED = TARGET / "debug" / "python-launched"
    sim_cc(LAUNCHED, ROOT / "tests" / "c" / "launched.c")
    shutil.rmtree(VENV, ignore_errors=True)
    run([sys.executable, "-m", "venv", VENV])
    started = time.monotonic()
    run([PYTHON, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", ROOT],
        env=env)
    print(f"pip install . took {time.monotonic() - started:.0f} s", file=sys.stderr)
    found = run([PYTHON, "-c", "import gpupool; print(gpupool.PACKAGE_LIBRARY)"])
    PACKAGE_LIBRARY = Path(found.stdout.strip())


_STANDIN: List[Path] = []


def torch_standin() -> Path:
    """The PyTorch stand-in of tests/pytorch.rs (tests/c/torch_standin.c) as libc10_cuda.so,
    linked with the simulator as PyTorch is with the runtime; built once per run."""
    if not _STANDIN:
        lib = TARGET / "debug" / "python-standin" / "libc10_cuda.so"
        lib.parent.mkdir(parents=True, exist_ok=True)
        sim_cc(lib, ROOT / "tests" / "c" / "torch_standin.c", "-shared", "-fPIC")
        _STANDIN.append(lib)
    return _STANDIN[0]


def python(code: str, env: Dict[str, str], *args: object,
           launcher: Optional[List[str]] = None) -> dict:
    """Runs `code ARGS` in the venv's Python (under the launcher when given); returns its JSON."""
    cmd = [PYTHON, "-c", textwrap.dedent(code), *args]
    if launcher is not None:
        cmd = [PYTHON, "-m", "gpupool", *launcher, "--", *cmd]
    return json.loads(run(cmd, env=env).stdout)


def dry_run(*args: str, **env: str) -> List[str]:
    """The lines `python -m gpupool --dry-run` prints."""
    done = run([PYTHON, "-m", "gpupool", "--dry-run", *args], env=clean_env(**env))
    return done.stdout.splitlines()


class Wheel(unittest.TestCase):
    def test_carries_the_library_and_the_tool(self) -> None:
        self.assertTrue(PACKAGE_LIBRARY.is_file(), PACKAGE_LIBRARY)
        self.assertEqual(PACKAGE_LIBRARY.name, "libgpupool.abi3.so")
        record = next(VENV.glob("lib/python*/site-packages/gpupool-*.dist-info/RECORD"))
        files = [line.split(",")[0] for line in record.read_text().splitlines()]
        self.assertIn("gpupool/libgpupool.abi3.so", files)
        self.assertTrue(any(f.endswith("bin/gpupool-trace") for f in files), files)
        self.assertIn("replay", run([VENV / "bin" / "gpupool-trace", "--help"]).stdout)

    def test_an_editable_install_finds_its_library(self) -> None:
        # `pip install -e .` builds the library in place, in python/gpupool, under the name
        # setuptools-rust gives an extension outside a wheel: this interpreter's suffix
        # (libgpupool.cpython-311-x86_64-linux-gnu.so), not `.abi3.so`. The same layout here,
        # beside the sources, without touching them.
        package = TARGET / "debug" / "python-editable" / "gpupool"
        shutil.rmtree(package.parent, ignore_errors=True)
        shutil.copytree(ROOT / "python" / "gpupool", package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        suffix = run([PYTHON, "-c", "import sysconfig; print(sysconfig.get_config_var("
                      "'EXT_SUFFIX'))"]).stdout.strip()
        library = package / f"libgpupool{suffix}"
        shutil.copy(PACKAGE_LIBRARY, library)
        env = clean_env(PYTHONPATH=str(package.parent))
        done = run([PYTHON, "-c", "import gpupool; print(gpupool.library_path()); "
                    "print(gpupool.stats()['intercepted'])"], env=env, check=False)
        self.assertEqual((done.returncode, done.stdout), (0, f"{library}\nFalse\n"), done.stderr)
        done = run([PYTHON, "-m", "gpupool", "--dry-run", "--", "prog"], env=env, check=False)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn(f"LD_PRELOAD={library}", done.stdout.splitlines())


class Launcher(unittest.TestCase):
    def test_dry_run_sets_the_variables_and_appends_the_preload(self) -> None:
        lines = dry_run("--summary", "stderr", "-t", "4GiB", "--reuse=barrier", "--limit",
                        "20GiB", "--max-split", "64MiB", "--disable", "--", "prog", "a b",
                        LD_PRELOAD="/opt/other.so")
        self.assertEqual(lines, [
            "GPUPOOL_SUMMARY=stderr", "GPUPOOL_RELEASE_THRESHOLD=4GiB", "GPUPOOL_REUSE=barrier",
            "GPUPOOL_LIMIT=20GiB", "GPUPOOL_MAX_SPLIT_SIZE=64MiB", "GPUPOOL_DISABLE=1",
            f"LD_PRELOAD=/opt/other.so:{PACKAGE_LIBRARY}", "prog 'a b'"])
        # Disabled as the library reads it, PyTorch is left alone.
        lines = dry_run("prog", GPUPOOL_DISABLE="yes")
        self.assertFalse([l for l in lines if "PYTORCH_" in l], lines)
        # Without --disable, PyTorch's cudaMallocAsync backend is chosen, and marked as the
        # pool's choice.
        lines = dry_run("prog")
        self.assertIn("PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync", lines)
        self.assertIn("GPUPOOL_SET_PYTORCH_CUDA_ALLOC_CONF=1", lines)

    def test_dry_run_prints_arguments_that_are_not_utf8_as_given(self) -> None:
        # A file name in another encoding, in a UTF-8 locale, where Python's stdout refuses
        # what it cannot encode (en_US.UTF-8 does; PYTHONIOENCODING makes it so here): the
        # command line comes out byte for byte, as gpupool-run's does, not as a traceback.
        done = subprocess.run(
            [bytes(PYTHON), b"-m", b"gpupool", b"--dry-run", b"--summary", b"/tmp/s\xe9.txt",
             b"--", b"prog", b"caf\xe9.txt"],
            env=clean_env(PYTHONIOENCODING="utf-8:strict"), capture_output=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr.decode(errors="replace"))
        lines = done.stdout.splitlines()
        self.assertIn(b"GPUPOOL_SUMMARY=/tmp/s\xe9.txt", lines)
        self.assertEqual(lines[-1], b"prog 'caf\xe9.txt'")

    def test_the_library_is_preloaded_once(self) -> None:
        lines = dry_run("prog", LD_PRELOAD=f"{PACKAGE_LIBRARY} /opt/other.so")
        self.assertIn(f"LD_PRELOAD={PACKAGE_LIBRARY} /opt/other.so", lines)

    def test_pytorch_settings_of_the_user_are_left_alone(self) -> None:
        for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
                     "PYTORCH_NO_CUDA_MEMORY_CACHING"):
            with self.subTest(name):
                lines = dry_run("prog", **{name: "0"})
                self.assertFalse([l for l in lines if "PYTORCH_" in l], lines)

    def test_bad_command_lines_exit_2_with_one_line(self) -> None:
        for args in (["--reuse", "fast", "prog"], ["--threshold"], ["--frobnicate", "prog"],
                     [], ["--lib", "/nonexistent.so", "prog"], ["--summary", "--", "prog"]):
            with self.subTest(args):
                done = run([PYTHON, "-m", "gpupool", *args], check=False)
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertEqual(len(done.stderr.splitlines()), 1, done.stderr)
                self.assertTrue(done.stderr.startswith("gpupool: "), done.stderr)

    def test_a_reader_that_left_or_a_closed_stderr_changes_no_exit_status(self) -> None:
        # `python -m gpupool --help | true`: the reader is gone before the text is written. The
        # launcher dies of SIGPIPE, as gpupool-run (a shell script) does, with no traceback.
        for args in (["--help"], ["--dry-run", "--", "prog"]):
            with self.subTest(args):
                read, write = os.pipe()
                os.close(read)
                proc = subprocess.Popen([str(PYTHON), "-m", "gpupool", *args], env=clean_env(),
                                        stdout=write, stderr=subprocess.PIPE)
                os.close(write)
                _, stderr = proc.communicate(timeout=60)
                self.assertEqual(proc.returncode, -signal.SIGPIPE, stderr.decode())
                self.assertEqual(stderr, b"")
        # With stderr closed, the line cannot be written, but the status is still the shell's.
        for args, status in ((["--frobnicate", "prog"], 2), (["--", "no-such-command-here"], 127)):
            with self.subTest(args):
                done = subprocess.run([str(PYTHON), "-m", "gpupool", *args], env=clean_env(),
                                      stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2),
                                      timeout=60)
                self.assertEqual(done.returncode, status, done.stdout)
                self.assertEqual(done.stdout, b"")

    def test_an_executable_script_without_a_shebang_runs_with_sh(self) -> None:
        # As execvp(3), env(1) and a shell's exec run it: `python -m gpupool -- ./run.sh`.
        script = TARGET / "debug" / "python-noshebang" / "run.sh"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text('echo "ran with $1 as $0"\nexit 7\n')
        script.chmod(0o755)
        done = run([PYTHON, "-m", "gpupool", "--", script, "x"], check=False)
        self.assertEqual(done.returncode, 7, done.stderr)
        self.assertEqual(done.stdout, f"ran with x as {script}\n")
        # Found through PATH too.
        env = clean_env(PATH=f"{script.parent}:{os.environ['PATH']}")
        done = run([PYTHON, "-m", "gpupool", "--", "run.sh", "y"], env=env, check=False)
        self.assertEqual((done.returncode, done.stdout), (7, f"ran with y as {script}\n"),
                         done.stderr)

    def test_a_missing_command_exits_127(self) -> None:
        done = run([PYTHON, "-m", "gpupool", "--", "no-such-command-here"], check=False)
        self.assertEqual(done.returncode, 127)
        self.assertIn("command not found", done.stderr)
        # An empty name (`-- "$PYTHON" train.py` with $PYTHON unset): a shell's 127 and one
        # line, not a traceback.
        done = run([PYTHON, "-m", "gpupool", "--", "", "train.py"], check=False)
        self.assertEqual((done.returncode, done.stderr), (127, "gpupool: : command not found\n"))

    def test_a_python_script_given_as_the_command_gets_a_hint(self) -> None:
        # `python -m gpupool -- train.py`, as torchrun and `python -m cProfile` take a script: a
        # shell's status (127 not found, 126 not executable), and the line says how to run it.
        where = TARGET / "debug" / "python-script-command"
        where.mkdir(parents=True, exist_ok=True)
        (where / "train.py").write_text("print('ran')\n")
        (where / "train.py").chmod(0o644)
        for command, status, line in (
                (["train.py"], 127, "train.py: command not found"),
                (["./train.py", "--lr", "0.1"], 126, "./train.py: Permission denied")):
            with self.subTest(command):
                done = subprocess.run([str(PYTHON), "-m", "gpupool", "--", *command],
                                      env=clean_env(), cwd=where, capture_output=True,
                                      text=True, timeout=60)
                self.assertEqual((done.returncode, done.stdout), (status, ""), done.stderr)
                self.assertEqual(done.stderr, f"gpupool: {line} (to run a Python script: "
                                 f"python -m gpupool -- python {' '.join(command)})\n")

    def test_a_file_that_cannot_start_is_not_called_missing(self) -> None:
        # A script whose #! interpreter is gone (a removed virtual environment): execve says
        # ENOENT, but the file is there. The status is a shell's, 127; the line says what is
        # missing. A directory is refused as one, with 126.
        where = TARGET / "debug" / "python-cannot-start"
        where.mkdir(parents=True, exist_ok=True)
        script = where / "train.py"
        script.write_text("#!/nonexistent/venv/bin/python\nprint('ran')\n")
        script.chmod(0o755)
        env = clean_env(PATH=f"{where}:{os.environ['PATH']}")
        for name in (str(script), "train.py"):
            with self.subTest(name):
                done = run([PYTHON, "-m", "gpupool", "--", name], env=env, check=False)
                self.assertEqual(done.returncode, 127, done.stderr)
                self.assertIn("required file not found", done.stderr)
                self.assertNotIn("command not found", done.stderr)
        done = run([PYTHON, "-m", "gpupool", "--", where], check=False)
        self.assertEqual((done.returncode, done.stderr),
                         (126, f"gpupool: {where}: is a directory\n"))

    def test_the_command_gets_the_environment_the_launcher_got(self) -> None:
        # Without a locale (a container, cron), Python sets LC_CTYPE=C.UTF-8 for itself at
        # start-up (PEP 538). The command must not inherit that: it would run in another
        # locale than without the launcher. Only the launcher's own variables are added.
        env = {k: v for k, v in clean_env().items()
               if k not in ("LANG", "LANGUAGE") and not k.startswith("LC_")}
        direct = run(["env"], env=env).stdout.splitlines()
        launched = run([PYTHON, "-m", "gpupool", "--", "env"], env=env).stdout.splitlines()
        added = run([PYTHON, "-m", "gpupool", "--dry-run", "--", "env"], env=env)
        self.assertEqual(sorted(launched), sorted(direct + added.stdout.splitlines()[:-1]))
        self.assertFalse([line for line in launched if line.startswith("LC_")], launched)

    def test_the_library_to_preload_is_checked_and_a_link_is_kept(self) -> None:
        where = TARGET / "debug" / "python-lib-checks"
        spaced = where / "with space" / "libgpupool.so"
        spaced.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PACKAGE_LIBRARY, spaced)
        link = where / "libgpupool.so"
        link.unlink(missing_ok=True)
        link.symlink_to(spaced)
        # A link from a path without spaces is the documented way round a library in a
        # directory with them, through GPUPOOL_LIBRARY as through --lib.
        self.assertIn(f"LD_PRELOAD={link}", dry_run("prog", GPUPOOL_LIBRARY=str(link)))
        self.assertIn(f"LD_PRELOAD={link}", dry_run("--lib", str(link), "prog"))
        # A file the dynamic linker would skip (it says one line, and the command runs
        # without the pool) is refused before the command runs; so is a missing file named
        # by GPUPOOL_LIBRARY, and the line names the variable.
        text = where / "libgpupool.d"
        text.write_text("target/debug/libgpupool.so: src/lib.rs\n")
        # ELF files the dynamic linker skips too: an object file, an executable (a PIE, such
        # as the package's gpupool-trace, and one that is not).
        source = where / "f.c"
        source.write_text("int f(void) { return 1; }\nint main(void) { return f(); }\n")
        objfile, nopie = where / "libgpupool.o", where / "nopie"
        run(["cc", "-c", source, "-o", objfile])
        run(["cc", "-no-pie", source, "-o", nopie])
        for path in (objfile, VENV / "bin" / "gpupool-trace", nopie):
            with self.subTest(path=path):
                done = run([PYTHON, "-m", "gpupool", "--lib", path, "--", "echo", "ran"],
                           check=False)
                self.assertEqual((done.returncode, done.stdout), (2, ""), done.stderr)
                self.assertEqual(done.stderr, f"gpupool: {path}: not a shared library that "
                                 "can be read\n")
        for args, env, expected in (
                (["--lib", str(text)], {}, f"{text}: not a shared library"),
                ([], {"GPUPOOL_LIBRARY": str(text)}, "(named by GPUPOOL_LIBRARY)"),
                ([], {"GPUPOOL_LIBRARY": "/nonexistent.so"}, "(named by GPUPOOL_LIBRARY)")):
            with self.subTest(args=args, env=env):
                done = run([PYTHON, "-m", "gpupool", *args, "--", "echo", "ran"],
                           env=clean_env(**env), check=False)
                self.assertEqual((done.returncode, done.stdout), (2, ""), done.stderr)
                self.assertEqual(len(done.stderr.splitlines()), 1, done.stderr)
                self.assertIn(expected, done.stderr)

    def test_summary_status_and_pid_are_the_programs(self) -> None:
        cmd = [PYTHON, "-m", "gpupool", "--summary", "stderr", "--", LAUNCHED, "5", "exit", "3"]
        proc = subprocess.Popen([str(c) for c in cmd], env=clean_env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stdout, stderr = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 3, stderr)
        self.assertEqual(stdout.splitlines()[0], f"pid {proc.pid}")
        self.assertIn("gpupool summary", stderr)
        self.assertIn("5 mallocs, 5 frees", stderr)

    def test_pytorchs_tensors_are_pooled_under_the_launcher(self) -> None:
        # The PyTorch stand-in of tests/pytorch.rs, built as libc10_cuda.so: its
        # cudaMallocAsync backend is chosen, every tensor reaches the pool, and the summary
        # says the setting was the pool's.
        lib = torch_standin()
        script = ROOT / "tests" / "torch_standin.py"
        done = run([PYTHON, "-m", "gpupool", "--summary", "stderr", "--", PYTHON, script, lib,
                    "3"], env=clean_env())
        kv = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        self.assertEqual(kv["backend"], "2", done.stdout)
        self.assertEqual(kv["pool_allocations"], kv["allocations"], done.stdout)
        self.assertEqual(kv["reserved_at_end"], "0", done.stdout)
        self.assertIn("set by the pool", done.stderr)

    def test_a_setting_the_program_makes_itself_before_pytorch_loads_wins(self) -> None:
        # Scripts set PyTorch's variable at their top, before `import torch`, often under its
        # old name. Under the launcher that must still be what PyTorch reads: the pool's own
        # choice may not shadow it (as a PYTORCH_ALLOC_CONF set by the pool would, since
        # PyTorch reads that name first).
        code = textwrap.dedent("""
            import ctypes, os, sys
            os.environ[sys.argv[2]] = sys.argv[3]
            lib = ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL | os.RTLD_NOW)
            lib.standin_alloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
            lib.standin_free.argtypes = [ctypes.c_void_p]
            p = ctypes.c_void_p()
            assert lib.standin_alloc(ctypes.byref(p), 1 << 20) == 0
            assert lib.standin_free(p) == 0
            print(lib.standin_backend())
        """)
        for name, value, backend in (("PYTORCH_CUDA_ALLOC_CONF", "backend:native", "0"),
                                     ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "0"),
                                     ("PYTORCH_ALLOC_CONF", "backend:native", "0")):
            with self.subTest(name=name, value=value):
                done = run([PYTHON, "-m", "gpupool", "--summary", "stderr", "--", PYTHON, "-c",
                            code, torch_standin(), name, value])
                self.assertEqual(done.stdout.strip(), backend, done.stderr)
                # The summary names the program's setting as such, not as the pool's.
                self.assertIn(f"{name} set in the environment", done.stderr)
                self.assertNotIn("set by the pool", done.stderr)

    def test_a_signal_death_passes_through(self) -> None:
        done = run([PYTHON, "-m", "gpupool", "--", LAUNCHED, "1", "signal", "15"], check=False)
        self.assertEqual(done.returncode, -15, done.stderr)

    def test_the_command_gets_the_signal_dispositions_it_would_without_the_launcher(self) -> None:
        # Python ignores SIGPIPE and SIGXFSZ; ignored signals stay ignored across exec.
        status = ["grep", "^SigIgn:", "/proc/self/status"]
        direct = run(status).stdout
        launched = run([PYTHON, "-m", "gpupool", "--", *status]).stdout
        self.assertEqual(launched, direct)
        # `yes | head -n 1`: yes dies of SIGPIPE, as it does without the launcher.
        proc = subprocess.Popen([str(PYTHON), "-m", "gpupool", "--", "yes"], env=clean_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        self.assertEqual(proc.stdout.readline(), b"y\n")
        proc.stdout.close()
        stderr = proc.stderr.read().decode()
        proc.stderr.close()
        self.assertEqual(proc.wait(timeout=60), -signal.SIGPIPE, stderr)
        self.assertEqual(stderr, "")


# Allocates through the global scope, where the preloaded library's cudaMalloc comes first,
# on the simulator loaded RTLD_GLOBAL as the CUDA runtime.
UNDER_PRELOAD = """
    import ctypes, json, os, sys
    ctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    process = ctypes.CDLL(None)
    process.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    process.cudaFree.argtypes = [ctypes.c_void_p]
    blocks = []
    for size in (1 << 20, 3 << 20, 5 << 20):
        p = ctypes.c_void_p()
        assert process.cudaMalloc(ctypes.byref(p), size) == 0
        blocks.append(p)
    assert process.cudaFree(blocks[0]) == 0
    import gpupool
    out = {"path": gpupool.library_path(), "version": gpupool.version(),
           "enabled": gpupool.enabled(), "live": gpupool.stats(),
           "counters": gpupool.counters(0), "counters_all": gpupool.counters()}
    for p in blocks[1:]:
        assert process.cudaFree(p) == 0
    out["before_empty"] = gpupool.stats()
    out["released"] = gpupool.empty_cache()
    out["after_empty"] = gpupool.stats()
    out["summary"] = gpupool.summary()
    gpupool.set_release_threshold(None)
    gpupool.set_release_threshold(256 << 20, device=0)
    try:
        gpupool.set_release_threshold(0, device=5)
    except gpupool.GpupoolError as error:
        out["error"] = [error.code, str(error)]
    print(json.dumps(out))
"""


class CounterNames(unittest.TestCase):
    def test_the_package_reads_gpupool_stats_as_the_header_declares_it(self) -> None:
        # The ctypes mirror of the struct (its order is its layout) against include/gpupool.h:
        # every field after `size_t struct_size` a uint64_t, by name and in order.
        header = (ROOT / "include" / "gpupool.h").read_text()
        body = header.split("typedef struct gpupool_stats {", 1)[1].split("} gpupool_stats;")[0]
        fields = [line.strip().rstrip(";").split()
                  for line in body.splitlines() if line.strip().endswith(";")]
        self.assertEqual(fields[0], ["size_t", "struct_size"])
        self.assertTrue(all(kind == "uint64_t" for kind, _ in fields[1:]), fields)
        found = run([PYTHON, "-c", "import gpupool._api as a; print(' '.join(a._STATS_FIELDS))"])
        self.assertEqual(found.stdout.split(), [name for _, name in fields[1:]])


class ImportUnderPreload(unittest.TestCase):
    def test_stats_are_what_the_process_did(self) -> None:
        out = python(UNDER_PRELOAD, clean_env(), SIMLIB / "libcudart.so.12", launcher=[])
        self.assertEqual(os.path.realpath(out["path"]), str(PACKAGE_LIBRARY))
        self.assertEqual(out["version"], "0.1.0")
        self.assertTrue(out["enabled"])
        live = out["live"]["devices"][0]
        self.assertEqual((live["allocations"], live["frees"]), (3, 1))
        self.assertEqual(live["requested_bytes"]["current"], 8 * MIB)
        self.assertEqual(live["requested_bytes"]["total_in"], 9 * MIB)
        self.assertEqual(live["live_blocks"]["current"], 2)
        # counters(): gpupool_get_stats, the same figures by the C struct's names.
        counters = out["counters"]
        self.assertEqual(out["counters_all"], counters)
        self.assertEqual((counters["alloc_calls"], counters["free_calls"]), (3, 1))
        for gauge, name in (("requested_bytes", "requested_bytes"),
                            ("allocated_bytes", "allocated_bytes"),
                            ("reserved_bytes", "reserved_bytes"),
                            ("live_blocks", "active_allocations")):
            self.assertEqual(counters[name], live[gauge]["current"], gauge)
            self.assertEqual(counters[f"{name}_peak"], live[gauge]["peak"], gauge)
            self.assertEqual(counters[f"{name}_peak_since_reset"],
                             live[gauge]["peak_since_reset"], gauge)
        before = out["before_empty"]["devices"][0]
        self.assertEqual(before["requested_bytes"]["current"], 0)
        self.assertGreater(before["reserved_bytes"]["current"], 0)
        self.assertEqual(out["released"], before["reserved_bytes"]["current"])
        after = out["after_empty"]["devices"][0]
        self.assertEqual(after["reserved_bytes"]["current"], 0)
        self.assertEqual(after["released"]["empty_cache_bytes"], out["released"])
        self.assertIn("gpupool summary", out["summary"])
        self.assertIn("3 mallocs, 3 frees", out["summary"])
        self.assertEqual(out["error"][0], 101, out["error"])


# A Python program under the launcher that calls gpupool (argv[2]) before it loads its CUDA
# runtime: with the framework that links it (argv[1], the PyTorch stand-in), as `import torch`
# does. Then the framework allocates.
BEFORE_THE_RUNTIME = """
    import ctypes, json, os, sys
    import gpupool
    out = {}
    if sys.argv[2] == "enabled":
        out["enabled_before"] = gpupool.enabled()
    else:
        out["stats_before"] = gpupool.stats()
        out["summary_before"] = gpupool.summary()
        out["released_before"] = gpupool.empty_cache()
        gpupool.reset_peak_stats()
        gpupool.set_release_threshold(256 << 20)
    out["runtime_mapped_before"] = "libcudasim" in open("/proc/self/maps").read()
    lib = ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL | os.RTLD_NOW)
    lib.standin_alloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.standin_free.argtypes = [ctypes.c_void_p]
    p = ctypes.c_void_p()
    out["alloc"] = lib.standin_alloc(ctypes.byref(p), 3 << 20)
    out["free"] = lib.standin_free(p)
    out["enabled"] = gpupool.enabled()
    out["stats"] = gpupool.stats()
    out["summary"] = gpupool.summary()
    print(json.dumps(out))
"""


class BeforeTheRuntime(unittest.TestCase):
    """`import gpupool` at the top of a script, its calls before `import torch`."""

    def run_script(self, mode: str, **env: str) -> Dict:
        code = textwrap.dedent(BEFORE_THE_RUNTIME)
        done = run([PYTHON, "-m", "gpupool", "--", PYTHON, "-c", code, torch_standin(), mode],
                   env=clean_env(**env))
        return {"out": json.loads(done.stdout), "stderr": done.stderr}

    def test_an_early_call_that_finds_no_runtime_does_not_break_the_later_ones(self) -> None:
        # gpupool.enabled() looks for the runtime, finds none (one line says so), and answers
        # False; the runtime the framework loads later serves its calls through the pool.
        done = self.run_script("enabled")
        out = done["out"]
        self.assertFalse(out["enabled_before"])
        self.assertEqual(out["alloc"], 0, done["stderr"])
        self.assertEqual(out["free"], 0, done["stderr"])
        self.assertTrue(out["enabled"])
        self.assertEqual(out["stats"]["devices"][0]["allocations"], 1, out["stats"])
        self.assertEqual(done["stderr"].count("cannot find the CUDA runtime"), 1,
                         done["stderr"])

    def test_calls_on_every_device_before_the_runtime_look_for_none(self) -> None:
        # stats(), summary(), empty_cache(), reset_peak_stats(), set_release_threshold() on
        # every device need no runtime: no line on stderr, no error, and no runtime loaded by
        # name (the simulator is on the library search path) that the program did not choose.
        # The threshold set then holds once the framework allocates.
        done = self.run_script("all", LD_LIBRARY_PATH=str(SIMLIB))
        out = done["out"]
        self.assertEqual(done["stderr"], "")
        self.assertEqual(out["stats_before"]["devices"], [])
        self.assertFalse(out["stats_before"]["intercepted"])
        self.assertIn("no CUDA allocations were intercepted", out["summary_before"])
        self.assertEqual(out["released_before"], 0)
        self.assertFalse(out["runtime_mapped_before"])
        self.assertEqual((out["alloc"], out["free"]), (0, 0))
        device = out["stats"]["devices"][0]
        self.assertEqual(device["allocations"], 1)
        self.assertEqual(device["release_threshold_bytes"], 256 * MIB)
        self.assertIn("release threshold 256 MiB", out["summary"])
        # Without a runtime anywhere, the same: nothing printed, nothing raised.
        done = self.run_script("all")
        self.assertEqual(done["stderr"], "")
        self.assertEqual(done["out"]["released_before"], 0)

# Bad arguments to the calls that take a device or a threshold, after a block was cached on
# device 0: each must be refused, and none may reach the library as another device (ctypes
# wraps an int to 32 bits: 2**32 - 1 would be -1, every device; 2**32 would be device 0).
ARGUMENTS = """
    import ctypes, json, os, sys
    ctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    process = ctypes.CDLL(None)
    process.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    process.cudaFree.argtypes = [ctypes.c_void_p]
    p = ctypes.c_void_p()
    assert process.cudaMalloc(ctypes.byref(p), 1 << 20) == 0
    assert process.cudaFree(p) == 0
    import gpupool

    def device0():
        return gpupool.stats()["devices"][0]

    def outcome(call, *args):
        try:
            call(*args)
            return ["ok"]
        except gpupool.GpupoolError as error:
            return ["GpupoolError", error.code]
        except Exception as error:
            return [type(error).__name__, str(error)]

    out = {"before": [device0()["reserved_bytes"]["current"],
                      device0()["release_threshold_bytes"]],
           "devices": {}, "thresholds": {}}
    for device in (2**32 - 1, 2**32, 2**40, -2**31 - 1, None, "cuda:0", 1.0):
        out["devices"][repr(device)] = [
            outcome(gpupool.empty_cache, device), outcome(gpupool.reset_peak_stats, device),
            outcome(gpupool.set_release_threshold, 0, device)]
    for threshold in ("100", 2.7, float("inf"), "4GiB", -1, 1 << 64):
        out["thresholds"][repr(threshold)] = outcome(gpupool.set_release_threshold, threshold)
    out["after"] = [device0()["reserved_bytes"]["current"],
                    device0()["release_threshold_bytes"]]
    print(json.dumps(out))
"""


class Arguments(unittest.TestCase):
    def test_bad_devices_and_thresholds_are_refused_and_touch_no_device(self) -> None:
        out = python(ARGUMENTS, clean_env(), SIMLIB / "libcudart.so.12", launcher=[])
        self.assertGreater(out["before"][0], 0)
        self.assertEqual(out["after"], out["before"], out)
        for device in ("4294967295", "4294967296", "1099511627776", "-2147483649"):
            self.assertEqual(out["devices"][device], [["GpupoolError", 101]] * 3, device)
        for device in ("None", "'cuda:0'", "1.0"):
            for kind, message in out["devices"][device]:
                self.assertEqual(kind, "TypeError", (device, message))
                self.assertIn("device", message)
        for threshold in ("'100'", "2.7", "inf", "'4GiB'"):
            kind, message = out["thresholds"][threshold]
            self.assertEqual(kind, "TypeError", (threshold, message))
            self.assertIn("release threshold", message)
        for threshold in ("-1", str(1 << 64)):
            self.assertEqual(out["thresholds"][threshold][0], "ValueError", threshold)

    def test_an_error_in_a_worker_process_reaches_the_parent(self) -> None:
        # multiprocessing and concurrent.futures send a worker's exception to the parent by
        # pickle: a GpupoolError must arrive whole, not fail to unpickle (a TypeError for the
        # missing `code`), which breaks the whole process pool.
        script = """
            import concurrent.futures, copy, json
            import gpupool
            if __name__ == "__main__":
                with concurrent.futures.ProcessPoolExecutor(1) as pool:
                    try:
                        pool.submit(gpupool.empty_cache, 2**40).result(timeout=60)
                    except Exception as error:
                        print(json.dumps([type(error).__name__, getattr(error, "code", None),
                                          str(error), str(copy.copy(error))]))
        """
        out = python(script, clean_env())
        message = "gpupool_empty_cache failed with CUDA error 101 (invalid device)"
        self.assertEqual(out, ["GpupoolError", 101, message, message])


# Under the preload of a copy of the library that is removed while the program runs (a
# reinstall of the package): `import gpupool` must still use the loaded copy, not load the
# file now at that path, or another, as a second pool that served nothing.
REMOVED = """
    import ctypes, json, os, sys
    ctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    process = ctypes.CDLL(None)
    process.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    p = ctypes.c_void_p()
    assert process.cudaMalloc(ctypes.byref(p), 1 << 20) == 0
    os.unlink(sys.argv[2])
    import gpupool
    copies = {line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
              for line in open("/proc/self/maps") if "libgpupool" in line}
    print(json.dumps({"path": gpupool.library_path(), "copies": sorted(copies),
                      "allocations": [d["allocations"] for d in gpupool.stats()["devices"]]}))
"""


class RemovedWhileLoaded(unittest.TestCase):
    def test_import_uses_the_loaded_copy_after_its_file_is_removed(self) -> None:
        copy = TARGET / "debug" / "python-removed" / "libgpupool.so"
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PACKAGE_LIBRARY, copy)
        out = python(REMOVED, clean_env(), SIMLIB / "libcudart.so.12", copy,
                     launcher=["--lib", str(copy)])
        self.assertEqual(out["allocations"], [1], out)
        self.assertEqual(out["copies"], [str(copy)], out)
        self.assertEqual(out["path"], str(copy))

    def test_import_uses_a_copy_preloaded_from_a_path_that_is_not_utf8(self) -> None:
        # A directory named in another encoding (Latin-1 here): the path read back from the
        # process's mappings must open the same file, or `import gpupool` loads a second copy
        # whose figures are empty.
        copy = TARGET / "debug" / os.fsdecode(b"python-lat\xe9") / "libgpupool.so"
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PACKAGE_LIBRARY, copy)
        out = python(UNDER_PRELOAD, clean_env(), SIMLIB / "libcudart.so.12",
                     launcher=["--lib", str(copy)])
        self.assertEqual(out["path"], str(copy))
        live = out["live"]["devices"]
        self.assertEqual([(d["allocations"], d["frees"]) for d in live], [(3, 1)], out["live"])


# Run with GPUPOOL_CUDART naming the simulator: the library finds its runtime itself.
WITHOUT_PRELOAD = """
    import ctypes, json, os, sys
    if len(sys.argv) > 1:
        ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL | os.RTLD_NOW)
    import gpupool
    path = gpupool.library_path()
    maps = open("/proc/self/maps").read()
    print(json.dumps({"path": path, "enabled": gpupool.enabled(),
                      "own_copy_mapped": str(gpupool.PACKAGE_LIBRARY) in maps,
                      "released": gpupool.empty_cache(),
                      "devices": len(gpupool.stats()["devices"])}))
"""


class ImportWithoutPreload(unittest.TestCase):
    def env(self) -> Dict[str, str]:
        return clean_env(GPUPOOL_CUDART=str(SIMLIB / "libcudart.so.12"))

    def test_loads_its_own_copy_when_none_is_loaded(self) -> None:
        out = python(WITHOUT_PRELOAD, self.env())
        self.assertEqual(out["path"], str(PACKAGE_LIBRARY))
        self.assertTrue(out["enabled"] and out["own_copy_mapped"])
        self.assertEqual(out["released"], 0)

    def test_uses_a_copy_loaded_privately_elsewhere(self) -> None:
        # As PyTorch's pluggable allocator loads it: RTLD_LOCAL, from its own path.
        other = TARGET / "debug" / "libgpupool.so"
        out = python(WITHOUT_PRELOAD, self.env(), other)
        self.assertEqual(out["path"], str(other))
        self.assertFalse(out["own_copy_mapped"])

    def test_pytorch_imported_afterwards_keeps_its_own_allocator(self) -> None:
        # `import gpupool` at a script's top, before `import torch`: the package's own copy
        # serves none of the program's calls, so PyTorch (the stand-in, which reads its
        # variables from the C environment when it loads) must choose as it would without it.
        script = """
            import ctypes, os, sys
            import gpupool
            gpupool.version()
            torch = ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL | os.RTLD_NOW)
            print(torch.standin_backend())
        """
        done = run([PYTHON, "-c", textwrap.dedent(script), torch_standin()], env=self.env())
        self.assertEqual(done.stdout, "0\n", done.stderr)

    def test_the_summary_says_pytorch_allocates_past_a_copy_opened_later(self) -> None:
        # `import torch`, then `import gpupool` without the preload: the package's own copy
        # serves none of PyTorch's calls. gpupool.summary() must say that, not that PyTorch's
        # cache sits above the pool by a variable nobody set, nor advise one that would not
        # bring a tensor to this copy.
        script = """
            import ctypes, os, sys
            torch = ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL | os.RTLD_NOW)
            import gpupool
            print(gpupool.summary())
        """
        done = run([PYTHON, "-c", textwrap.dedent(script), torch_standin()], env=self.env())
        line = next((l for l in done.stdout.splitlines() if l.startswith(" pytorch ")), "")
        self.assertIn("preload", line, done.stdout)
        self.assertNotIn("set in the environment", line)
        self.assertNotIn("PYTORCH_", line)


    def test_a_library_that_cannot_be_loaded_is_named_with_the_fix(self) -> None:
        # The first call loads the library; when it cannot, the error says where the path
        # came from, and what to change.
        script = """
            import gpupool
            try:
                gpupool.stats()
            except OSError as error:
                print(error)
        """
        text = TARGET / "debug" / "python-lib-checks" / "not-a-library.so"
        text.parent.mkdir(parents=True, exist_ok=True)
        text.write_text("not a library\n")
        for path in ("/nonexistent.so", str(text)):
            with self.subTest(path):
                done = run([PYTHON, "-c", textwrap.dedent(script)],
                           env=clean_env(GPUPOOL_LIBRARY=path))
                self.assertIn(path, done.stdout)
                self.assertIn("GPUPOOL_LIBRARY names it", done.stdout)


# Drives gpupool.torch.use() with the stand-in for torch on sys.path.
TORCH = """
    import ctypes, json, sys
    import gpupool.torch
    imported_early = "torch" in sys.modules
    try:
        gpupool.torch.use()
    except RuntimeError as error:
        print(json.dumps({"refused": str(error)}))
        sys.exit(0)
    import torch, gpupool
    calls = [c for c in torch.cuda.memory.calls]
    allocator = torch.cuda.memory.current
    p = allocator.malloc(3 << 20, 0, None)
    out = {
        "imported_early": imported_early,
        "constructed": list(calls[0]),
        "changed": calls[1][0] == "change_current_allocator" and calls[1][1] is allocator,
        "loaded": gpupool.library_path(),
        "copies": sum(1 for line in open("/proc/self/maps")
                      if "libgpupool" in line and " r-xp " in line),
        "allocated": torch.cuda.memory_allocated(),
        "allocated_cuda0": torch.cuda.memory.memory_allocated("cuda:0"),
        "reserved": torch.cuda.memory_reserved(0),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "stats": torch.cuda.memory_stats(),
        "summary": torch.cuda.memory_summary(),
        "same_twice": gpupool.torch.use() is allocator,
    }
    allocator.free(p, 3 << 20, 0, None)
    out["max_before_reset"] = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out["max_after_reset"] = torch.cuda.max_memory_allocated()
    out["allocated_after_free"] = torch.cuda.memory_allocated()
    torch.cuda.empty_cache()
    device = gpupool.stats()["devices"][0]
    out["after_empty"] = [device["reserved_bytes"]["current"],
                          device["released"]["empty_cache_bytes"]]
    print(json.dumps(out))
"""


class Torch(unittest.TestCase):
    def env(self, **extra: str) -> Dict[str, str]:
        return clean_env(GPUPOOL_CUDART=str(SIMLIB / "libcudart.so.12"),
                         PYTHONPATH=str(FAKE_TORCH), **extra)

    def test_use_makes_the_pool_pytorchs_allocator(self) -> None:
        out = python(TORCH, self.env())
        self.assertFalse(out["imported_early"], "import gpupool.torch imported torch")
        self.assertEqual(out["constructed"], ["CUDAPluggableAllocator", out["loaded"],
                                              "gpupool_torch_malloc", "gpupool_torch_free"])
        self.assertEqual(out["loaded"], str(PACKAGE_LIBRARY))
        self.assertEqual(out["copies"], 1)
        self.assertTrue(out["changed"] and out["same_twice"])
        self.assertEqual(out["allocated"], 3 * MIB)
        self.assertEqual(out["allocated_cuda0"], 3 * MIB)
        self.assertEqual(out["max_allocated"], 3 * MIB)
        self.assertGreaterEqual(out["reserved"], 3 * MIB)
        self.assertEqual(out["stats"]["allocated_bytes.all.current"], 3 * MIB)
        self.assertEqual(out["stats"]["allocation.all.current"], 1)
        self.assertEqual(out["stats"]["reserved_bytes.all.current"], out["reserved"])
        self.assertIn("gpupool summary", out["summary"])
        # reset_peak_memory_stats() restarts the peak from what is allocated now.
        self.assertEqual(out["max_before_reset"], 3 * MIB)
        self.assertEqual(out["max_after_reset"], out["allocated_after_free"])
        reserved_after, released = out["after_empty"]
        self.assertEqual((reserved_after, released), (0, out["reserved"]))

    def test_the_memory_calls_read_the_device_they_are_given(self) -> None:
        # 3 MiB on device 0, the current one. Device 1 has nothing; a CPU device and a
        # negative ordinal are refused, as PyTorch refuses them, not read as another device
        # (-1 would be every device to the pool, and reset all their peaks).
        script = """
            import json
            import gpupool.torch, torch
            gpupool.torch.use()
            p = torch.cuda.memory.current.malloc(3 << 20, 0, None)

            def outcome(call, device):
                try:
                    return ["ok", call(device)]
                except Exception as error:
                    return [type(error).__name__, str(error)]

            out = {"cuda_device_1": outcome(torch.cuda.memory_allocated, torch.cuda.device(1)),
                   "cuda:1": outcome(torch.cuda.memory_allocated, "cuda:1"),
                   "cpu": outcome(torch.cuda.memory_allocated, torch.device("cpu")),
                   "-1": outcome(torch.cuda.memory_stats, -1),
                   "reset -1": outcome(torch.cuda.reset_peak_memory_stats, -1)}
            torch.cuda.memory.current.free(p, 3 << 20, 0, None)
            out["peak after"] = torch.cuda.max_memory_allocated(0)
            print(json.dumps(out))
        """
        out = python(script, self.env())
        self.assertEqual(out["cuda_device_1"], ["ok", 0], out)
        self.assertEqual(out["cuda:1"], ["ok", 0], out)
        self.assertEqual(out["cpu"], ["ValueError", "Expected a cuda device, but got: cpu"])
        self.assertEqual(out["-1"][0], "RuntimeError", out)
        self.assertEqual(out["reset -1"][0], "RuntimeError", out)
        self.assertEqual(out["peak after"], 3 * MIB, out)

    def test_the_per_step_memory_calls_write_no_summary(self) -> None:
        # memory_allocated() and its kin are logged at every step: they read gpupool_get_stats,
        # not the JSON summary, whose cost grows with the live blocks.
        script = """
            import json
            import gpupool._api, gpupool.torch, torch
            gpupool.torch.use()
            p = torch.cuda.memory.current.malloc(3 << 20, 0, None)

            def summary_written(*args):
                raise AssertionError("the JSON summary was written")

            gpupool._api.stats = summary_written
            out = [torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(0),
                   torch.cuda.memory_reserved("cuda:0"), torch.cuda.max_memory_reserved()]
            torch.cuda.memory.current.free(p, 3 << 20, 0, None)
            print(json.dumps(out))
        """
        allocated, peak, reserved, peak_reserved = python(script, self.env())
        self.assertEqual((allocated, peak), (3 * MIB, 3 * MIB))
        self.assertGreaterEqual(reserved, 3 * MIB)
        self.assertEqual(peak_reserved, reserved)

    def test_the_summary_says_the_pool_is_pytorchs_allocator(self) -> None:
        # `import torch` loads libc10_cuda (the stand-in here, under that name), then use()
        # opens the library for PyTorch: every tensor is the pool's, and no PyTorch variable
        # is set. The summary's pytorch line must say so, not send the user to a variable.
        script = """
            import ctypes, os, sys
            ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL | os.RTLD_NOW)
            import gpupool.torch, torch
            gpupool.torch.use()
            p = torch.cuda.memory.current.malloc(3 << 20, 0, None)
            torch.cuda.memory.current.free(p, 3 << 20, 0, None)
        """
        done = run([PYTHON, "-c", textwrap.dedent(script), torch_standin()],
                   env=self.env(GPUPOOL_SUMMARY="stderr"))
        line = next((l for l in done.stderr.splitlines() if l.startswith(" pytorch ")), "")
        self.assertIn("pluggable allocator", line, done.stderr)
        self.assertNotIn("sits above the pool", line)
        self.assertNotIn("PYTORCH_", line)

    def test_use_after_cuda_started_says_why_it_refuses(self) -> None:
        out = python(TORCH, self.env(FAKE_TORCH_INITIALIZED="1"))
        self.assertIn("before PyTorch initializes CUDA", out["refused"])
        self.assertIn("Can't swap an already initialized allocator", out["refused"])

    def test_use_says_what_is_missing_without_a_cuda_build_of_torch(self) -> None:
        script = """
            import json
            import gpupool.torch
            try:
                gpupool.torch.use()
            except Exception as error:
                print(json.dumps({"type": type(error).__name__, "message": str(error),
                                  "import_error": isinstance(error, ImportError)}))
        """
        out = python(script, self.env(FAKE_TORCH_CPU="1"))
        self.assertEqual(out["type"], "RuntimeError", out)
        self.assertIn("needs a CUDA build of PyTorch", out["message"])
        self.assertIn("2.11.0+cpu", out["message"])
        # Without torch at all: an ImportError that names it and what needs it.
        out = python(script, clean_env(GPUPOOL_CUDART=str(SIMLIB / "libcudart.so.12")))
        self.assertTrue(out["import_error"], out)
        self.assertIn("gpupool.torch.use() needs PyTorch", out["message"])
        self.assertIn("No module named 'torch'", out["message"])

    def test_under_the_preload_use_passes_the_preloaded_library(self) -> None:
        runtime = "import ctypes, os, sys\nctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL)\n"
        out = python(runtime + textwrap.dedent(TORCH), self.env(), SIMLIB / "libcudart.so.12",
                     launcher=[])
        self.assertEqual(os.path.realpath(out["loaded"]), str(PACKAGE_LIBRARY))
        self.assertEqual(out["copies"], 1)
        self.assertEqual(out["allocated"], 3 * MIB)


if __name__ == "__main__":
    unittest.main()
