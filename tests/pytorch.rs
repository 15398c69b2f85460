//! PyTorch under the headline command, `LD_PRELOAD=libgpupool.so python train.py`, with a
//! stand-in for PyTorch's allocator front door (`tests/c/torch_standin.c`, built as
//! `libc10_cuda.so` and loaded RTLD_LOCAL by `tests/torch_standin.py`). The stand-in reads
//! PyTorch's variables as PyTorch does and calls the runtime as each of its backends does.

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use support::{
    c_library, c_program, number, ok, output_within, pooled, scratch, summary_allocations,
    summary_passed_for, summary_passed_through, texts, unpooled,
};

/// The stand-in, under the name the pool recognises PyTorch by.
fn standin() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = scratch("torch-standin");
        let lib = dir.join("libc10_cuda.so");
        std::fs::copy(c_library("torch_standin"), &lib).expect("copy the stand-in");
        lib
    })
    .clone()
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

fn script() -> PathBuf {
    support::root().join("tests/torch_standin.py")
}

/// Runs the loop; returns its key=value lines as (key, value) and the stderr.
fn train(pool: bool, env: &[(&str, &str)]) -> (Vec<(String, String)>, String) {
    run_script(pool, &script(), "20", env)
}

/// Runs one scenario of `tests/torch_standin_cases.py`; returns its key=value lines and the
/// stderr.
fn case(pool: bool, name: &str, env: &[(&str, &str)]) -> (Vec<(String, String)>, String) {
    let script = support::root().join("tests/torch_standin_cases.py");
    run_script(pool, &script, name, env)
}

/// `script` run with the stand-in and `arg`, under the pool or not: its key=value lines and the
/// stderr.
fn run_script(
    pool: bool,
    script: &std::path::Path,
    arg: &str,
    env: &[(&str, &str)],
) -> (Vec<(String, String)>, String) {
    let lib = standin();
    let args = [script.to_str().unwrap(), lib.to_str().unwrap(), arg];
    let py = PathBuf::from(python());
    let mut cmd = if pool {
        pooled(&py, &args, env)
    } else {
        unpooled(&py, &args, env)
    };
    let (out, err) = ok(&mut cmd);
    let kv = out
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (kv, err)
}

fn get<'a>(kv: &'a [(String, String)], key: &str) -> &'a str {
    kv.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key} in {kv:?}"))
}

fn num(kv: &[(String, String)], key: &str) -> u64 {
    get(kv, key)
        .parse()
        .unwrap_or_else(|_| panic!("{key}={}", get(kv, key)))
}

const ASYNC: &str = "2";
const POOLED: &str = "backend:cudaMallocAsync";

#[test]
fn the_headline_command_pools_every_tensor_and_pytorchs_figures_are_the_pools() {
    let (kv, err) = train(true, &[("GPUPOOL_SUMMARY", "stderr")]);
    // The pool chose PyTorch's cudaMallocAsync backend at load.
    assert_eq!(get(&kv, "backend"), ASYNC, "{err}");
    // Every tensor came to the pool one by one.
    assert_eq!(
        num(&kv, "pool_allocations"),
        num(&kv, "allocations"),
        "{kv:?}"
    );
    // memory_allocated() is the pool's allocated bytes: the tensors' sizes, rounded to 512.
    let in_step: u64 = [4096u64, 300_000, 1 << 20, 3 << 20, 7 << 20, 24 << 20]
        .iter()
        .map(|s| s.div_ceil(512) * 512)
        .sum();
    assert_eq!(num(&kv, "allocated_in_step"), in_step);
    assert_eq!(num(&kv, "allocated_kept"), 4096 + 300_032);
    // memory_reserved() is the pool's reserved memory; empty_cache() gives the cache back to
    // the driver and cudaMemGetInfo shows it.
    assert!(num(&kv, "reserved_before_empty") >= in_step);
    assert!(num(&kv, "reserved_peak_before_reset") >= num(&kv, "reserved_before_empty"));
    assert_eq!(
        num(&kv, "allocated_peak_after_reset"),
        num(&kv, "allocated_kept")
    );
    assert_eq!(
        num(&kv, "reserved_peak_after_reset"),
        num(&kv, "reserved_before_empty")
    );
    let after = num(&kv, "reserved_after_empty");
    assert!(
        after > 0 && after < num(&kv, "reserved_before_empty"),
        "{kv:?}"
    );
    assert_eq!(num(&kv, "reserved_at_end"), 0, "{kv:?}");
    assert_eq!(num(&kv, "free_at_end"), num(&kv, "free_at_start"), "{kv:?}");
    // The summary says so, and whose choice it was.
    assert!(
        err.contains("pytorch")
            && err.contains("tensors pooled")
            && err.contains("set by the pool"),
        "{err}"
    );
}

/// `Tensor.record_stream` under the async backend: PyTorch frees the tensor in a side stream
/// of its own that waits, through events, for the allocation's stream and each recorded one.
/// The next tensor of the default stream must not get memory a side stream's kernel still
/// writes, in any reuse mode.
#[test]
fn a_tensor_recorded_on_a_side_stream_is_not_reused_under_its_kernel() {
    for mode in ["strict", "barrier", "relaxed"] {
        let (kv, err) = case(true, "record_stream", &[("GPUPOOL_REUSE", mode)]);
        assert_eq!(get(&kv, "backend"), ASYNC, "{mode}: {err}");
        assert_eq!(num(&kv, "intact"), 3, "{mode}: {kv:?}\n{err}");
    }
    let (kv, _) = case(
        false,
        "record_stream",
        &[("PYTORCH_CUDA_ALLOC_CONF", POOLED)],
    );
    assert_eq!(num(&kv, "intact"), 3, "without the pool: {kv:?}");
}

