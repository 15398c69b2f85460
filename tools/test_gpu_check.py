"""The GPU check: its steps' command lines (as the shell version ran them), how a finished step
is judged, and a whole run on this machine with stand-ins for nvcc, the GPU programs, PyTorch
and compute-sanitizer."""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import gpu_manifest as manifest
import steps
from steps import Absent, Is, Line, Positive

ROOT = Path(__file__).resolve().parent.parent

CLEAN = "env -u LD_PRELOAD -u GPUPOOL_* -u PYTORCH_..."

# What scripts/gpu-check.sh --dry-run printed before it became a Python program (commit
# 2071511), with BUILD=/b, SRC=/s, GPUPOOL_LIB=/l.so and PYTHON=py; the two compute-sanitizer
# steps, which that dry run left out where the tool was missing, written from its source with
# the tool at /cs.
SHELL_DRY_RUN = (Path(__file__).parent / "testdata/shell-dry-run.txt").read_text().splitlines()
# Steps the manifest gained after the shell version (PyTorch under the headline command).
ADDED_SINCE_SHELL = {"torch_headline_pool", "torch_headline_pool_relaxed", "torch_async_native",
                     "torch_launcher_pool", "torch_package_use",
                     # The static runtime and cuBLAS, through the driver hooks (issue 19).
                     "churn_static_nopool", "churn_static_pool_strict",
                     "churn_static_pool_relaxed", "hazard_static_nopool",
                     "hazard_static_pool_strict", "hazard_static_pool_barrier",
                     "hazard_static_hooks_off", "cublas_nopool", "cublas_pool_strict",
                     "sanitizer_memcheck_static_pool", "torch_held_by",
                     # Expandable segments (issue 20).
                     "fragment_nopool", "fragment_pool_classic", "fragment_pool_expandable",
                     "torch_headline_pool_classic", "torch_native_expandable",
                     # The mapped slack's cost (issue 20).
                     "torch_headline_pool_slack", "vmm_cost_nopool",
                     # Pitched images, with CUDA's pitch.
                     "pitched_nopool", "pitched_pool_strict", "pitched_static_pool_strict",
                     # Allocators the pool leaves to CUDA get its cache back.
                     "cache_back_nopool", "cache_back_pool_strict",
                     "cache_back_static_pool_strict",
                     # cuDNN's workspace probes under the headline command.
                     "torch_headline_cudnn"}


def dry_run_lines(counts):
    steps = manifest.manifest("/b", "/s", "/l.so", "py", "/cs", counts)
    return [f"{s.name} ({s.kind}, timeout {s.timeout}s): {s.shown()}" for s in steps]


