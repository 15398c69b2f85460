//! One seeded program, `tests/c/differential.c`, uses the runtime and the driver as a correct
//! CUDA program may: allocations and frees through both APIs, in stream order and not, on two
//! devices; kernels that still write a block when it is freed; refused frees; pointer queries.
//! It prints what CUDA answered at every step, and the bytes it reads back. Run without the
//! pool, that output is the reference. Under the pool it must be the same, line for line, in
//! every reuse mode, with expandable and classic segments, and with a zero threshold.
//!
//! `DIFFERENTIAL_SEEDS=4,5,6` runs other seeds (default 1, 2, 3); `DIFFERENTIAL_STEPS` sets
//! the steps per run (default 800).

#[path = "../cudasim/tests/common/mod.rs"]
mod sim;
mod support;

use std::path::Path;

use support::{output_within, pooled, texts, unpooled};

/// Two devices of 4 GiB: the program keeps at most 1.5 GiB live on each, so every request it
/// expects to fit does, with or without the pool.
const DEVICES: [(&str, &str); 2] = [("CUDASIM_DEVICES", "2"), ("CUDASIM_MEM", "4GiB")];

/// A setting of the pool, and the program's discipline under it: `any` for the modes that
/// promise safety to every CUDA program, `ordered` for `relaxed`, which trusts stream order.
struct Setting {
    name: &'static str,
    discipline: &'static str,
    env: &'static [(&'static str, &'static str)],
}

const SETTINGS: &[Setting] = &[
    Setting {
        name: "strict",
        discipline: "any",
        env: &[("GPUPOOL_REUSE", "strict")],
    },
    Setting {
        name: "strict, classic segments",
        discipline: "any",
        env: &[("GPUPOOL_REUSE", "strict"), ("GPUPOOL_EXPANDABLE", "0")],
    },
    Setting {
        name: "strict, threshold 0",
        discipline: "any",
        env: &[
            ("GPUPOOL_REUSE", "strict"),
            ("GPUPOOL_RELEASE_THRESHOLD", "0"),
        ],
    },
    Setting {
        name: "barrier",
        discipline: "any",
        env: &[("GPUPOOL_REUSE", "barrier")],
    },
    Setting {
        name: "barrier, classic segments",
        discipline: "any",
        env: &[("GPUPOOL_REUSE", "barrier"), ("GPUPOOL_EXPANDABLE", "0")],
    },
    Setting {
        name: "relaxed",
        discipline: "ordered",
        env: &[("GPUPOOL_REUSE", "relaxed")],
    },
    Setting {
        name: "relaxed, classic segments, threshold 0",
        discipline: "ordered",
        env: &[
            ("GPUPOOL_REUSE", "relaxed"),
            ("GPUPOOL_EXPANDABLE", "0"),
            ("GPUPOOL_RELEASE_THRESHOLD", "0"),
        ],
    },
];

fn seeds() -> Vec<String> {
    match std::env::var("DIFFERENTIAL_SEEDS") {
        Ok(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        Err(_) => vec!["1".into(), "2".into(), "3".into()],
    }
}

fn steps() -> String {
    std::env::var("DIFFERENTIAL_STEPS").unwrap_or_else(|_| "800".into())
}

/// The program's output, or a description of how it failed.
fn run(exe: &Path, seed: &str, discipline: &str, pool: Option<&Setting>) -> Result<String, String> {
    let steps = steps();
    let args = [seed, steps.as_str(), discipline];
    let mut cmd = match pool {
        Some(s) => {
            let env: Vec<_> = DEVICES.iter().chain(s.env).copied().collect();
            pooled(exe, &args, &env)
        }
        None => unpooled(exe, &args, &DEVICES),
    };
    let out = output_within(&mut cmd, 120);
    let (stdout, stderr) = texts(&out);
    let done = format!("differential: {steps} steps\n");
    if out.status.success() && stdout.ends_with(&done) {
        Ok(stdout)
    } else {
        let tail: String = stdout.lines().rev().take(5).collect::<Vec<_>>().join("\n");
        Err(format!(
            "{}\nlast lines, newest first:\n{tail}\n{stderr}",
            out.status
        ))
    }
}

/// Where `with` first differs from `reference`, with the lines before it.
fn first_difference(reference: &str, with: &str) -> Option<String> {
    let (a, b): (Vec<_>, Vec<_>) = (reference.lines().collect(), with.lines().collect());
    let at = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))?;
    let before = a[at.saturating_sub(3)..at].join("\n");
    Some(format!(
        "after\n{before}\nwithout the pool: {}\nunder the pool:   {}",
        a.get(at).unwrap_or(&"(end)"),
        b.get(at).unwrap_or(&"(end)")
    ))
}

/// Every seed under every setting: the reference for both disciplines, then each setting's run
/// compared with its discipline's reference.
fn compare(exe: &Path, seed: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for discipline in ["any", "ordered"] {
        let reference = match run(exe, seed, discipline, None) {
            Ok(out) => out,
            Err(e) => {
                bad.push(format!(
                    "seed {seed} {discipline} without the pool failed: {e}"
                ));
                continue;
            }
        };
        // The program's own model of its blocks holds without the pool.
        if let Some(line) = reference.lines().find(|l| l.contains("CLOBBERED")) {
            bad.push(format!("seed {seed} {discipline} without the pool: {line}"));
            continue;
        }
        for setting in SETTINGS.iter().filter(|s| s.discipline == discipline) {
            match run(exe, seed, discipline, Some(setting)) {
                Ok(with) => {
                    if let Some(d) = first_difference(&reference, &with) {
                        bad.push(format!("seed {seed}, {}: {d}", setting.name));
                    }
                }
                Err(e) => bad.push(format!("seed {seed}, {}: {e}", setting.name)),
            }
        }
    }
    bad
}

#[test]
fn a_seeded_program_over_both_apis_reads_the_same_answers_with_and_without_the_pool() {
    let exe = support::c_program_with_driver("differential");
    let seeds = seeds();
    let bad: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = seeds
            .iter()
            .map(|seed| {
                let exe = &exe;
                s.spawn(move || compare(exe, seed))
            })
            .collect();
        runs.into_iter()
            .flat_map(|h| h.join().expect("runner thread"))
            .collect()
    });
    assert!(bad.is_empty(), "{}", bad.join("\n\n"));
}