/// Tensors on the second device only, as a rank of a job on one node: its figures are the
/// pool's there, the first device (never set up) reads 0, and `empty_cache` empties the
/// devices set up.
#[test]
fn the_figures_and_empty_cache_follow_the_device_pytorch_set_up() {
    let env = [("CUDASIM_DEVICES", "2"), ("GPUPOOL_SUMMARY", "stderr")];
    let (kv, err) = case(true, "two_devices", &env);
    assert_eq!(get(&kv, "backend"), ASYNC, "{err}");
    let kept = (3u64 << 20) + (5 << 20);
    assert_eq!(num(&kv, "dev1_allocated"), kept, "{kv:?}");
    assert!(num(&kv, "dev1_reserved") >= kept + (7 << 20), "{kv:?}");
    assert_eq!(num(&kv, "dev0_reserved"), 0, "{kv:?}");
    let after = num(&kv, "dev1_reserved_after_empty");
    assert!(after >= kept && after < num(&kv, "dev1_reserved"), "{kv:?}");
    assert_eq!(num(&kv, "dev1_reserved_at_end"), 0, "{kv:?}\n{err}");
    assert_eq!(num(&kv, "dev1_allocated_at_end"), 0, "{kv:?}");
}

/// cuDNN's workspace guess under the async backend (`cacheInfo`) probes with `cudaMallocAsync`
/// from `cudaMemGetInfo`'s free bytes down. The probe is served, and kept cached as CUDA's own
/// pool keeps it under PyTorch's threshold.
#[test]
fn cudnns_workspace_probe_is_served_and_kept_as_cudas_pool_keeps_it() {
    let env = [("CUDASIM_MEM", "8GiB"), ("GPUPOOL_SUMMARY", "stderr")];
    let (kv, err) = case(true, "cache_info", &env);
    let guess = num(&kv, "guess");
    assert!(guess > 7 << 30, "{kv:?}\n{err}");
    assert!(num(&kv, "reserved_after") >= guess, "{kv:?}");
    let theirs = [("CUDASIM_MEM", "8GiB"), ("PYTORCH_CUDA_ALLOC_CONF", POOLED)];
    let (kv, _) = case(false, "cache_info", &theirs);
    assert!(num(&kv, "reserved_after") >= num(&kv, "guess"), "{kv:?}");
}

/// A probe of exactly the free memory that does not fit is refused (here: free memory that is
/// no whole number of granules, with expandable segments, and CUDA's own try after the pool's,
/// which the simulator would grant to the byte, refused as a GPU's driver may), and the next,
/// half as large, is served. The refusal is the program's business: the pool
/// prints no out-of-memory report for it, where it printed one before, in a run that never ran
/// out. The summary still counts it.
#[test]
fn a_refused_probe_of_all_the_free_memory_prints_no_out_of_memory_report() {
    let env = [
        ("CUDASIM_MEM", "8GiB"),
        ("CUDASIM_CONTEXT_BYTES", "314576896"),
        ("CUDASIM_FAIL", "cuMemAlloc_v2@1=2,cudaMallocAsync@1=2"),
        ("GPUPOOL_SUMMARY", "stderr"),
    ];
    let (kv, err) = case(true, "cache_info", &env);
    let guess = num(&kv, "guess");
    assert!(
        guess > 3 << 30 && guess < 4 << 30,
        "the second probe: {kv:?}\n{err}"
    );
    assert!(!err.contains("gpupool: out of memory"), "{err}");
    assert!(
        err.contains("1 returned to the program (1 a probe of all the free memory)"),
        "{err}"
    );
    // Any other request that fails is reported as before.
    let env = [("CUDASIM_MEM", "4GiB")];
    let exe = c_program("doomed_request");
    let (_, err) = ok(&mut pooled(&exe, &[], &env));
    assert!(err.contains("gpupool: out of memory"), "{err}");
}

#[test]
fn pytorchs_variables_set_by_the_user_are_kept_and_the_summary_says_what_they_mean() {
    // Their own caching allocator, chosen explicitly: it sits above the pool.
    let (kv, err) = train(
        true,
        &[
            ("GPUPOOL_SUMMARY", "stderr"),
            ("PYTORCH_CUDA_ALLOC_CONF", "backend:native"),
        ],
    );
    assert_eq!(get(&kv, "backend"), "0");
    assert!(
        err.contains("caching allocator sits above the pool")
            && err.contains("PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"),
        "{err}"
    );
    // The pool saw its segments, far fewer than the tensors.
    assert!(num(&kv, "pool_allocations") < num(&kv, "allocations") / 4);

    // Uncached: every tensor pooled, but PyTorch keeps no figures.
    let (kv, err) = train(
        true,
        &[
            ("GPUPOOL_SUMMARY", "stderr"),
            ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1"),
        ],
    );
    assert_eq!(get(&kv, "backend"), "1");
    assert_eq!(num(&kv, "pool_allocations"), num(&kv, "allocations"));
    assert!(err.contains("pooled uncached"), "{err}");

    // PYTORCH_ALLOC_CONF is read first, as PyTorch 2.9 to 2.11 read it (docs/pytorch.md).
    let (kv, _) = train(
        true,
        &[
            ("PYTORCH_ALLOC_CONF", "backend:native"),
            ("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync"),
        ],
    );
    assert_eq!(get(&kv, "backend"), "0");
}