class Manifest(unittest.TestCase):
    def test_every_step_runs_what_the_shell_version_ran(self):
        got = dry_run_lines(manifest.Counts())
        kept = [line for line in got if line.split(" ")[0] not in ADDED_SINCE_SHELL]
        # The same command lines; the order is the manifest's own (test_the_most_needed_first).
        self.assertEqual(sorted(kept), sorted(SHELL_DRY_RUN))
        self.assertEqual(len(got), len(SHELL_DRY_RUN) + len(ADDED_SINCE_SHELL))

    def test_the_most_needed_first(self):
        """What issues 18-20 wait for runs before the variants and benchmarks an earlier GPU run
        measured, so that a run cut short by its budget loses those, not these."""
        names = [s.name for s in manifest.manifest("/b", "/s", "/l.so", "py", "/cs",
                                                     manifest.Counts())]
        at = {n: i for i, n in enumerate(names)}
        needed = ("torch_headline_pool", "torch_native", "torch_headline_pool_classic",
                  "torch_native_expandable", "churn_static_pool_strict",
                  "hazard_static_pool_strict", "cublas_pool_strict", "fragment_pool_expandable",
                  "vmm_cost_nopool", "sanitizer_memcheck_pool",
                  "sanitizer_memcheck_static_pool")
        later = ("torch_headline_pool_relaxed", "torch_headline_pool_slack",
                 "torch_nocache_pool_barrier", "torch_pluggable_barrier", "torch_nocache",
                 "overlap_nopool", "hit_raw", "torch_hit_native")
        self.assertLess(max(at[n] for n in needed), min(at[n] for n in later))
        # The headline command's reference runs right after it.
        self.assertEqual(at["torch_native"], at["torch_headline_pool"] + 1)
        # pitched's check reads the pitches its run without the pool recorded.
        self.assertLess(at["pitched_nopool"], at["pitched_pool_strict"])
        self.assertLess(at["pitched_nopool"], at["pitched_static_pool_strict"])

    def test_quick_counts(self):
        got = {line.split(" ")[0]: line.split(": ", 1)[1] for line in dry_run_lines(manifest.QUICK)}
        self.assertEqual(got["churn_nopool"], f"{CLEAN} /b/churn 8 300 1")
        self.assertEqual(got["hazard_nopool"], f"{CLEAN} /b/hazard 3")
        self.assertEqual(got["overlap_nopool"], f"{CLEAN} /b/overlap 100 1000 1000 1048576")
        self.assertEqual(got["torch_native"], f"{CLEAN} py /s/torch_train.py --steps 12 --warmup 3")
        self.assertTrue(got["sanitizer_memcheck_pool"].endswith("/b/churn 1 50 1 1048576"))

    def test_the_clean_environment_is_unset_in_full(self):
        step = manifest.manifest("/b", "/s", "/l.so", "py", "/cs", manifest.Counts())[0]
        self.assertEqual(
            " ".join(step.command()),
            "env -u LD_PRELOAD -u GPUPOOL_DISABLE -u GPUPOOL_DRIVER_HOOKS -u GPUPOOL_EXPANDABLE "
            "-u GPUPOOL_RELEASE_THRESHOLD "
            "-u GPUPOOL_REUSE -u GPUPOOL_MAX_SPLIT_SIZE -u GPUPOOL_FENCE_BYTES "
            "-u GPUPOOL_SUMMARY -u GPUPOOL_CUDART -u PYTORCH_NO_CUDA_MEMORY_CACHING "
            "-u PYTORCH_CUDA_ALLOC_CONF -u CUDA_LAUNCH_BLOCKING PYTHONUNBUFFERED=1 "
            "/b/churn 8 1500 1",
        )

    def test_nvcc_command(self):
        link = ["-L/cuda/lib64", "-Xlinker", "-rpath", "-Xlinker", "/cuda/lib64"]
        self.assertEqual(
            " ".join(
                manifest.nvcc_command("/cuda/bin/nvcc", "/s/churn.cu", "/b/churn", link, True)
            ),
            "/cuda/bin/nvcc -O2 -cudart shared -arch=sm_90 -o /b/churn /s/churn.cu -L/cuda/lib64 "
            "-Xlinker -rpath -Xlinker /cuda/lib64 -lpthread -ldl",
        )
        # nvcc's default static runtime for NAME_static, from NAME.cu; cuBLAS linked for its
        # program.
        self.assertEqual(
            " ".join(manifest.nvcc_command("nvcc", "/s/churn.cu", "/b/churn_static", [], False)),
            "nvcc -O2 -cudart static -o /b/churn_static /s/churn.cu -lpthread -ldl",
        )
        self.assertIn("-lcublas", manifest.nvcc_command("nvcc", "/s/cublas_loop.cu",
                                                        "/b/cublas_loop", [], False))
        self.assertNotIn(
            "-arch=sm_90", manifest.nvcc_command("nvcc", "/s/churn.cu", "/b/churn", [], False)
        )


SUMMARY = (
    " gpupool summary   pid 9   rank -   reuse barrier   runtime libcudart.so.13\n"
    " calls      12 mallocs, 12 frees; served from cache 11 (11 hits, 1 misses)\n"
    " in flight  fences taken 0 (0 waiting), program syncs used 2, barriers 5\n"
)


def step_named(name):
    return next(
        s
        for s in manifest.manifest("/b", "/s", "/l.so", "py", "/cs", manifest.Counts())
        if s.name == name
    )


