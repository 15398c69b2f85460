//! Expandable segments over a device's life, on the simulator: a reset gives
//! their virtual memory back (the driver keeps it otherwise), and a driver that refuses virtual
//! memory leaves the program served from classic segments (`tests/c/expandable_lifecycle.c`);
//! issue 20's targets through the driver API (`tests/c/driver_fill.c`).

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;

use support::{number, ok, pooled, unpooled};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const DEVICE: [(&str, &str); 3] = [
    ("CUDASIM_MEM", "1GiB"),
    ("CUDASIM_CONTEXT_BYTES", "0"),
    ("GPUPOOL_EXPANDABLE", "1"),
];

fn program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| support::c_program("expandable_lifecycle"))
        .clone()
}

fn run(pool: bool, mode: &str, env: &[(&str, &str)]) -> (String, String) {
    let mut all = DEVICE.to_vec();
    all.extend_from_slice(env);
    let exe = program();
    let (out, err) = if pool {
        ok(&mut pooled(&exe, &[mode], &all))
    } else {
        ok(&mut unpooled(&exe, &[mode], &all))
    };
    assert!(out.ends_with("expandable_lifecycle ok\n"), "{out}\n{err}");
    (out, err)
}

#[test]
fn a_reset_gives_the_mapped_memory_back() {
    for mode in ["reset-runtime", "reset-driver"] {
        for reuse in ["strict", "relaxed"] {
            let (out, err) = run(true, mode, &[("GPUPOOL_REUSE", reuse)]);
            let n = |key: &str| number::<u64>(&out, key);
            // The blocks were mapped, live and cached (160 MiB in 2 MiB granules).
            assert!(
                n("mapped_before=") >= 160 * MIB,
                "{mode} {reuse}: {out}\n{err}"
            );
            // A context's destruction leaves virtual memory to whoever mapped it: the pool gave
            // every granule and handle back, so the whole device is free again.
            assert_eq!(n("mapped_after_reset="), 0, "{mode} {reuse}: {out}");
            assert_eq!(n("created_after_reset="), 0, "{mode} {reuse}: {out}");
            assert_eq!(n("live_after_reset="), 0, "{mode} {reuse}: {out}");
            assert_eq!(n("free_after_reset="), GIB, "{mode} {reuse}: {out}");
            assert_eq!(n("unmapped_while_busy="), 0, "{mode} {reuse}: {out}");
        }
        let (without, _) = run(false, mode, &[]);
        assert_eq!(
            number::<u64>(&without, "free_after_reset="),
            GIB,
            "{without}"
        );
    }
}

#[test]
fn a_driver_that_refuses_virtual_memory_leaves_classic_segments() {
    // CUDA_ERROR_NOT_SUPPORTED (801) for the first cuMemCreate: the request is served from a
    // classic segment, with no error left for the program, and no granule is mapped later.
    let (out, err) = run(true, "fallback", &[("CUDASIM_FAIL", "cuMemCreate@1=801")]);
    let n = |key: &str| number::<u64>(&out, key);
    assert_eq!(n("fallback_maps="), 0, "{out}\n{err}");
    assert!(n("fallback_mallocs=") >= 1, "{out}");
    assert_eq!(n("fallback_last_error="), 0, "{out}");
    // Said once, with the setting that chooses classic segments from the start.
    assert_eq!(err.matches("expandable segments off").count(), 1, "{err}");
    assert!(err.contains("GPUPOOL_EXPANDABLE=0"), "{err}");
    // Without the refusal the same program maps granules.
    let (out, _) = run(true, "fallback", &[]);
    assert!(number::<u64>(&out, "fallback_maps=") > 0, "{out}");
}

#[test]
fn a_thread_whose_first_cuda_call_allocates_gets_mapped_memory() {
    // A training loop on a thread other than the one that set CUDA up: the thread has no
    // current context when the pool maps its first block. Expandable segments stay on, with
    // nothing said, whether or not another thread used the device first.
    for mode in ["worker", "worker-first"] {
        let (out, err) = run(true, mode, &[("GPUPOOL_SUMMARY", "stderr")]);
        assert!(
            number::<u64>(&out, "worker_mapped=") >= 5 * MIB,
            "{mode}: {out}\n{err}"
        );
        assert!(!err.contains("refused virtual memory"), "{mode}: {err}");
        assert!(!err.contains("expandable off"), "{mode}: {err}");
    }
}