/// The summary's `pytorch` line in `err`.
fn pytorch_line(err: &str) -> &str {
    err.lines()
        .find(|l| l.trim_start().starts_with("pytorch "))
        .unwrap_or_else(|| panic!("no pytorch line in {err}"))
}

/// The variable and value the `pytorch` line ends by telling the user to set.
fn advice(line: &str) -> (&str, &str) {
    let (_, advice) = line
        .rsplit_once(" set ")
        .unwrap_or_else(|| panic!("no variable to set in {line}"));
    let (name, rest) = advice.split_once('=').expect("set NAME=VALUE");
    (name, rest.split([',', ' ']).next().unwrap_or_default())
}

/// Under the preload with a summary: a script that runs `first` (a Python statement), then
/// loads the stand-in (`import torch`) and allocates a tensor. Its backend, and the summary's
/// `pytorch` line.
fn script_first(first: &str) -> (String, String) {
    let code = format!(
        "import ctypes, os; {first}; \
         torch = ctypes.CDLL({:?}, mode=os.RTLD_LOCAL); \
         torch.standin_alloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]; \
         p = ctypes.c_void_p(); assert torch.standin_alloc(ctypes.byref(p), 1 << 20) == 0; \
         print('backend=' + str(torch.standin_backend()))",
        standin().display().to_string()
    );
    let py = PathBuf::from(python());
    let (out, err) = ok(&mut pooled(
        &py,
        &["-c", &code],
        &[("GPUPOOL_SUMMARY", "stderr")],
    ));
    let backend = out
        .trim()
        .strip_prefix("backend=")
        .unwrap_or(&out)
        .to_string();
    (backend, pytorch_line(&err).to_string())
}

#[test]
fn the_summarys_advice_on_pytorchs_setting_takes_effect() {
    // The pytorch line ends with the variable to set for the other backend, and following it
    // must change the backend. PyTorch reads PYTORCH_CUDA_ALLOC_CONF only while
    // PYTORCH_ALLOC_CONF is unset: with that one set, the advice must name it. Uncached with a
    // configuration set, unsetting PYTORCH_NO_CUDA_MEMORY_CACHING alone gives the caching
    // allocator, not the cudaMallocAsync backend.
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: [Case; 3] = [
        (
            &[("PYTORCH_ALLOC_CONF", "expandable_segments:True")],
            "0",
            ASYNC,
        ),
        (
            &[("PYTORCH_ALLOC_CONF", "backend:cudaMallocAsync")],
            ASYNC,
            "0",
        ),
        (
            &[
                ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1"),
                ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
            ],
            "1",
            ASYNC,
        ),
    ];
    for (settings, before, after) in cases {
        let mut env = vec![("GPUPOOL_SUMMARY", "stderr")];
        env.extend_from_slice(settings);
        let (kv, err) = train(true, &env);
        assert_eq!(get(&kv, "backend"), before, "{settings:?}");
        let line = pytorch_line(&err);
        let (name, value) = advice(line);
        let mut followed: Vec<(&str, &str)> =
            env.iter().filter(|(n, _)| *n != name).copied().collect();
        followed.push((name, value));
        let (kv, _) = train(true, &followed);
        assert_eq!(
            get(&kv, "backend"),
            after,
            "{settings:?}, then {name}={value}: {line}"
        );
    }
}

#[test]
fn a_setting_the_program_removes_is_not_reported_as_set() {
    // A script that clears PyTorch's variable before `import torch` gets PyTorch's default
    // caching allocator. The summary must not name a variable as "set in the environment"
    // when none is, nor tell the user to unset one.
    let (backend, line) = script_first("os.environ.pop('PYTORCH_CUDA_ALLOC_CONF')");
    assert_eq!(backend, "0");
    assert!(
        line.contains("caching allocator sits above the pool"),
        "{line}"
    );
    assert!(
        !line.contains("set in the environment") && !line.contains("unset it"),
        "{line}"
    );
    assert_eq!(
        advice(&line),
        ("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")
    );
}

#[test]
fn an_uncached_setting_the_program_makes_after_the_pool_chose_is_named_in_the_summary() {
    // A script written for uncached pooling sets PYTORCH_NO_CUDA_MEMORY_CACHING=1 at its top,
    // after the pool chose PyTorch's cudaMallocAsync backend at load. That backend ignores the
    // variable: the summary must say so, and how to get what the script asked for.
    let (backend, line) = script_first("os.environ['PYTORCH_NO_CUDA_MEMORY_CACHING'] = '1'");
    assert_eq!(backend, ASYNC);
    assert!(
        line.contains("PYTORCH_NO_CUDA_MEMORY_CACHING=1 has no effect"),
        "{line}"
    );
    // Its advice, followed from the start, gives PyTorch's uncached allocator.
    let (name, value) = advice(&line);
    let (kv, _) = train(
        true,
        &[("PYTORCH_NO_CUDA_MEMORY_CACHING", "1"), (name, value)],
    );
    assert_eq!(get(&kv, "backend"), "1", "{name}={value}: {line}");
}

