//! Multi-thread scaling of the pool API (no CUDA, no preload): each thread runs the same churn —
//! 64 blocks of mixed sizes (512 B–4 MiB, fixed seed) held, one freed and one allocated per
//! step — on the `Pool` with a backend that hands out addresses. One thread on device 0, two
//! threads on devices 0 and 1, two threads both on device 0 (and that again with the thread
//! caches off). Each thread warms its device up itself, so the one-thread case is a
//! single-threaded program. Prints operations per second (an allocation or a free each) per
//! case, the median of five runs; `scripts/bench.sh` reads them.
//!
//! `[THREAD_STEPS=N] cargo bench --bench threads` (steps per thread, default 1 000 000)

use std::sync::{Arc, Barrier};
use std::time::Instant;

use gpupool::config::{DeviceBytes, ReuseMode, DEFAULT_THREAD_CACHE};
use gpupool::pool::{Addr, FreeKind, Policy, Pool, Settings};
use gpupool_lab::workloads::record::Bump;
use gpupool_lab::workloads::rng::Rng;

fn pool(reuse: ReuseMode, thread_cache: u64) -> Pool<Bump> {
    Pool::new(
        Bump::new(),
        Settings {
            reuse,
            threshold: DeviceBytes::Unbounded,
            limit: DeviceBytes::Unbounded,
            policy: Policy {
                max_split_size: u64::MAX,
                fence_bytes: 256 << 20,
                mapped_slack_permille: None,
            },
            trace: None,
            thread_cache,
            cache_contention: gpupool::pool::tcache::CONTENTION,
            expandable: false,
        },
    )
}

/// `steps` churn steps on `device`; returns the operations done.
fn churn(p: &Pool<Bump>, device: u32, seed: u64, steps: u64) -> u64 {
    let mut rng = Rng::new(seed);
    let mut size = || 512 << rng.range(0, 13);
    let mut held: Vec<Addr> = (0..64)
        .map(|_| p.alloc(device, size()).expect("alloc"))
        .collect();
    let mut rng = Rng::new(seed ^ 1);
    for _ in 0..steps {
        let i = rng.range(0, 63) as usize;
        p.free(held[i], FreeKind::Sync, Some(device));
        held[i] = p.alloc(device, 512 << rng.range(0, 13)).expect("alloc");
    }
    for a in held {
        p.free(a, FreeKind::Sync, Some(device));
    }
    2 * steps
}

/// Operations per second of threads on `devices` (one thread each), all started together.
fn case(reuse: ReuseMode, thread_cache: u64, devices: &[u32], steps: u64) -> f64 {
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let p = Arc::new(pool(reuse, thread_cache));
            let go = Arc::new(Barrier::new(devices.len() + 1));
            let threads: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(i, &d)| {
                    let (p, go) = (Arc::clone(&p), Arc::clone(&go));
                    std::thread::spawn(move || {
                        churn(&p, d, 7 + i as u64, 1000);
                        go.wait();
                        churn(&p, d, 100 + i as u64, steps)
                    })
                })
                .collect();
            go.wait();
            let t = Instant::now();
            let ops: u64 = threads.into_iter().map(|t| t.join().expect("thread")).sum();
            ops as f64 / t.elapsed().as_secs_f64()
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

fn main() {
    let steps = std::env::var("THREAD_STEPS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1_000_000);
    for (name, reuse) in [
        ("strict", ReuseMode::Strict),
        ("barrier", ReuseMode::Barrier),
        ("relaxed", ReuseMode::Relaxed),
    ] {
        let tc = DEFAULT_THREAD_CACHE;
        let one = case(reuse, tc, &[0], steps);
        let two_devices = case(reuse, tc, &[0, 1], steps);
        let one_device = case(reuse, tc, &[0, 0], steps);
        let one_device_no_tc = case(reuse, 0, &[0, 0], steps);
        println!("{name} one_thread {one:.0}");
        println!("{name} two_threads_two_devices {two_devices:.0}");
        println!("{name} two_threads_one_device {one_device:.0}");
        println!("{name} two_threads_one_device_no_thread_cache {one_device_no_tc:.0}");
    }
}
