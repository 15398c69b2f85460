"""Every step of the real-GPU check (scripts/gpu-check.sh), in the order they run: the programs
it builds and how, then each run with what it needs, its command, its timeout, what its output
must show and what the report reads from it."""

from dataclasses import dataclass

from steps import GPU, SANITIZER, TORCH, Absent, Has, Is, Line, Positive, Step

# The programs built from tests/gpu/NAME.cu with nvcc (each build needs nvcc; each step that runs
# one needs its build). -cudart shared: the runtime calls go through libcudart.so, where the
# runtime hooks interpose them.
PROGRAMS = ("churn", "hazard", "stream_reuse", "overlap", "hit_bench", "cublas_loop",
            "churn_static", "hazard_static", "fragment", "vmm_cost", "pitched",
            "pitched_static", "cache_back", "cache_back_static")
# NAME_static is NAME.cu built as nvcc builds by default, with the runtime inside the program:
# its calls reach the pool only through the driver hooks (dlsym, cuGetProcAddress).
STATIC_SUFFIX = "_static"
# What a program links besides the runtime.
PROGRAM_LIBS = {"cublas_loop": ("-lcublas",)}
NVCC_FLAGS = ("-O2",)
# Hopper first; without -arch when the toolkit cannot build for it.
ARCH = "-arch=sm_90"
LINK_LIBS = ("-lpthread", "-ldl")

# The Python programs whose syntax a dry run checks.
PY_PROGRAMS = ("pluggable", "torch_train", "torch_hit")

# The pool's summary line with a non-zero malloc count: the pool intercepted allocations.
INTERCEPTED = Line(r"calls +[1-9][0-9]* mallocs")
# The pool's summary: blocks served again on the stream that freed them (relaxed mode).
SAME_STREAM = Line("on the stream that freed them")
# The pool's out-of-memory report, which a run that never ran out must not print.
NO_OOM_REPORT = Absent("gpupool: out of memory")
# What compute-sanitizer prints where it cannot run (gVisor's devices): a skip, not a failure.
SANITIZER_UNSUPPORTED = (
    "Device not supported|not supported on this (platform|device)"
    "|Unable to (find|load) injection library"
)
# The sanitizer's target gets the preload through a shell that appends it to what the
# sanitizer put in LD_PRELOAD, so the sanitizer's own process is untouched.
PRELOAD_TARGET = 'LD_PRELOAD="$0${LD_PRELOAD:+:$LD_PRELOAD}"; export LD_PRELOAD; exec "$@"'


@dataclass(frozen=True)
class Counts:
    """Iteration counts: the whole run must fit in about 7 minutes on one GPU."""

    churn_threads: int = 8
    churn_iters: int = 1500
    hazard_rounds: int = 5
    overlap: tuple = ("300", "1000", "1000", "1048576")  # iterations, kernel us, host us, bytes
    torch: tuple = ("--steps", "30", "--warmup", "5")
    sanitizer_churn: tuple = ("1", "200", "1", "1048576")  # threads, iterations, seed, max bytes
    cublas_rounds: int = 20


# GPU_CHECK_QUICK=1: smaller counts.
QUICK = Counts(
    churn_iters=300,
    hazard_rounds=3,
    overlap=("100", "1000", "1000", "1048576"),
    torch=("--steps", "12", "--warmup", "3"),
    sanitizer_churn=("1", "50", "1", "1048576"),
    cublas_rounds=5,
)


def pool(lib, mode):
    """The environment of a run under the preloaded pool in reuse `mode`, summary on stderr."""
    return (("LD_PRELOAD", lib), ("GPUPOOL_REUSE", mode), ("GPUPOOL_SUMMARY", "stderr"))


def source_of(program):
    """The tests/gpu file a program is built from: NAME.cu for NAME and NAME_static."""
    return program.removesuffix(STATIC_SUFFIX)


def nvcc_command(nvcc, src, out, link_flags, arch, program=None):
    """One build attempt of tests/gpu/NAME.cu as `program` (arch: True for -arch=sm_90)."""
    program = program or out.rsplit("/", 1)[-1]
    cudart = "static" if program.endswith(STATIC_SUFFIX) else "shared"
    return [nvcc, *NVCC_FLAGS, "-cudart", cudart, *([ARCH] if arch else []), "-o", out, src,
            *link_flags, *PROGRAM_LIBS.get(program, ()), *LINK_LIBS]