#[test]
fn without_the_pool_or_with_it_off_pytorchs_setting_is_left_alone() {
    let (kv, _) = train(false, &[]);
    assert_eq!(get(&kv, "backend"), "0");
    let (kv, _) = train(true, &[("GPUPOOL_DISABLE", "1")]);
    assert_eq!(get(&kv, "backend"), "0");
}

#[test]
fn cuda_malloc_async_is_pooled_stream_ordered_in_every_mode_and_capture_passes_through() {
    let exe = c_program("async_capture");
    for mode in ["strict", "barrier", "relaxed"] {
        let path = scratch(&format!("async-capture-{mode}")).join("summary.json");
        let env = [
            ("GPUPOOL_REUSE", mode),
            ("GPUPOOL_SUMMARY", path.to_str().unwrap()),
        ];
        let (out, _) = ok(&mut pooled(&exe, &[], &env));
        assert!(out.contains("async_capture ok"), "{mode}: {out}");
        // The summary counts what was captured, the runtime's request and the driver's, once
        // each.
        let captured = (
            number::<u64>(&out, "captured_async="),
            number::<u64>(&out, "captured_bytes="),
        );
        assert_eq!(captured.0, 2, "{out}");
        assert_eq!(summary_passed_through(&path), [(0, 0), captured], "{mode}");
        // One capture question per request on a created stream: its answer names the stream.
        assert_eq!(number::<u64>(&out, "capture_queries="), 1, "{mode}: {out}");
        // A pair there asks about capture at both ends (a capture may begin unseen between
        // them), and the stream's id once: the free takes the one the allocation got. So does
        // the driver's pair, and a pair of one API's allocation and the other's free (the ids
        // are the same); the per-thread default stream's id is asked at both ends.
        for api in ["", "cu_"] {
            let pair = (
                number::<u64>(&out, &format!("{api}pair_capture_queries=")),
                number::<u64>(&out, &format!("{api}pair_id_queries=")),
            );
            assert_eq!(pair, (2, 1), "{mode} {api}: {out}");
        }
        let ids = (
            number::<u64>(&out, "mixed_pair_id_queries="),
            number::<u64>(&out, "cu_ptsz_pair_id_queries="),
        );
        assert_eq!(ids, (1, 2), "{mode}: {out}");
    }
    // The Prometheus form: one sample per reason.
    let path = scratch("async-capture-prom").join("summary.prom");
    let (out, _) = ok(&mut pooled(
        &exe,
        &[],
        &[("GPUPOOL_SUMMARY", path.to_str().unwrap())],
    ));
    let prom = std::fs::read_to_string(&path).unwrap();
    for (name, key) in [
        (
            "gpupool_passed_through_allocations_total",
            "captured_async=",
        ),
        ("gpupool_passed_through_bytes_total", "captured_bytes="),
    ] {
        let sample = |reason: &str| {
            prom.lines()
                .find(|l| l.starts_with(&format!("{name}{{reason=\"{reason}\",")))
                .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no {name} for {reason} in:\n{prom}"))
        };
        assert_eq!(sample("graph_capture"), number::<u64>(&out, key), "{name}");
        assert_eq!(sample("own_memory_pool"), 0, "{name}");
    }
}

#[test]
fn cuda_malloc_async_from_the_programs_own_memory_pool_goes_to_the_runtime() {
    // The program made its own pool current (cudaDeviceSetMemPool): the runtime serves those
    // requests from it, and only the default pool's requests are the pool's. The same with the
    // driver hooks on or off: the runtime's own cuMemAllocAsync behind a request passed through
    // never reaches them (the pool leaves a CUDA runtime's driver lookups unswapped), so the
    // runtime hook alone counts each such request, once.
    let exe = c_program("custom_mempool");
    let env = [
        ("CUDASIM_DEVICES", "2"),
        ("CUDASIM_MEM", "1GiB"),
        ("CUDASIM_CONTEXT_BYTES", "0"),
    ];
    let (without, _) = ok(&mut unpooled(&exe, &[], &env));
    assert!(without.contains("custom_mempool ok"), "{without}");
    let program: u64 = number(&without, "program_async=");
    assert_eq!(number::<u64>(&without, "default_pool_served="), program);
    let own: (u64, u64) = (
        number(&without, "own_pool_async="),
        number(&without, "own_pool_bytes="),
    );
    for hooks in ["1", "0"] {
        let path = scratch(&format!("custom-mempool-{hooks}")).join("summary.json");
        let mut all = env.to_vec();
        all.push(("GPUPOOL_DRIVER_HOOKS", hooks));
        all.push(("GPUPOOL_SUMMARY", path.to_str().unwrap()));
        let (with, err) = ok(&mut pooled(&exe, &[], &all));
        assert!(
            with.contains("custom_mempool ok"),
            "hooks {hooks}: {with}\n{err}"
        );
        // Every request from a default pool was the pool's; the program's pool served the rest.
        assert_eq!(
            number::<u64>(&with, "default_pool_served="),
            0,
            "hooks {hooks}"
        );
        assert_eq!(number::<u64>(&with, "program_async="), program);
        // The summary counts what the pool served, not what the runtime did; and, apart, what
        // the program's own pools served.
        assert_eq!(summary_allocations(&path), program, "hooks {hooks}");
        assert_eq!(
            summary_passed_through(&path),
            [own, (0, 0)],
            "hooks {hooks}"
        );
    }
    // The text summary says it in a line.
    let mut all = env.to_vec();
    all.push(("GPUPOOL_SUMMARY", "stderr"));
    let (_, err) = ok(&mut pooled(&exe, &[], &all));
    let line = format!(
        " passed through to CUDA: {} allocations ({}) served by the program's own memory pool\n",
        own.0,
        gpupool::report::units::bytes(own.1)
    );
    assert!(err.contains(&line), "no {line:?} in:\n{err}");
}