class Judge(unittest.TestCase):
    def test_barrier_mode_must_reuse_behind_its_own_barrier(self):
        step = step_named("hazard_blocking_pool_barrier")
        ok = "$ cmd\nrounds=5 reused_address=5 clobbered=0\nhazard=ok\n" + SUMMARY
        self.assertEqual(steps.judge(step, 0, ok, 60), ("PASS", "rc 0"))
        no_reuse = ok.replace("reused_address=5", "reused_address=0")
        self.assertEqual(
            steps.judge(step, 0, no_reuse, 60), ("FAIL", "rc 0 but no reused_address>0")
        )
        no_barrier = ok.replace("barriers 5", "barriers 0")
        self.assertEqual(
            steps.judge(step, 0, no_barrier, 60),
            ("FAIL", "rc 0 but no a line matching 'barriers [1-9]'"),
        )
        not_intercepted = ok.replace("12 mallocs", "0 mallocs")
        self.assertEqual(steps.judge(step, 0, not_intercepted, 60)[0], "FAIL")

    def test_strict_stream_reuse_must_not_reuse_before_a_fence(self):
        step = step_named("stream_reuse_pool_strict")
        log = "rounds=4 same_stream_reuse={} clobbered=0\nstream_reuse=ok\n" + SUMMARY
        self.assertEqual(steps.judge(step, 0, log.format(0), 60)[0], "PASS")
        self.assertEqual(
            steps.judge(step, 0, log.format(2), 60), ("FAIL", "rc 0 but no same_stream_reuse=0")
        )

    def test_a_failure_names_its_first_line_that_says_why(self):
        step = step_named("hazard_pool_strict")
        log = "$ env ... FAIL\nround=0 clobbered_bytes=9\nhazard=CLOBBERED\nFAIL later\n"
        self.assertEqual(steps.judge(step, 1, log, 60), ("FAIL", "rc 1: hazard=CLOBBERED"))
        self.assertEqual(steps.judge(step, 124, log, 55), ("TIMEOUT", "killed after 55s"))
        self.assertEqual(steps.judge(step, 137, log, 55)[0], "TIMEOUT")

    def test_a_sanitizer_that_cannot_run_here_is_a_skip_even_when_killed(self):
        step = step_named("sanitizer_memcheck_pool")
        log = "========= Error: Device not supported\n"
        self.assertEqual(steps.judge(step, 124, log, 150), ("SKIP", "Device not supported"))
        self.assertEqual(
            steps.judge(step, 0, "========= ERROR SUMMARY: 0 errors\nchurn=ok\n", 150),
            ("PASS", "rc 0"),
        )

    def test_expectations(self):
        recs = [{"a": "1", "b": "0"}]
        self.assertTrue(Is("a", "1").holds(recs, []))
        self.assertFalse(Is("a", "2").holds(recs, []))
        self.assertTrue(Positive("a").holds(recs, []))
        self.assertFalse(Positive("b").holds(recs, []))
        self.assertFalse(Positive("c").holds(recs, []))
        self.assertTrue(Line("calls +[1-9][0-9]* mallocs").holds([], [" calls      12 mallocs"]))
        oom = "gpupool: out of memory on device 0: cudaMallocAsync of 79.1 GiB failed"
        self.assertFalse(Absent("gpupool: out of memory").holds([], ["x", oom]))
        self.assertTrue(Absent("gpupool: out of memory").holds([], ["x"]))


