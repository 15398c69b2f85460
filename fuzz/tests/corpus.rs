//! The fuzz targets on stable: every file of the seed corpus (`fuzz/corpus/<target>/`), then a
//! fixed number of seeded random mutations of them, through the same checks libFuzzer runs.
//! Deterministic: `GPUPOOL_FUZZ_SEED` and `GPUPOOL_FUZZ_RUNS` change the seed and the count; a
//! failure prints the seed, the run and the input (hex) that failed.

use std::path::Path;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const TOKENS: &[&[u8]] = &[
    b"=",
    b"\n",
    b"%",
    b"GiB",
    b"MiB",
    b"KB",
    b"ms",
    b"s",
    b"none",
    b"always:",
    b"stderr",
    b".",
    b"-",
    b"1e308",
    b"18446744073709551615",
    b"0",
    b"strict",
    b"barrier",
    b"relaxed",
    &[0xff],
    &[0xfe, 0xff],
    b" ",
    b"\t",
    b"%p",
    b"%r",
    b"%h",
    b"/",
];

const WORDS: &[u64] = &[
    0,
    1,
    511,
    512,
    1 << 20,
    1 << 40,
    u64::MAX,
    u64::MAX - 511,
    1 << 63,
];

fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(9) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(v.len() + 1);
                let t = TOKENS[rng.below(TOKENS.len())];
                v.splice(i..i, t.iter().copied());
            }
            3 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = rng.below(v.len() - i + 1);
                v.drain(i..i + n);
            }
            4 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = rng.below((v.len() - i).min(64) + 1);
                let piece = v[i..i + n].to_vec();
                let j = rng.below(v.len() + 1);
                v.splice(j..j, piece);
            }
            5 if !other.is_empty() => {
                let i = rng.below(v.len() + 1);
                let j = rng.below(other.len());
                v.truncate(i);
                v.extend_from_slice(&other[j..]);
            }
            6 if v.len() >= 8 => {
                // An aligned word (a trace field) set to an interesting value.
                let i = rng.below(v.len() / 8) * 8;
                let w = WORDS[rng.below(WORDS.len())].to_le_bytes();
                v[i..i + 8].copy_from_slice(&w);
            }
            7 => v.truncate(rng.below(v.len() + 1)),
            _ => {
                let i = rng.below(v.len() + 1);
                v.insert(i, b"0123456789"[rng.below(10)]);
            }
        }
    }
    v
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    let inputs: Vec<Vec<u8>> = files
        .iter()
        .map(|p| std::fs::read(p).expect("read"))
        .collect();
    assert!(!inputs.is_empty(), "empty corpus {}", dir.display());
    inputs
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn fuzz(target: &str, default_runs: u64, check: fn(&[u8])) {
    let seed: u64 = std::env::var("GPUPOOL_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x00c0_ffee);
    let runs: u64 = std::env::var("GPUPOOL_FUZZ_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_runs);
    let inputs = corpus(target);
    let run_one = |what: String, input: &[u8]| {
        if std::panic::catch_unwind(|| check(input)).is_err() {
            panic!(
                "fuzz target {target} failed on {what} (seed {seed}): input {} bytes, hex {}",
                input.len(),
                hex(input)
            );
        }
    };
    for (i, input) in inputs.iter().enumerate() {
        run_one(format!("corpus entry {i}"), input);
    }
    let mut rng = Rng(seed.max(1));
    for run in 0..runs {
        let a = &inputs[rng.below(inputs.len())];
        let b = &inputs[rng.below(inputs.len())];
        let input = mutate(&mut rng, a, b);
        run_one(format!("mutation {run}"), &input);
    }
}

#[test]
fn config_corpus_and_mutations() {
    fuzz("config", 20_000, gpupool_fuzz::config);
}

#[test]
fn trace_corpus_and_mutations() {
    fuzz("trace", 3_000, gpupool_fuzz::trace);
}