#[test]
fn another_threads_global_capture_does_not_refuse_the_pools_own_segment() {
    // The runtime alone refuses a cudaMalloc during another thread's capture in global mode
    // (900), which invalidates the capture (901 at its end); the pool's segment allocation runs
    // in relaxed mode, as PyTorch's allocator's does, and the thread's own mode (global) is left
    // as it was.
    let exe = c_program("capture_other_thread");
    let (with, _) = ok(&mut pooled(&exe, &[], &[]));
    let (without, _) = ok(&mut unpooled(&exe, &[], &[]));
    assert!(with.contains("other_thread_malloc=0\n"), "{with}");
    assert!(without.contains("other_thread_malloc=900\n"), "{without}");
    assert!(with.contains("mode_after=0\n"), "{with}");
    assert!(with.contains("end=0\n"), "{with}");
    assert!(without.contains("end=901\n"), "{without}");
}

#[test]
fn a_capture_cuda_lets_run_survives_the_pools_fences_and_barriers() {
    // Freed blocks wait for a fence or a barrier; a request during a relaxed capture would
    // take one. CUDA refuses a device synchronization during a capture, and a use of the legacy
    // stream while a blocking stream is captured, and invalidates the capture (901 at its end).
    // The pool takes neither while a capture is underway, so the program sees what it sees
    // without the pool.
    let exe = c_program("capture_fence");
    let small = [("CUDASIM_MEM", "128MiB"), ("CUDASIM_CONTEXT_BYTES", "0")];
    let cases = [
        (["100", "0", "0"], &small[..]),
        (["1", "1", "0"], &[][..]),
        // Into the program's own graph (cudaStreamBeginCaptureToGraph, CUDA 12.3).
        (["100", "0", "1"], &small[..]),
        (["1", "1", "1"], &[][..]),
        // Of the per-thread default stream, through the `_ptsz` forms that `nvcc
        // --default-stream per-thread` compiles the plain names to.
        (["100", "0", "2"], &small[..]),
        (["1", "1", "2"], &[][..]),
        (["1", "1", "3"], &[][..]),
        // In thread-local mode, after another thread's end, which CUDA refuses (908): the
        // capture goes on.
        (["100", "0", "4"], &small[..]),
        (["1", "1", "4"], &[][..]),
    ];
    for (args, env) in cases {
        let (without, _) = ok(&mut unpooled(&exe, &args, env));
        for expected in ["malloc=0\n", "status=1\n", "end=0\n"] {
            assert!(without.contains(expected), "{args:?}: {without}");
        }
        for mode in ["strict", "barrier", "relaxed"] {
            for expandable in ["0", "1"] {
                let mut all = env.to_vec();
                all.extend([("GPUPOOL_REUSE", mode), ("GPUPOOL_EXPANDABLE", expandable)]);
                let (with, _) = ok(&mut pooled(&exe, &args, &all));
                // The 100 MiB request fits once the 64 MiB of waiting blocks go back: a classic
                // segment's `cudaFree` waits for their work, an unmap needs the fence the
                // capture refuses (docs/guarantees.md, "Stream capture").
                let expected = if args[0] == "100" && expandable == "1" {
                    without.replace("malloc=0\n", "malloc=2\n")
                } else {
                    without.clone()
                };
                assert_eq!(with, expected, "{mode} {expandable} {args:?}");
            }
        }
    }
}

#[test]
fn a_capture_begun_while_the_pool_fences_waits_for_the_fence_and_survives() {
    // Another thread's request makes the pool fence (strict) or issue a barrier; the simulator
    // holds that synchronization 400 ms before it looks at the captures, and the program begins
    // a global capture of a blocking stream 100 ms into it. The pool looked before the begin,
    // so its synchronization invalidated the capture (901 at its end). Now a begin waits for the
    // pool's fence or barrier to end.
    let exe = c_program("capture_race");
    let env = [
        ("CUDASIM_MEM", "128MiB"),
        ("CUDASIM_CONTEXT_BYTES", "0"),
        ("CUDASIM_SYNC_DELAY_MS", "400"),
    ];
    let (without, _) = ok(&mut unpooled(&exe, &["100", "100"], &env));
    for expected in ["malloc=0\n", "begin=0\n", "end=0\n"] {
        assert!(without.contains(expected), "{without}");
    }
    for mode in ["strict", "barrier"] {
        let mut all = env.to_vec();
        all.push(("GPUPOOL_REUSE", mode));
        let (with, _) = ok(&mut pooled(&exe, &["100", "100"], &all));
        assert_eq!(with, without, "{mode}");
    }
    // A child forked while the parent fences has no pool: its begin does not wait for a fence
    // of a thread the child does not have.
    let mut all = env.to_vec();
    all.push(("GPUPOOL_REUSE", "strict"));
    let (with, _) = ok(&mut pooled(&exe, &["100", "100", "fork"], &all));
    let (without, _) = ok(&mut unpooled(&exe, &["100", "100", "fork"], &env));
    assert!(without.contains("child_begin="), "{without}");
    assert_eq!(with, without);
    // A fence whose synchronization waits 3 s for a kernel holds a begin back a second at most:
    // CUDA looked for captures when the synchronization started, and a longer wait would hang
    // a program whose fence needs the waiting thread to go on.
    let (with, _) = ok(&mut pooled(&exe, &["100", "100", "long"], &all));
    for expected in [
        "malloc=0\n",
        "begin=0\n",
        "end=0\n",
        "begun_during_fence=1\n",
    ] {
        assert!(with.contains(expected), "{with}");
    }
}