#[test]
fn mapped_memory_is_gpudirect_rdma_capable_where_the_device_supports_it() {
    // As `cudaMalloc` memory is: CUDA-aware MPI and NCCL's network plugins register it.
    let (out, err) = run(true, "calls", &[]);
    let n = |out: &str, key: &str| number::<u64>(out, key);
    assert!(n(&out, "calls_creates=") > 0, "{out}\n{err}");
    assert_eq!(
        n(&out, "calls_rdma="),
        n(&out, "calls_creates="),
        "every cuMemCreate asked for GPUDirect RDMA: {out}"
    );
    // A device without the support would refuse the flag: it is not asked, and the blocks are
    // still mapped, not served from classic segments.
    let (out, err) = run(true, "calls", &[("CUDASIM_VMM_RDMA", "0")]);
    assert_eq!(n(&out, "calls_rdma="), 0, "{out}\n{err}");
    assert!(n(&out, "calls_maps=") > 0, "{out}\n{err}");
    assert_eq!(n(&out, "calls_mallocs="), 0, "{out}");
    assert!(!err.contains("expandable segments off"), "{err}");
}

#[test]
fn one_access_call_covers_a_blocks_new_granules() {
    // Each granule is its own mapping, so that it can be unmapped alone; the device's access
    // (`cuMemSetAccess`) is given once to each block's run of new ones.
    let (out, err) = run(true, "calls", &[]);
    let n = |key: &str| number::<u64>(&out, key);
    let (blocks, access, maps) = (n("calls_blocks="), n("calls_access="), n("calls_maps="));
    assert!(maps >= 5 * blocks, "{out}\n{err}");
    assert!(
        (1..=blocks).contains(&access),
        "{access} access calls for {blocks} blocks: {out}"
    );
}

#[test]
fn a_mapped_slack_moves_a_holes_memory_to_the_request_no_hole_holds() {
    let run_slack = |slack: &str| {
        let env = [
            ("GPUPOOL_EXPANDABLE_SLACK", slack),
            ("GPUPOOL_SUMMARY", "stderr"),
        ];
        let (out, err) = run(true, "slack", &env);
        assert_eq!(number::<u64>(&out, "unmapped_while_busy="), 0, "{out}");
        (
            number::<u64>(&out, "slack_mapped="),
            number::<u64>(&out, "slack_unmaps="),
            err,
        )
    };
    let (without, unmaps_without, err) = run_slack("none");
    // The 100 MiB hole stays mapped beside the 100 and 150 MiB blocks.
    assert_eq!((without, unmaps_without), (350 * MIB, 0), "{err}");
    assert!(!err.contains("moved within the slack"), "{err}");
    let (with, unmaps, err) = run_slack("4%");
    // The peak allocated was 264 MiB (two 100 MiB blocks and a 64 MiB one); the slack allows
    // 32 MiB more. The rest of the hole moved.
    assert_eq!(with, 296 * MIB, "{err}");
    assert_eq!(unmaps * 2 * MIB, without - with, "{err}");
    let moved = format!("moved within the slack {unmaps} granules (54.0 MiB) in 1 move");
    assert!(err.contains(&moved), "{err}");
}

#[test]
fn the_summarys_driver_line_counts_maps_and_unmaps() {
    // Four 7 MiB blocks and a 100 MiB one allocated and freed, a zero threshold: what the
    // pool asked of the driver is what the simulator counted, granule maps and unmaps
    // included, beside the program's 10 calls.
    for expandable in ["1", "0"] {
        let env = [
            ("GPUPOOL_EXPANDABLE", expandable),
            ("GPUPOOL_RELEASE_THRESHOLD", "0"),
            ("GPUPOOL_SUMMARY", "stderr"),
        ];
        let (out, err) = run(true, "calls", &env);
        let n = |key: &str| number::<u64>(&out, key);
        let (mallocs, frees) = (n("calls_mallocs="), n("calls_frees="));
        let (maps, unmaps) = (n("calls_maps="), n("calls_unmaps="));
        let line = err
            .lines()
            .find(|l| l.starts_with(" driver "))
            .unwrap_or_else(|| panic!("{err}"));
        assert!(
            line.starts_with(&format!(" driver     cudaMalloc {mallocs} (")),
            "{line}\n{out}"
        );
        assert!(
            line.contains(&format!(", cudaFree {frees} (")),
            "{line}\n{out}"
        );
        let total = mallocs + frees + maps + unmaps;
        let tail = format!(": {total} calls for the program's 10");
        assert!(line.ends_with(&tail), "{line}\n{out}");
        if expandable == "1" {
            assert!(maps > 0 && unmaps > 0, "{out}");
            let granules = format!(", {maps} maps, {unmaps} unmaps: ");
            assert!(line.contains(&granules), "{line}\n{out}");
        } else {
            assert_eq!((maps, unmaps), (0, 0), "{out}");
            assert!(!line.contains(" maps"), "{line}");
        }
    }
}

