"""Building the real-GPU check's programs with nvcc, and finding nvcc and compute-sanitizer."""

import glob
import os
import re
import shutil
import subprocess
import threading
import time

import gpu_manifest as manifest


def first_executable(candidates):
    return next((c for c in candidates if os.access(c, os.X_OK)), "")


def find_nvcc():
    """$NVCC, else nvcc on PATH, else the usual toolkit places ("" where none is)."""
    nvcc = os.environ.get("NVCC", "")
    if nvcc and os.access(nvcc, os.X_OK):
        return nvcc
    home = os.environ.get("CUDA_HOME") or "/nonexistent"
    return shutil.which("nvcc") or first_executable(
        [
            f"{home}/bin/nvcc",
            "/usr/local/cuda/bin/nvcc",
            *sorted(glob.glob("/usr/local/cuda-*/bin/nvcc")),
            "/opt/cuda/bin/nvcc",
        ]
    )


def find_sanitizer(nvcc):
    """compute-sanitizer on PATH, else beside nvcc, else the usual toolkit places."""
    bindir = os.path.dirname(nvcc or "/nonexistent/x")
    return shutil.which("compute-sanitizer") or first_executable(
        [
            f"{bindir}/compute-sanitizer",
            f"{bindir}/../compute-sanitizer/compute-sanitizer",
            "/usr/local/cuda/bin/compute-sanitizer",
            *sorted(glob.glob("/usr/local/cuda-*/bin/compute-sanitizer")),
            "/usr/local/cuda/compute-sanitizer/compute-sanitizer",
        ]
    )


def cuda_lib_dir(nvcc):
    """The directory with the toolkit's libcudart, next to nvcc."""
    top = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    for d in [f"{top}/lib64", f"{top}/lib", *sorted(glob.glob(f"{top}/targets/*/lib"))]:
        if glob.glob(f"{d}/libcudart.so*"):
            return d
    return ""


def build_all(check):
    """Builds every program, records a build step for each, and notes what churn imports."""
    if not check.nvcc:
        for p in manifest.PROGRAMS:
            if check.dry:
                check.record(
                    f"build_{p}", "info", "SKIP", 0, "nvcc not found: build skipped (dry run)"
                )
            else:
                check.record(
                    f"build_{p}",
                    "check",
                    "FAIL",
                    0,
                    "nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda*/bin)",
                )
        return
    link = []
    lib_dir = cuda_lib_dir(check.nvcc)
    if lib_dir:
        link += [f"-L{lib_dir}", "-Xlinker", "-rpath", "-Xlinker", lib_dir]
        if not os.path.exists(f"{lib_dir}/libcudart.so"):  # wheel layouts: only .so.13
            linkdir = check.build / "linkdir"
            linkdir.mkdir(exist_ok=True)
            target = linkdir / "libcudart.so"
            target.unlink(missing_ok=True)
            target.symlink_to(sorted(glob.glob(f"{lib_dir}/libcudart.so.*"))[0])
            link.append(f"-L{linkdir}")
    # All programs in parallel; each with -arch=sm_90 first, then without -arch.
    t0 = time.monotonic()
    how = {}

    def build(p):
        log = check.logs / f"build_{p}.log"
        log.write_text("")
        out = check.build / p
        out.unlink(missing_ok=True)
        src = str(check.src / f"{manifest.source_of(p)}.cu")
        cmd = manifest.nvcc_command(check.nvcc, src, str(out), link, arch=True, program=p)
        if check.timed(cmd, log, check.build_limit(), "$ " + " ".join(cmd)) == 0:
            how[p] = "sm_90"
            return
        cmd = manifest.nvcc_command(check.nvcc, src, str(out), link, arch=False, program=p)
        header = "$ " + " ".join(cmd) + "   (retry without -arch)"
        if check.timed(cmd, log, check.build_limit(), header) == 0:
            how[p] = "default arch (sm_90 failed)"

    threads = [threading.Thread(target=build, args=(p,), daemon=True) for p in manifest.PROGRAMS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = int(time.monotonic() - t0)
    for p in manifest.PROGRAMS:
        if p in how and os.access(check.build / p, os.X_OK):
            check.built.add(p)
            check.record(f"build_{p}", "check", "PASS", secs, how[p])
        else:
            text = (check.logs / f"build_{p}.log").read_text(errors="replace")
            why = next((l for l in text.splitlines() if "error" in l), "")
            check.record(f"build_{p}", "check", "FAIL", secs, why[:160])
    if "churn" in check.built:
        build_info(check)


def build_info(check):
    """Which launch entry points the programs import: a preload sees cudaLaunchKernel, not
    __cudaLaunchKernel."""

    def launches(p):
        r = subprocess.run(["nm", "-D", str(check.build / p)], capture_output=True, text=True)
        return [
            l.split()[1] for l in r.stdout.splitlines() if len(l.split()) > 1 and _launch_import(l)
        ]

    lines = [
        "== imported launch entry points (a preload sees cudaLaunchKernel, not "
        "__cudaLaunchKernel)"
    ]
    lines += [
        f"{p}: " + "".join(n + " " for n in launches(p))
        for p in manifest.PROGRAMS
        if p in check.built
    ]
    ldd = subprocess.run(["ldd", str(check.build / "churn")], capture_output=True, text=True)
    lines.append("== ldd churn")
    lines += [
        l for l in (ldd.stdout + ldd.stderr).splitlines() if "cudart" in l or "not found" in l
    ]
    (check.logs / "build_info.log").write_text("\n".join(lines) + "\n")
    names = "".join(n.split("@")[0] + " " for n in launches("churn"))
    check.record("build_info", "info", "INFO", 0, f"churn imports: {names}")


def _launch_import(line):
    """nm's line of an undefined symbol with "launch" in its name."""
    return re.search(r"U .*[Ll]aunch", line) is not None