def manifest(build, src, lib, python, sanitizer, counts):
    """The run steps, in order. `build`: where the programs are; `src`: tests/gpu; `lib`: the
    library; `python`: the interpreter with PyTorch; `sanitizer`: compute-sanitizer's path."""
    c = counts
    steps = []

    def group(program, reads, needs=(GPU,)):
        """Adds steps that run `program` (a test program's name, or None for a Python one),
        with the figures `reads` the report takes from their output."""

        def add(name, kind, argv, timeout, expect, env=(), **more):
            steps.append(Step(name, kind, needs, tuple(argv), timeout, tuple(env), tuple(expect),
                              program, reads=reads, **more))

        return add

    def reuse(mode):
        return (("GPUPOOL_REUSE", mode),)

    # churn: the test's own correctness without the pool, then under the pool in each mode.
    churn = group("churn", ("program_mallocs", "churn_ms"))
    argv = [f"{build}/churn", str(c.churn_threads), str(c.churn_iters), "1"]
    ok = Is("churn", "ok")
    churn("churn_nopool", "check", argv, 120, [ok])
    for mode in ("strict", "barrier", "relaxed"):
        churn(f"churn_pool_{mode}", "check", argv, 120, [ok, INTERCEPTED], pool(lib, mode))
    # Repeating sizes: what the thread caches serve (several threads, one device; in strict
    # mode once the threads compete for the device's lock, blocks waiting in the caches for
    # fences).
    for mode in ("relaxed", "strict"):
        churn(f"churn_pool_{mode}_few", "check", argv + ["1073741824", "few"], 120,
              [ok, INTERCEPTED], pool(lib, mode))

    # hazard: must pass without the pool and under strict and barrier; relaxed is informational.
    hazard = group("hazard", ("reused_address", "clobbered"))
    argv = [f"{build}/hazard", str(c.hazard_rounds)]
    ok = Is("hazard", "ok")
    hazard("hazard_nopool", "check", argv, 60, [ok])
    for mode in ("strict", "barrier"):
        hazard(f"hazard_pool_{mode}", "check", argv, 60, [ok, INTERCEPTED], pool(lib, mode))
    hazard("hazard_pool_relaxed", "info", argv, 60, [ok, INTERCEPTED], pool(lib, "relaxed"))
    # The same on two blocking streams: barrier mode's own barrier, not a fence, guards the
    # reuse.
    argv = argv + ["100", "blocking"]
    hazard("hazard_blocking_nopool", "check", argv, 60, [ok])
    hazard("hazard_blocking_pool_strict", "check", argv, 60, [ok, INTERCEPTED],
           pool(lib, "strict"))
    # In barrier mode the point is the pool's own barrier: the block must have come back behind
    # one (on the simulator: every round, 5 barriers, 1 cudaMalloc).
    hazard("hazard_blocking_pool_barrier", "check", argv, 60,
           [ok, INTERCEPTED, Positive("reused_address"), Line("barriers [1-9]")],
           pool(lib, "barrier"))
    hazard("hazard_blocking_pool_relaxed", "info", argv, 60, [ok, INTERCEPTED],
           pool(lib, "relaxed"))

    # stream_reuse: stream-ordered reuse (relaxed: the block freed on a stream serves that
    # stream at once, written in stream order; never another stream, nor a new stream after a
    # destroyed one). Without the pool it runs on cudaMallocAsync, whose pool has the same rule.
    stream = group("stream_reuse", ("rounds", "same_stream_reuse", "clobbered"))
    argv = [f"{build}/stream_reuse"]
    ok = Is("stream_reuse", "ok")
    stream("stream_reuse_nopool", "check", argv, 60, [ok])
    stream("stream_reuse_pool_relaxed", "check", argv, 60,
           [ok, Positive("same_stream_reuse"), INTERCEPTED], pool(lib, "relaxed"))
    # Other modes: no reuse before the barrier or fence, not even on the same stream.
    for mode in ("strict", "barrier"):
        stream(f"stream_reuse_pool_{mode}", "check", argv, 60,
               [ok, Is("same_stream_reuse", "0"), INTERCEPTED], pool(lib, mode))

    # PyTorch: the headline command and PyTorch's own allocator beside it (issue 18's target:
    # step time within 3% of torch_native, peak reserved at most native's), the references
    # issue 20 needs, and the checks of every route into the pool. The other variants (relaxed,
    # the slack, barrier, no caching) run later, after the driver hooks, cuBLAS, the
    # virtual-memory programs and compute-sanitizer: what the budget leaves out is the least
    # needed.
    torch = group(None, ("median_step_ms", "max_memory_reserved_mib", "peak_device_used_mib",
                         "base_device_used_mib", "final_loss", "empty_cache_freed_mib"), (GPU, TORCH))
    torch_argv = argv = [python, f"{src}/torch_train.py", *c.torch]
    pluggable = argv + ["--pluggable", lib]
    nocache = (("PYTORCH_NO_CUDA_MEMORY_CACHING", "1"),)
    torch_ok = ok = [Is("torch_train", "ok")]
    finite = ok + [Is("loss_finite", "1")]
    # The headline command: the preload and no other variable. The pool chooses PyTorch's
    # cudaMallocAsync backend; empty_cache() must visibly give memory back.
    torch("torch_headline_pool", "check", argv, 150,
          finite + [INTERCEPTED, Positive("empty_cache_freed_mib"), NO_OOM_REPORT],
          pool(lib, "strict"))
    torch("torch_native", "bench", argv, 150, ok)
    # Expandable segments are the default (issue 20): the headline command with classic
    # segments, and PyTorch's own expandable segments, for step time and peak reserved beside
    # torch_headline_pool.
    torch("torch_headline_pool_classic", "bench", argv, 150, finite + [INTERCEPTED],
          pool(lib, "strict") + (("GPUPOOL_EXPANDABLE", "0"),))
    torch("torch_native_expandable", "bench", argv, 150, ok,
          (("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),))
    torch("torch_async_native", "bench", argv, 150, ok,
          (("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync"),))
    # The Python package from the tree (no wheel on the GPU machine): its launcher, and
    # gpupool.torch.use() (the pluggable route with PyTorch's memory calls wired to the pool).
    package = (("PYTHONPATH", f"{src}/../../python"), ("GPUPOOL_LIBRARY", lib))
    torch("torch_launcher_pool", "check",
          [python, "-m", "gpupool", "--summary", "stderr", "--", *argv], 150,
          finite + [INTERCEPTED, Positive("empty_cache_freed_mib")], package)
    torch("torch_package_use", "check", argv + ["--package"], 150,
          finite + [INTERCEPTED, Positive("empty_cache_freed_mib")], package)
    torch("torch_nocache_pool", "check", argv, 150, finite + [INTERCEPTED],
          pool(lib, "strict") + nocache)
    torch("torch_pluggable", "check", pluggable, 150, finite + [INTERCEPTED])
    # cuDNN's benchmark mode sizes its workspace by probing with cudaMallocAsync from the free
    # memory down by halves (PyTorch's cacheInfo): the probes that fail are the program's
    # own business, silent without the pool, and must not print the pool's report.
    torch("torch_headline_cudnn", "check", argv + ["--conv", "--steps", "8", "--warmup", "2"],
          150, finite + [INTERCEPTED, NO_OOM_REPORT], pool(lib, "strict"))

    # The static runtime (nvcc's default build): its allocations reach the pool through the
    # driver hooks only. The same checks as the shared builds.
    churn_static = group("churn_static", ("program_mallocs", "churn_ms"))
    argv = [f"{build}/churn_static", str(c.churn_threads), str(c.churn_iters), "1"]
    ok = Is("churn", "ok")
    churn_static("churn_static_nopool", "check", argv, 120, [ok])
    for mode in ("strict", "relaxed"):
        churn_static(f"churn_static_pool_{mode}", "check", argv, 120, [ok, INTERCEPTED],
                     pool(lib, mode))
    hazard_static = group("hazard_static", ("reused_address", "clobbered"))
    argv = [f"{build}/hazard_static", str(c.hazard_rounds)]
    ok = Is("hazard", "ok")
    hazard_static("hazard_static_nopool", "check", argv, 60, [ok])
    for mode in ("strict", "barrier"):
        hazard_static(f"hazard_static_pool_{mode}", "check", argv, 60, [ok, INTERCEPTED],
                      pool(lib, mode))
    # Driver hooks off: the static build's allocations go to the driver (informational: the
    # summary's counts beside the run above).
    hazard_static("hazard_static_hooks_off", "info", argv, 60, [ok],
                  pool(lib, "strict") + (("GPUPOOL_DRIVER_HOOKS", "0"),))

    # cuBLAS's own allocations (its static runtime): the program allocates nothing through the
    # pool itself, so every malloc the summary counts is cuBLAS's.
    blas = group("cublas_loop", ("rounds", "gemms", "max_error"))
    argv = [f"{build}/cublas_loop", str(c.cublas_rounds)]
    ok = Is("cublas_loop", "ok")
    blas("cublas_nopool", "check", argv, 90, [ok])
    blas("cublas_pool_strict", "check", argv, 90, [ok, INTERCEPTED], pool(lib, "strict"))

    # Pitched images (cudaMallocPitch, cuMemAllocPitch_v2): under the pool each pitch is the one
    # CUDA gave the same row without it, recorded first, and every image keeps its bytes. The
    # static build's cudaMallocPitch reaches the pool through the driver hooks alone.
    pitched = group("pitched", ("pitches", "mismatched", "unaligned", "bytes_wrong"))
    expected = f"{build}/pitched.expected"
    ok = Is("pitched", "ok")
    pitched("pitched_nopool", "check", [f"{build}/pitched", "record", expected], 60, [ok])
    pitched("pitched_pool_strict", "check", [f"{build}/pitched", "check", expected], 60,
            [ok, INTERCEPTED], pool(lib, "strict"))
    pitched_static = group("pitched_static", ("pitches", "mismatched", "unaligned",
                                              "bytes_wrong"))
    pitched_static("pitched_static_pool_strict", "check",
                   [f"{build}/pitched_static", "check", expected], 60, [ok, INTERCEPTED],
                   pool(lib, "strict"))

    # Never worse on memory: the device filled into the pool's cache, then 3/4 of it asked of
    # cudaMallocFromPoolAsync, which the pool leaves to CUDA: the cache must go back first. The
    # static build's call is the driver's cuMemAllocFromPoolAsync, through the driver hooks.
    cache_back = group("cache_back", ("filled_bytes", "asked_bytes"))
    ok = Is("cache_back", "ok")
    cache_back("cache_back_nopool", "check", [f"{build}/cache_back"], 120, [ok])
    cache_back("cache_back_pool_strict", "check", [f"{build}/cache_back"], 120,
               [ok, INTERCEPTED], pool(lib, "strict"))
    cache_back_static = group("cache_back_static", ("filled_bytes", "asked_bytes"))
    cache_back_static("cache_back_static_pool_strict", "check", [f"{build}/cache_back_static"],
                      120, [ok, INTERCEPTED], pool(lib, "strict"))

    # What fits: fill with 7 MiB blocks, free every other, fill with 14 MiB (issue 20): without
    # the pool, with classic segments, with expandable segments on virtual memory.
    frag = group("fragment", ("blocks", "double_blocks"))
    argv = [f"{build}/fragment", "7"]
    ok = Is("fragment", "ok")
    frag("fragment_nopool", "bench", argv, 120, [ok])
    frag("fragment_pool_classic", "bench", argv, 120, [ok, INTERCEPTED],
         pool(lib, "strict") + (("GPUPOOL_EXPANDABLE", "0"),))
    frag("fragment_pool_expandable", "info", argv, 120, [ok, INTERCEPTED],
         pool(lib, "strict") + (("GPUPOOL_EXPANDABLE", "1"),))
    # The driver's own cost per granule: mapped, unmapped, moved (the slack's unit of work), moved
    # keeping the physical memory, and mapped as a run with one access call.
    vmm = group("vmm_cost", ("granule_bytes", "map_us", "unmap_us", "move_us", "remap_us",
                              "run_map_us"))
    vmm("vmm_cost_nopool", "bench", [f"{build}/vmm_cost", "512"], 60, [Is("vmm_cost", "ok")])

    # compute-sanitizer memcheck on churn under the pool; without the pool only to diagnose a
    # failure (informational).
    memcheck = group("churn", (), (GPU, SANITIZER))
    tool = [sanitizer or "compute-sanitizer", "--tool", "memcheck"]
    argv = [f"{build}/churn", *c.sanitizer_churn]
    clean = Line("ERROR SUMMARY: 0 errors")
    memcheck("sanitizer_memcheck_pool", "check",
             tool + ["--target-processes", "all", "sh", "-c", PRELOAD_TARGET, lib] + argv, 150,
             [clean, Is("churn", "ok")], (("GPUPOOL_SUMMARY", "stderr"),),
             skip_if=SANITIZER_UNSUPPORTED)
    memcheck("sanitizer_memcheck_nopool", "info", tool + argv, 120, [clean],
             skip_if=SANITIZER_UNSUPPORTED, diagnoses="sanitizer_memcheck_pool")
    # And on the static build, whose allocations come through the driver hooks.
    memcheck = group("churn_static", (), (GPU, SANITIZER))
    argv = [f"{build}/churn_static", *c.sanitizer_churn]
    memcheck("sanitizer_memcheck_static_pool", "check",
             tool + ["--target-processes", "all", "sh", "-c", PRELOAD_TARGET, lib] + argv, 150,
             [clean, Is("churn", "ok")], (("GPUPOOL_SUMMARY", "stderr"),),
             skip_if=SANITIZER_UNSUPPORTED)

    # The other PyTorch variants, informational and benchmarks.
    argv, ok = torch_argv, torch_ok
    torch("torch_headline_pool_relaxed", "bench", argv, 150, finite + [INTERCEPTED],
          pool(lib, "relaxed"))
    # The mapped slack (GPUPOOL_EXPANDABLE_SLACK, off by default): what moving free granules
    # costs a step and saves in peak reserved, beside torch_headline_pool.
    torch("torch_headline_pool_slack", "bench", argv, 150, finite + [INTERCEPTED],
          pool(lib, "strict") + (("GPUPOOL_EXPANDABLE_SLACK", "4%"),))
    # Who holds the tensors, from a live dump with the model still live (issue 19): PyTorch's
    # CUDA library, not "unknown".
    torch("torch_held_by", "info", argv + ["--dump"], 150,
          finite + [INTERCEPTED, Line(r"held by +lib(c10_cuda|torch_cuda)")], pool(lib, "strict"))
    torch("torch_nocache_pool_barrier", "bench", argv, 150, ok + [INTERCEPTED],
          pool(lib, "barrier") + nocache)
    # The pluggable allocator in barrier mode: its frees name PyTorch's stream (blocking), so
    # their blocks wait for a barrier, not a fence (the strict run above pays fences).
    torch("torch_pluggable_barrier", "bench", pluggable, 150, finite + [INTERCEPTED],
          reuse("barrier"))
    # And in relaxed mode, PyTorch's own rule: a block freed on PyTorch's stream serves that
    # stream's next requests at once (stream-ordered reuse), other streams after a barrier.
    torch("torch_pluggable_relaxed", "bench", pluggable, 150,
          finite + [INTERCEPTED, SAME_STREAM], reuse("relaxed"))
    torch("torch_nocache", "bench", argv, 150, ok, nocache)

    # Benchmarks.
    overlap = group("overlap", ("wall_ms", "ideal_ms", "serial_ms"))
    argv = [f"{build}/overlap", *c.overlap]
    ok = Has("wall_ms")
    overlap("overlap_nopool", "bench", argv, 60, [ok])
    for mode in ("strict", "barrier", "relaxed"):
        overlap(f"overlap_pool_{mode}", "bench", argv, 60, [ok, INTERCEPTED], pool(lib, mode))
    overlap("overlap_pool_barrier_api", "bench", argv + ["api"], 60, [ok, INTERCEPTED],
            pool(lib, "barrier"))

    hit = group("hit_bench", ("size", "ns_per_pair", "getdevice_ns"))
    exe = f"{build}/hit_bench"
    done = [Is("hit_bench", "done"), Is("mode", "malloc")]
    hit("hit_raw", "bench", [exe, "malloc"], 90, done)
    hit("hit_pool", "bench", [exe, "malloc"], 90, done + [INTERCEPTED], pool(lib, "strict"))
    hit("hit_async", "bench", [exe, "async"], 90, [Is("hit_bench", "done"), Is("mode", "async")])
    hit("hit_pool_relaxed", "bench", [exe, "malloc"], 90, done + [INTERCEPTED],
        pool(lib, "relaxed"))

    # The same pairs as PyTorch programs meet them: torch.empty + del per size, PyTorch's
    # caching allocator against libgpupool as its pluggable allocator (Python's own overhead
    # measured).
    torch_hit = group(None, ("size", "pair_ns", "net_ns", "python_overhead_ns", "meta_pair_ns"),
                      (GPU, TORCH))
    argv = [python, f"{src}/torch_hit.py"]
    done = [Is("torch_hit", "done")]
    torch_hit("torch_hit_native", "bench", argv, 90, done)
    torch_hit("torch_hit_pluggable", "bench", argv + ["--pluggable", lib], 90,
              done + [INTERCEPTED], reuse("strict"))
    torch_hit("torch_hit_pluggable_relaxed", "bench", argv + ["--pluggable", lib], 90,
              done + [INTERCEPTED, SAME_STREAM], reuse("relaxed"))
    return steps