#[test]
fn under_a_split_cap_blocks_of_every_size_come_from_the_range() {
    // A split cap keeps big blocks of classic segments whole; a range's unused address space
    // and its freed blocks serve requests below and above it, as without one.
    let env = [
        ("CUDASIM_MEM", "4GiB"),
        ("GPUPOOL_MAX_SPLIT_SIZE", "128MiB"),
    ];
    let (out, err) = run(true, "sizes", &env);
    let n = |key: &str| number::<u64>(&out, key);
    assert_eq!(n("sizes_mallocs="), 0, "no classic segment: {out}\n{err}");
    let mapped = n("sizes_mapped=");
    assert!(mapped < 2 * GIB + 110 * MIB, "{out}");
    assert_eq!(
        n("sizes_reused="),
        1,
        "the freed 2 GiB block serves 100 MiB: {out}"
    );
    assert_eq!(
        n("sizes_mapped_after_reuse="),
        mapped,
        "nothing more mapped: {out}"
    );
    // With classic segments the cap keeps the 2 GiB block whole: the 100 MiB request gets a
    // segment of its own.
    let (out, err) = run(
        true,
        "sizes",
        &[env[0], env[1], ("GPUPOOL_EXPANDABLE", "0")],
    );
    assert_eq!(number::<u64>(&out, "sizes_reused="), 0, "{out}\n{err}");
}

#[test]
fn a_cache_given_back_with_another_device_current_waits_for_its_own_device() {
    // Blocks of device 1 freed under kernels, its cache given back with device 0 current:
    // `cuMemUnmap` waits for nothing, and a `strict` block is reusable only after a fence, so
    // the pool's fence must be device 1's.
    for mode in ["other-trim", "other-empty"] {
        for reuse in ["strict", "relaxed"] {
            let env = [("CUDASIM_DEVICES", "2"), ("GPUPOOL_REUSE", reuse)];
            let (out, err) = run(true, mode, &env);
            let n = |key: &str| number::<u64>(&out, key);
            assert_eq!(
                n("other_unmapped_while_busy="),
                0,
                "{mode} {reuse}: {out}\n{err}"
            );
            // Only the granule of the small block still live.
            assert_eq!(n("other_mapped_after="), 2 << 20, "{mode} {reuse}: {out}");
            assert_eq!(n("other_current="), 0, "{mode} {reuse}: {out}");
            if reuse == "strict" {
                // `relaxed` reuses a block freed with `cudaFree` at once, by its contract.
                assert_eq!(n("other_reused_busy="), 0, "{mode}: {out}");
            }
        }
    }
}

/// `tests/c/driver_fill.c` on a 16 GiB device with a 512 MiB context, as in the issue.
fn driver_fill(pool: bool, size_kib: u64) -> String {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    let exe = EXE.get_or_init(|| support::c_program("driver_fill"));
    let env = [
        ("CUDASIM_MEM", "16GiB"),
        ("CUDASIM_CONTEXT_BYTES", "512MiB"),
        ("GPUPOOL_EXPANDABLE", "1"),
        ("GPUPOOL_RELEASE_THRESHOLD", "0"),
    ];
    let size = size_kib.to_string();
    let (out, err) = if pool {
        ok(&mut pooled(exe, &[&size], &env))
    } else {
        ok(&mut unpooled(exe, &[&size], &env))
    };
    assert!(out.ends_with("driver_fill ok\n"), "{out}\n{err}");
    out
}

