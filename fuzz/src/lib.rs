//! The checks behind the fuzz targets, shared by the libFuzzer binaries (`fuzz_targets/`) and the
//! stable corpus-plus-mutation test (`tests/corpus.rs`). Each function panics when a property
//! fails; any panic inside the parsers is a finding too.

use gpupool::config::{parse_bytes, parse_duration_ns, Config, VARIABLES};
use gpupool::pool::replay::{replay, Overrides};
use gpupool::pool::trace::{parse, MAGIC, RECORD_SIZE};

/// `data` is an environment: lines `NAME=VALUE` (bytes, any encoding). Parsing never panics,
/// gives at most one warning per variable, names the variable in it, and a warning means the
/// default was kept for that variable (checked by parsing that variable alone).
pub fn config(data: &[u8]) {
    let mut env: Vec<(String, Vec<u8>)> = Vec::new();
    for line in data.split(|&b| b == b'\n') {
        let Some(eq) = line.iter().position(|&b| b == b'=') else {
            continue;
        };
        let name = String::from_utf8_lossy(&line[..eq]).into_owned();
        // Short names pick one of the real variables, so mutations reach every parser.
        let name = match name.parse::<usize>() {
            Ok(i) => VARIABLES[i % VARIABLES.len()].to_string(),
            Err(_) => name,
        };
        env.push((name, line[eq + 1..].to_vec()));
    }
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let (_, warnings) = Config::parse(lookup);
    for var in VARIABLES {
        let about = warnings
            .iter()
            .filter(|w| w.starts_with(&format!("{var}=")))
            .count();
        assert!(about <= 1, "{var}: {about} warnings: {warnings:?}");
        if about == 1 {
            let (alone, w) = Config::parse(|n| if n == *var { lookup(n) } else { None });
            assert_eq!(w.len(), 1, "{var}");
            assert_eq!(
                alone,
                Config::default(),
                "{var}: a bad value changed the configuration"
            );
        }
    }
    assert!(
        warnings.len() <= VARIABLES.len(),
        "more warnings than variables: {warnings:?}"
    );
    for (_, v) in &env {
        let _ = parse_bytes(v);
        let _ = parse_duration_ns(v);
    }
}

/// `data` is a trace file. Parsing never panics; what parses re-encodes to the same bytes (less a
/// truncated last record); replaying it (recorded settings, and under a small capacity) never
/// panics and accounts consistently.
pub fn trace(data: &[u8]) {
    let Ok(records) = parse(data) else {
        return;
    };
    let whole = MAGIC.len() + records.len() * RECORD_SIZE;
    let mut again = MAGIC.to_vec();
    for r in &records {
        r.encode(&mut again);
    }
    assert_eq!(again, data[..whole], "re-encoding differs");
    for overrides in [
        Overrides::default(),
        Overrides {
            capacity: Some(64 << 20),
            threshold: Some(0),
            ..Overrides::default()
        },
    ] {
        for d in replay(&records, &overrides) {
            let s = &d.stats;
            assert!(
                s.allocated.current <= s.reserved.current,
                "device {}: allocated {} > reserved {}",
                d.device,
                s.allocated.current,
                s.reserved.current
            );
        }
    }
}