#[test]
fn a_signal_handler_that_begins_a_capture_inside_the_pools_fence_does_not_deadlock() {
    // The pool fences for another thread's request, the simulator holding the synchronization
    // 400 ms; 100 ms into it a signal lands on that thread, and its handler begins a capture.
    // The thread holds the capture gate shared for the fence: a begin that waited for it
    // there would wait for itself (docs/guarantees.md, "Signal handlers"). It passes instead,
    // as before the gate: the fence in progress may then invalidate the capture.
    let exe = c_program("capture_signal");
    let env = [
        ("CUDASIM_MEM", "128MiB"),
        ("CUDASIM_CONTEXT_BYTES", "0"),
        ("CUDASIM_SYNC_DELAY_MS", "400"),
        ("GPUPOOL_REUSE", "strict"),
    ];
    let out = output_within(&mut pooled(&exe, &["100", "100", "fence"], &env), 20);
    let (stdout, stderr) = texts(&out);
    assert!(
        out.status.success() && stdout.contains("handler_begin=0\n"),
        "({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    // A handler on the thread whose begin waits for the fence: its allocation goes to the
    // runtime, as from any pool call, and never waits for the gate its own thread waits for.
    let out = output_within(&mut pooled(&exe, &["100", "100", "begin"], &env), 20);
    let (stdout, stderr) = texts(&out);
    assert!(
        out.status.success() && stdout.contains("handler_malloc=0\n"),
        "({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    for expected in ["malloc=0\n", "begin=0\n", "end=0\n"] {
        assert!(stdout.contains(expected), "{stdout}");
    }
}

#[test]
fn a_child_that_inherits_the_pools_setting_says_it_was_the_pools() {
    // A wrapper between the preload and PyTorch: the shell sets the variable, its child reads
    // it (as torchrun's workers do).
    let (lib, script) = (standin(), script());
    let line = format!("{} {} {} 2", python(), script.display(), lib.display());
    let sh = PathBuf::from("/bin/sh");
    let (out, err) = ok(&mut pooled(
        &sh,
        &["-c", &line],
        &[("GPUPOOL_SUMMARY", "stderr")],
    ));
    assert!(out.contains("backend=2"), "{out}");
    assert!(err.contains("set by the pool"), "{err}");
}

#[test]
fn a_library_opened_later_or_disabled_leaves_pytorchs_setting_alone() {
    // Opened with dlopen (as `import gpupool` or a pluggable allocator opens it), the library
    // serves none of the process's calls: it must not send PyTorch's tensors past itself. PyTorch
    // loaded afterwards keeps its own allocator; the C environment, which PyTorch reads (not
    // Python's copy of it, made at start-up), is untouched.
    let code = format!(
        "import ctypes, os; ctypes.CDLL({:?}, mode=os.RTLD_LOCAL); \
         libc = ctypes.CDLL(None); libc.getenv.restype = ctypes.c_char_p; \
         print('conf=' + str(libc.getenv(b'PYTORCH_CUDA_ALLOC_CONF'))); \
         torch = ctypes.CDLL({:?}, mode=os.RTLD_LOCAL); \
         print('backend=' + str(torch.standin_backend()))",
        support::library().display().to_string(),
        standin().display().to_string()
    );
    let py = PathBuf::from(python());
    let (out, _) = ok(&mut unpooled(&py, &["-c", &code], &[]));
    assert!(out.contains("conf=None"), "{out}");
    assert!(out.contains("backend=0"), "{out}");
    // A disabled child of a pooled shell runs PyTorch as it would without the pool.
    let (lib, script) = (standin(), script());
    let line = format!(
        "GPUPOOL_DISABLE=yes {} {} {} 2",
        python(),
        script.display(),
        lib.display()
    );
    let sh = PathBuf::from("/bin/sh");
    let (out, _) = ok(&mut pooled(&sh, &["-c", &line], &[]));
    assert!(out.contains("backend=0"), "{out}");
}

#[test]
fn a_library_opened_later_leaves_no_dlerror_behind() {
    // Its constructor asks whether it serves the process (a lookup that fails when it was opened
    // with dlopen): the program's dlerror() after a dlopen that succeeded still reads nothing.
    let exe = sim::Sim::get().build(
        &support::root().join("tests/c/dlopen_dlerror.c"),
        &sim::Build {
            compiler: "cc",
            flags: &["-std=c11"],
            libs: &["-ldl"],
            cudart: false,
        },
    );
    let lib = support::library().display().to_string();
    let (out, _) = ok(&mut unpooled(&exe, &[&lib], &[]));
    assert_eq!(out, "dlerror=(none)\n");
}

#[test]
fn a_trim_of_the_default_pool_counts_what_the_runtime_holds_and_the_summary_says_why() {
    // PyTorch's empty_cache() trims to 0; a program may trim to more. What the runtime holds
    // (an allocation on another device's stream) leaves less for the pool to keep.
    let exe = c_program("default_pool_trim");
    let env = [("CUDASIM_DEVICES", "2")];
    let (without, _) = ok(&mut unpooled(&exe, &[], &env));
    assert!(without.contains("default_pool_trim ok"), "{without}");
    let path = scratch("default-pool-trim").join("summary.json");
    let mut all = env.to_vec();
    all.push(("GPUPOOL_SUMMARY", path.to_str().unwrap()));
    let (with, err) = ok(&mut pooled(&exe, &[], &all));
    assert!(with.contains("default_pool_trim ok"), "{with}\n{err}");
    // The pool's cache was there to trim.
    assert!(
        number::<u64>(&with, "reserved_before=") > number::<u64>(&with, "keep="),
        "{with}"
    );
    // The summary counts the allocation the runtime served, and why.
    let unplaced = (
        number::<u64>(&with, "unplaced="),
        number::<u64>(&with, "unplaced_bytes="),
    );
    assert_eq!(summary_passed_for(&path, "unplaced_stream"), unplaced);
    // The four blocks, and the one on the current device's stream, placed through the driver.
    let placed: u64 = number(&with, "placed=");
    assert_eq!(summary_allocations(&path), 4 + placed, "{with}");
}

#[test]
fn a_release_threshold_set_on_the_default_pool_is_the_pools_unless_the_user_chose_one() {
    // With the pool as without it: a threshold of 0 gives everything back at the
    // synchronization, PyTorch's UINT64_MAX keeps it all.
    let exe = c_program("default_pool_threshold");
    for threshold in ["zero", "max"] {
        let (without, _) = ok(&mut unpooled(&exe, &[threshold], &[]));
        let (with, err) = ok(&mut pooled(&exe, &[threshold], &[]));
        assert!(with.contains("default_pool_threshold ok"), "{with}\n{err}");
        let held = number::<u64>(&with, "held=");
        assert_eq!(held, number::<u64>(&without, "held="), "{threshold}");
        assert_eq!(held == 0, threshold == "zero", "{threshold}: {with}");
        // What the program set reads back, as without the pool.
        let set = if threshold == "zero" { 0 } else { u64::MAX };
        assert_eq!(number::<u64>(&without, "read_back="), set, "{without}");
        assert_eq!(number::<u64>(&with, "read_back="), set, "{with}");
    }
    // GPUPOOL_RELEASE_THRESHOLD is the user's choice: the program's threshold leaves it alone,
    // and a read says what the pool keeps.
    for (chosen, read) in [("none", u64::MAX), ("64MiB", 64 << 20)] {
        let env = [("GPUPOOL_RELEASE_THRESHOLD", chosen)];
        let (kept, _) = ok(&mut pooled(&exe, &["zero"], &env));
        assert!(number::<u64>(&kept, "held=") >= 60 << 20, "{kept}");
        assert_eq!(number::<u64>(&kept, "initial="), read, "{chosen}: {kept}");
        assert_eq!(number::<u64>(&kept, "read_back="), read, "{chosen}: {kept}");
    }
}

/// CUDA's threshold bounds the bytes its pool reserves, those in use included: with 30 MiB live
/// and 64 MiB as threshold it keeps 34 MiB of cache past a synchronization. The pool keeps no
/// more (whole segments: 30 MiB, or none, with classic ones).
#[test]
fn a_release_threshold_the_program_set_bounds_the_reserved_bytes_as_cudas_does() {
    let exe = c_program("default_pool_threshold");
    let (without, _) = ok(&mut unpooled(&exe, &["64MiB"], &[]));
    let cuda = number::<u64>(&without, "held=");
    assert_eq!(cuda, 64 << 20, "{without}");
    for expandable in ["1", "0"] {
        let env = [("GPUPOOL_EXPANDABLE", expandable)];
        let (with, err) = ok(&mut pooled(&exe, &["64MiB"], &env));
        assert!(with.contains("default_pool_threshold ok"), "{with}\n{err}");
        let held = number::<u64>(&with, "held=");
        assert!(held <= cuda, "expandable {expandable}: {held} > {cuda}");
        assert!(held >= 60 << 20, "expandable {expandable}: {with}");
    }
    // GPUPOOL_RELEASE_THRESHOLD keeps its own meaning: cached bytes, beside those in use.
    let env = [("GPUPOOL_RELEASE_THRESHOLD", "64MiB")];
    let (with, _) = ok(&mut pooled(&exe, &["64MiB"], &env));
    assert!(number::<u64>(&with, "held=") >= 90 << 20, "{with}");
}

/// Before the program sets one, CUDA's default pool reads a threshold of 0: the runtime gives
/// its cache back at every synchronization. The pool keeps its cache: a read says so
/// (`UINT64_MAX`) to a program deciding whether to trim.
#[test]
fn the_default_pools_release_threshold_reads_as_what_the_pool_keeps() {
    let exe = c_program("default_pool_threshold");
    let (without, _) = ok(&mut unpooled(&exe, &["max"], &[]));
    assert_eq!(number::<u64>(&without, "initial="), 0, "{without}");
    let (with, err) = ok(&mut pooled(&exe, &["max"], &[]));
    assert!(with.contains("default_pool_threshold ok"), "{with}\n{err}");
    assert_eq!(number::<u64>(&with, "initial="), u64::MAX, "{with}");
}

/// `gpupool_set_release_threshold` is the user's choice too: PyTorch's `UINT64_MAX` on the
/// default pool, set when its backend starts on the device, leaves it alone, whether it was set
/// for every device before the first CUDA call or for the device after.
#[test]
fn a_threshold_the_user_set_at_run_time_survives_the_programs_default_pool_threshold() {
    let exe = c_program("threshold_user_choice");
    for mode in ["all", "device"] {
        let (with, err) = ok(&mut pooled(&exe, &[mode], &[]));
        assert!(with.contains("threshold_user_choice ok"), "{with}\n{err}");
        assert_eq!(number::<i32>(&with, "api_rc="), 0, "{mode}: {with}");
        assert_eq!(number::<u64>(&with, "held="), 0, "{mode}: {with}\n{err}");
    }
}

/// `torch.cuda.reset_peak_memory_stats()` writes 0 to the default pool's high-water marks;
/// `max_memory_allocated()` read right after is `memory_allocated()`, as without the pool. Other
/// threads' caches then hold free blocks, which the device counts as allocated: the peak
/// restarts without them. The same through `gpupool_reset_peak_stats`.
#[test]
fn a_peak_restarted_while_thread_caches_hold_free_blocks_reads_the_current_value() {
    let exe = c_program("peak_reset_threads");
    for how in ["cuda", "api"] {
        for mode in ["strict", "relaxed"] {
            let env = [("GPUPOOL_REUSE", mode), ("GPUPOOL_SUMMARY", "stderr")];
            let (out, err) = ok(&mut pooled(&exe, &[how], &env));
            assert!(out.contains("peak_reset_threads ok"), "{out}\n{err}");
            // The threads' caches did serve: relaxed mode gives each thread one at once.
            let cached = err
                .split_once(" by thread caches")
                .and_then(|(before, _)| before.rsplit(' ').next()?.parse::<u64>().ok());
            if mode == "relaxed" {
                assert!(cached.is_some_and(|n| n > 0), "{how}: {err}");
            }
            assert_eq!(
                number::<u64>(&out, "used_high="),
                number::<u64>(&out, "used="),
                "{how} {mode}: {out}"
            );
            assert_eq!(
                number::<u64>(&out, "reserved_high="),
                number::<u64>(&out, "reserved="),
                "{how} {mode}: {out}"
            );
        }
    }
}

/// A threshold set on the default pool of a device the program never used becomes that
/// device's, and makes no context there (one costs hundreds of MiB on a GPU), with the limit
/// and expandable segments that make the pool ask the device about itself.
#[test]
fn a_threshold_on_an_unused_devices_default_pool_makes_no_context_there() {
    let exe = support::c_program_with_driver("threshold_unused_device");
    let env = [("CUDASIM_DEVICES", "2"), ("GPUPOOL_LIMIT", "90%")];
    let (without, _) = ok(&mut unpooled(&exe, &[], &env));
    assert_eq!(number::<i32>(&without, "device1_active="), 0, "{without}");
    for expandable in ["1", "0"] {
        let env = [env[0], env[1], ("GPUPOOL_EXPANDABLE", expandable)];
        let (with, err) = ok(&mut pooled(&exe, &[], &env));
        assert!(with.contains("threshold_unused_device ok"), "{with}\n{err}");
        assert_eq!(
            number::<i32>(&with, "device1_active="),
            0,
            "{expandable}: {with}\n{err}"
        );
        assert_eq!(
            number::<i64>(&with, "threshold1="),
            5 << 20,
            "{expandable}: {with}"
        );
    }
}

/// PyTorch's backend allocates with `cudaMallocAsync`: the out-of-memory report names that
/// call, and CUDA's own try of it, not the `cudaMalloc` the pool's segments come from.
#[test]
fn a_cuda_malloc_async_out_of_memory_is_reported_as_that_call() {
    let exe = c_program("oom_async");
    let env = [("CUDASIM_MEM", "1GiB")];
    let (without, _) = ok(&mut unpooled(&exe, &[], &env));
    let (with, err) = ok(&mut pooled(&exe, &[], &env));
    assert!(with.contains("oom_async ok"), "{with}\n{err}");
    assert_eq!(with, without);
    assert_eq!(number::<i32>(&with, "status="), 2, "{with}");
    assert!(
        err.contains("cudaMallocAsync of 600 MiB (629145600 bytes) failed"),
        "{err}"
    );
    assert!(
        err.contains("and with the runtime's own cudaMallocAsync"),
        "{err}"
    );
    assert!(!err.contains("cudaMalloc of"), "{err}");
    // The driver's stream-ordered call, the same.
    assert_eq!(number::<i32>(&with, "driver_status="), 2, "{with}");
    assert!(
        err.contains("cuMemAllocAsync of 300 MiB (314572800 bytes) failed"),
        "{err}"
    );
    assert!(
        err.contains("and with the driver's own cuMemAllocAsync"),
        "{err}"
    );
}