#[test]
fn through_the_driver_a_device_fills_as_without_the_pool_and_free_granules_go_back() {
    // 7 MiB, 12 MiB and 5.1 MiB blocks; the shares of what fits without the pool. A
    // long run of one size starts its blocks on granules (`placement.rs`): a 5.1 MiB hole
    // between live blocks then frees all its 3 granules, where packed it would free only those
    // wholly inside it (0.61 of the holes' bytes for blocks twice the size).
    for (kib, fill_share, half_share) in [
        (7 * 1024, 0.85, 0.80),
        (12 * 1024, 0.85, 0.80),
        (5222, 0.83, 0.80),
    ] {
        let with = driver_fill(true, kib);
        let without = driver_fill(false, kib);
        let n = |text: &str, key: &str| number::<u64>(text, key) as f64;
        let filled = n(&with, "fill_count=") / n(&without, "fill_count=");
        let halves = n(&with, "half_count=") / n(&without, "half_count=");
        println!("{kib} KiB: fill {filled:.3}, twice the size after the half-free {halves:.3}");
        assert!(
            filled >= fill_share,
            "{kib} KiB: {filled}\n{with}\n{without}"
        );
        assert!(
            halves >= half_share,
            "{kib} KiB: {halves}\n{with}\n{without}"
        );
        // Out of memory as the driver says it.
        assert_eq!(n(&with, "fill_error="), 2.0, "{with}");
        // With a zero threshold: at most 64 MiB kept once all is freed, and with two blocks
        // left at both ends of the range, those two and at most 64 MiB more.
        let block = (kib * 1024) as f64;
        assert!(
            n(&with, "held_after_free=") <= (64 * MIB) as f64,
            "{kib} KiB: {with}"
        );
        assert!(
            n(&with, "held_two_ends=") <= 2.0 * block + (64 * MIB) as f64,
            "{kib} KiB: {with}"
        );
        assert_eq!(n(&with, "unmapped_while_busy="), 0.0, "{with}");
    }
}

/// A request the device cannot hold beside what is live (more than the device, or more than it
/// has free) fails as without the pool, and maps nothing first: mapping most of the device and
/// undoing it costs a driver call a granule, and fills the device meanwhile.
#[test]
fn a_request_beyond_the_free_memory_maps_nothing_before_it_fails() {
    let exe = support::c_program("doomed_request");
    let env = [
        ("CUDASIM_MEM", "4GiB"),
        ("CUDASIM_CONTEXT_BYTES", "0"),
        ("GPUPOOL_EXPANDABLE", "1"),
        ("GPUPOOL_SUMMARY", "stderr"),
    ];
    let (out, err) = ok(&mut pooled(&exe, &[], &env));
    assert!(out.ends_with("doomed_request ok\n"), "{out}\n{err}");
    assert_eq!(number::<u64>(&out, "creates "), 0, "{out}\n{err}");
    assert_eq!(number::<u64>(&out, "maps "), 0, "{out}\n{err}");
    assert!(err.contains("2 returned to the program"), "{err}");
}

/// A request that fits an empty device while the runtime cannot say how much memory is free:
/// served, as without the pool. An older answer, from when the device was nearly full, is no
/// reason to refuse it.
#[test]
fn a_request_that_fits_is_served_when_the_free_memory_cannot_be_asked() {
    let exe = support::c_program("memory_info_fails");
    let device = [("CUDASIM_MEM", "4GiB"), ("CUDASIM_CONTEXT_BYTES", "0")];
    let (alone, _) = ok(&mut unpooled(&exe, &[], &device));
    assert!(alone.ends_with("memory_info_fails ok\n"), "{alone}");
    let env = [
        device[0],
        device[1],
        ("GPUPOOL_EXPANDABLE", "1"),
        ("GPUPOOL_RELEASE_THRESHOLD", "0"),
        ("GPUPOOL_SUMMARY", "stderr"),
    ];
    let (out, err) = ok(&mut pooled(&exe, &[], &env));
    assert!(out.ends_with("memory_info_fails ok\n"), "{out}\n{err}");
    // By the pool, not by the runtime after the pool refused it.
    assert!(err.contains(" 3 mallocs, 3 frees"), "{err}");
    assert!(
        err.contains(" 0 recovered, 0 returned to the program"),
        "{err}"
    );
}