# Stand-ins, written into a copy of the tools: nvcc "builds" a program by writing a script that
# runs FAKE with the program's name; FAKE prints what the real program prints, the pool's
# summary on stderr where the pool is preloaded, and fails where FAKE_FAIL names the step's
# program and mode.
FAKE = r"""
import os, subprocess, sys

name, args = os.path.basename(sys.argv[1]), sys.argv[2:]
mode = os.environ.get("GPUPOOL_REUSE", "strict")
pooled = bool(os.environ.get("LD_PRELOAD")) or "--pluggable" in args or "--package" in args
fail = os.environ.get("FAKE_FAIL", "") == f"{name}:{mode}"

def summary():
    same = ", 3 on the stream that freed them" if mode == "relaxed" else ""
    sys.stderr.write(f" gpupool summary   pid 1   reuse {mode}\n"
                     f" calls      40 mallocs, 40 frees; served from cache 39 (39 hits, 1 misses){same}\n"
                     " in flight  fences taken 0 (0 waiting), program syncs used 1, barriers 4\n")

if name == "python":
    if args[0] == "-c":
        if "find_spec('torch')" in args[1]:
            sys.exit(0)
        os.execv(sys.executable, [sys.executable, *args])
    if args[:2] == ["-m", "gpupool"]:
        # The launcher: the command after "--", preloaded.
        args = args[args.index("--") + 1:]
        pooled = True
        args = args[1:] if os.path.basename(args[0]).startswith("python") else args
    name = os.path.basename(args[0])
if name == "churn":
    print("program_mallocs=6231\nbytes_verified=9\ninit_ms=1.0 churn_ms=812.5\nchurn=ok")
elif name == "hazard":
    clobbered = int(mode == "relaxed" and pooled)
    print(f"rounds=5 reused_address={5 if pooled else 0} clobbered={clobbered}")
    print("hazard=CLOBBERED" if clobbered else "hazard=ok")
    if pooled:
        summary()
    sys.exit(clobbered)
elif name == "stream_reuse":
    reuse = 4 if (mode == "relaxed") != fail and pooled else 0
    print(f"rounds=4 same_stream_reuse={reuse} clobbered=0\nstream_reuse=ok")
elif name == "fragment":
    print(f"blocks={2267 if not pooled else 1587}\ndouble_blocks=0\nfragment=ok")
elif name == "vmm_cost":
    print("granules=512 granule_bytes=2097152\nmap_us=41.20 unmap_us=18.70 move_us=60.10 "
          "remap_us=35.40 run_map_us=22.30")
    print("vmm_cost=ok")
elif name == "pitched":
    print("pitches=52 mismatched=0 unaligned=0 bytes_verified=92278012 bytes_wrong=0\npitched=ok")
elif name == "cache_back":
    print("filled_bytes=84557168640 asked_bytes=63417876480 free_after_bytes=21139292160")
    print("cache_back=ok")
elif name == "cublas_loop":
    print("rounds=20\ngemms=80\nmax_error=0\ncublas_loop=ok")
elif name == "overlap":
    print(f"wall_ms={669.7 if not pooled else 324.6}\nideal_ms=300.0\nserial_ms=600.0")
elif name == "hit_bench":
    print(f"mode={args[0]}")
    for size in (512, 65536):
        print(f"size={size} ns_per_pair={90620 if not pooled else 382} pairs=100")
    print("getdevice_ns=25.0 getdevice_calls=1048576\nhit_bench=done")
elif name == "torch_train.py":
    print("final_loss=7.1234\nloss_finite=1\nmedian_step_ms=25.50\nmax_memory_reserved_mib=5870")
    print("peak_device_used_mib=6637\nbase_device_used_mib=500\nempty_cache_freed_mib=5400")
    if pooled:
        summary()
    print("torch_train=ok")
elif name == "torch_hit.py":
    print("python_overhead_ns=40\nmeta_pair_ns=900\nsize=512 pair_ns=1500 net_ns=1460 event_ns=1600 pairs=9")
    print("torch_hit=done")
elif name == "torch_probe.py":
    print("torch 2.11.0 cuda 13.0")
else:
    sys.exit(f"FAIL unknown program {name}")
if pooled and name not in ("hazard", "torch_train.py"):
    summary()
"""

NVCC = r"""#!/bin/sh
out=; src=
while [ $# -gt 0 ]; do
    case "$1" in -o) out=$2; shift ;; *.cu) src=$1 ;; -arch=*) arch=1 ;; esac
    shift
done
name=$(basename "$src" .cu)
if [ "$name" = overlap ] && [ -n "${arch:-}" ]; then echo "nvcc fatal: error: sm_90 unsupported"; exit 1; fi
printf '#!/bin/sh\nexec %s %s %s "$@"\n' "$PYTHON3" "$FAKE" "$name" > "$out"
chmod +x "$out"
"""

SANITIZER = r"""#!/bin/sh
while [ "${1#--}" != "$1" ]; do shift 2; done
"$@"
rc=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
"""


def libc():
    """A shared object any program can preload silently."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "/libc.so" in path or "/libc-" in path:
                return path
    raise unittest.SkipTest("no libc in /proc/self/maps")


class WholeRun(unittest.TestCase):
    """scripts/gpu-check.sh in a copy of the tree, with stand-ins on PATH."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="gpu-check-test-"))
        root = self.tmp / "tree"
        for folder in ("tools", "scripts", "tests/gpu"):
            (root / folder).mkdir(parents=True)
        for f in (ROOT / "tools").glob("*.py"):
            shutil.copy(f, root / "tools")
        shutil.copy(ROOT / "tools/env_probe.sh", root / "tools")
        shutil.copy(ROOT / "scripts/gpu-check.sh", root / "scripts")
        for f in (ROOT / "tests/gpu").iterdir():
            shutil.copy(f, root / "tests/gpu")
        bin_dir = self.tmp / "bin"
        bin_dir.mkdir()
        fake = self.tmp / "fake.py"
        fake.write_text(FAKE)
        for name, text in (
            ("nvcc", NVCC),
            ("compute-sanitizer", SANITIZER),
            ("python", f'#!/bin/sh\nexec {sys.executable} {fake} python "$@"\n'),
        ):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        # nvcc's toolkit: a libcudart beside its bin/, so the link flags are made.
        lib = self.tmp / "lib64"
        lib.mkdir()
        (lib / "libcudart.so.13").write_text("")
        self.root = root
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GPUPOOL_", "CUDASIM_", "GPU_CHECK_")) and k != "OUT"
        }
        self.env.update(
            PATH=f"{bin_dir}:{self.env['PATH']}",
            PYTHON=str(bin_dir / "python"),
            PYTHON3=sys.executable,
            FAKE=str(fake),
            GPUPOOL_LIB=libc(),
            GPU_CHECK_COMMIT="abc1234",
            OUT=str(self.tmp / "out"),
        )
        self.env.pop("LD_PRELOAD", None)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def run_check(self, **env):
        r = subprocess.run(
            ["bash", str(self.root / "scripts/gpu-check.sh")],
            env=dict(self.env, **env),
            capture_output=True,
            text=True,
            timeout=300,
        )
        rows = (self.root / "gpu-results/steps.tsv").read_text().splitlines()
        status = {f[0]: (f[1], f[2], f[4]) for f in (l.split("\t") for l in rows)}
        report = (self.root / "gpu-results/gpu-results.md").read_text()
        return r, status, report

    def test_a_run_where_every_check_passes(self):
        r, status, report = self.run_check()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(status["build_churn"], ("check", "PASS", "sm_90"))
        self.assertEqual(status["build_overlap"], ("check", "PASS", "default arch (sm_90 failed)"))
        for name in (
            "self_syntax",
            "library",
            "clean_env",
            "env",
            "churn_pool_barrier",
            "hazard_blocking_pool_barrier",
            "stream_reuse_pool_relaxed",
            "stream_reuse_pool_strict",
            "torch_nocache_pool",
            "torch_pluggable_relaxed",
            "sanitizer_memcheck_pool",
            "overlap_pool_barrier_api",
            "hit_async",
            "torch_hit_pluggable_relaxed",
        ):
            self.assertEqual(status[name][1], "PASS", f"{name}: {status[name]}")
        # Relaxed mode clobbers the hazard, as documented: informational, not a failure.
        self.assertEqual(status["hazard_pool_relaxed"], ("info", "FAIL", "rc 1: hazard=CLOBBERED"))
        self.assertNotIn("sanitizer_memcheck_nopool", status)
        self.assertIn("| churn_pool_strict | PASS | 6231 | 812.5 |", report)
        self.assertIn("| hazard_pool_barrier | PASS | 5 | 0 |", report)
        self.assertIn("| stream_reuse_pool_relaxed | PASS | 4 | 4 | 0 |", report)
        self.assertIn("| torch_native | PASS | 25.50 | 5870 | 6637 | 500 | 7.1234 |", report)
        self.assertIn("| overlap_nopool | 669.7 | 300.0 | 600.0 |", report)
        self.assertIn("| 512 | 90620 | 382 | 90620 | 382 |", report)
        self.assertIn("| 512 | 1500 | 1460 | 1500 | 1460 | 1500 | 1460 |", report)
        self.assertIn("- sanitizer_memcheck_pool: PASS\n  ========= ERROR SUMMARY: 0 errors",
                      report)
        self.assertIn("- sanitizer_memcheck_static_pool: PASS\n  ========= ERROR SUMMARY", report)
        # What issues 18-20 wait for has its figures in the report, not only in the logs.
        self.assertIn("| torch_headline_pool | PASS | 25.50 | 5870 | 6637 | 500 | 7.1234 | 5400 |",
                      report)
        self.assertIn("| torch_native_expandable | PASS | 25.50 |", report)
        self.assertIn("| churn_static_pool_strict | PASS | 6231 | 812.5 |", report)
        self.assertIn("| cublas_pool_strict | PASS | 20 | 80 | 0 |", report)
        self.assertIn("| pitched_static_pool_strict | PASS | 52 | 0 | 0 | 0 |", report)
        self.assertIn("| cache_back_static_pool_strict | PASS | 84557168640 | 63417876480 |",
                      report)
        self.assertIn("| fragment_pool_expandable | PASS | 1587 | 0 |", report)
        self.assertIn("| vmm_cost_nopool | PASS | 2097152 | 41.20 | 18.70 | 60.10 | 35.40 "
                      "| 22.30 |", report)
        self.assertIn("vmm_cost us per granule: map_us 41.20 unmap_us 18.70", r.stdout)
        self.assertIn("torch_headline_pool: step 25.50 ms", r.stdout)
        self.assertIn(" calls      40 mallocs", report)
        self.assertIn("torch 2.11.0 cuda 13.0", report)
        self.assertIn(
            "overlap wall ms (ideal/serial 300.0/600.0): nopool 669.7 strict 324.6", r.stdout
        )
        log = (self.root / "gpu-results/logs/churn_pool_strict.log").read_text()
        self.assertTrue(log.startswith("$ env -u LD_PRELOAD "), log)
        self.assertEqual(
            sorted(os.listdir(self.tmp / "out")), ["gpu-results.md", "logs.tgz", "steps.tsv"]
        )

    def test_a_failed_check_fails_the_run(self):
        r, status, _ = self.run_check(FAKE_FAIL="stream_reuse:strict")
        self.assertEqual(r.returncode, 1)
        self.assertEqual(
            status["stream_reuse_pool_strict"], ("check", "FAIL", "rc 0 but no same_stream_reuse=0")
        )
        self.assertIn("correctness checks failed: 1", r.stdout)

    def test_checks_not_run_for_lack_of_time_fail_the_run(self):
        r, status, _ = self.run_check(GPU_CHECK_BUDGET="14")
        self.assertEqual(r.returncode, 1)
        self.assertEqual(status["churn_nopool"], ("check", "NOTRUN", "time budget (14s) spent"))
        self.assertEqual(status["hit_raw"], ("bench", "SKIP", "time budget (14s) spent"))

    def test_without_nvcc_every_check_of_a_program_fails(self):
        if glob.glob("/usr/local/cuda*/bin/nvcc") or glob.glob("/opt/cuda/bin/nvcc"):
            self.skipTest("a CUDA toolkit is installed here")
        bare = self.tmp / "bare"
        bare.mkdir()
        os.symlink(self.tmp / "bin/python", bare / "python")
        path = f"{bare}:/usr/bin:/bin"
        r, status, _ = self.run_check(PATH=path)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(status["build_churn"][1], "FAIL")
        self.assertEqual(status["churn_nopool"], ("check", "FAIL", "not built"))
        self.assertEqual(status["overlap_nopool"], ("bench", "SKIP", "not built"))
        self.assertEqual(
            status["sanitizer_memcheck_pool"], ("check", "SKIP", "compute-sanitizer not found")
        )

    def test_bad_arguments(self):
        def check(arg):
            return subprocess.run(
                ["bash", str(self.root / "scripts/gpu-check.sh"), arg],
                env=self.env,
                capture_output=True,
                text=True,
            )

        r = check("--bogus")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown argument '--bogus'", r.stderr)
        r = check("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("usage: scripts/gpu-check.sh [--dry-run] [--out DIR]", r.stdout)


if __name__ == "__main__":
    unittest.main()
