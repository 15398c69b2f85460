//! Every `GPUPOOL_*` variable, parsed and validated in one place.
//!
//! Parsing is pure (a lookup function in, a `Config` and warnings out) so it is unit-tested without
//! touching the process environment. A bad value never fails: it yields one warning line and the
//! default. Each value's own form (sizes, percentages, durations, output names) is read by
//! `parse.rs`; this file says which variable takes which form, and its default.

mod parse;

use std::borrow::Cow;
use std::os::unix::ffi::OsStrExt;

pub(crate) use parse::parse_bool;
pub use parse::{
    descriptor_named_by, parse_bytes, parse_device_bytes, parse_duration_ns, parse_slack_permille,
    parse_summary_dest, strip_always,
};
use parse::{is_off_word, output_path, parse_bytes_or_none, trimmed, Output};

/// When a cached block may be handed out again after the program freed it (contract item 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReuseMode {
    /// A freed block is reused only after a device-wide completion point (the program's own
    /// `cudaDeviceSynchronize`, or a fence the pool takes lazily). Covers every stream, including
    /// streams the pool cannot see (libraries with a static cudart, such as NCCL).
    Strict,
    /// A freed block is reused after one action on the legacy default stream (a kernel the program
    /// launched there, or an event the pool records and waits on there): covers work on blocking
    /// streams. Falls back to `Strict` once the program creates a non-blocking stream.
    Barrier,
    /// A freed block is reused at once, trusting stream order (PyTorch's rule for one stream).
    Relaxed,
}

impl ReuseMode {
    pub fn name(self) -> &'static str {
        match self {
            ReuseMode::Strict => "strict",
            ReuseMode::Barrier => "barrier",
            ReuseMode::Relaxed => "relaxed",
        }
    }
}

/// An amount of memory per device: the release threshold (cached bytes to keep) and the limit
/// (bytes the pool may reserve).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DeviceBytes {
    /// No bound: keep every cached byte, reserve as much as the driver gives.
    Unbounded,
    Bytes(u64),
    /// A fraction (0..=1) of the device's total memory, resolved when the device's pool is made.
    Fraction(f64),
}

impl DeviceBytes {
    /// The amount in bytes for a device with `total` bytes of memory.
    pub fn resolve(self, total: u64) -> u64 {
        match self {
            DeviceBytes::Unbounded => u64::MAX,
            DeviceBytes::Bytes(b) => b,
            DeviceBytes::Fraction(f) => (total as f64 * f) as u64,
        }
    }
}

/// Where the exit summary goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SummaryDest {
    Off,
    Stderr,
    Stdout,
    /// Another descriptor the program was started with, named by `/dev/fd/N`,
    /// `/proc/self/fd/N` or `/dev/stdin` (a shell's `3>file`, or its `>(command)`, which is
    /// `/dev/fd/63`): written to as it is, never renamed over.
    Descriptor(i32),
    Path(Vec<u8>),
}

/// `GPUPOOL_MAX_SPLIT_SIZE` (and `gpupool-trace replay --max-split`) must be larger than this,
/// the medium segments' size (`pool::size::MEDIUM_SEGMENT`, which a test keeps equal), as
/// PyTorch requires of `max_split_size_mb`: at or below it, every medium segment is a block too
/// large to split, and each request of 1 to 10 MiB would take a whole 20 MiB segment (5 MiB
/// requests under an 8 MiB cap reserved four times what they asked for). A number here: the
/// configuration is read below the pool and knows nothing of it.
pub const MAX_SPLIT_SIZE_ABOVE: u64 = 20 << 20;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub disable: bool,
    /// `GPUPOOL_DRIVER_HOOKS` (default on): the driver API's allocations are pooled too, reached
    /// through `dlsym` and `cuGetProcAddress`. Off: those lookups and calls are left untouched.
    pub driver_hooks: bool,
    pub release_threshold: DeviceBytes,
    /// Whether `GPUPOOL_RELEASE_THRESHOLD` chose `release_threshold`. Then a threshold the
    /// program sets on a default memory pool leaves the pool's alone (PyTorch sets one at start).
    pub release_threshold_chosen: bool,
    /// `GPUPOOL_LIMIT`: the most bytes the pool reserves on each device.
    pub limit: DeviceBytes,
    pub reuse: ReuseMode,
    /// Cached blocks at least this large are never split, and serve only requests of at least
    /// this size (PyTorch's `max_split_size_mb`).
    pub max_split_size: u64,
    /// In strict mode, freed-but-unfenced bytes above which the pool fences rather than growing.
    pub fence_bytes: u64,
    /// `GPUPOOL_THREAD_CACHE`: free bytes each thread may keep for itself once two threads
    /// allocate on one device (0: no thread caches).
    pub thread_cache: u64,
    pub summary: SummaryDest,
    /// `GPUPOOL_SUMMARY=always:...`: write a summary even when no allocation was intercepted
    /// (saying so, and why that may be).
    pub summary_always: bool,
    /// `GPUPOOL_SUMMARY_INTERVAL`: write the summary this often (nanoseconds).
    pub summary_interval_ns: Option<u64>,
    /// `GPUPOOL_TRACE`: the allocation trace's path (`%p`, `%r`, `%h` expanded), if any.
    pub trace: Option<Vec<u8>>,
    /// `GPUPOOL_EXPANDABLE`: blocks from expandable segments on CUDA virtual memory,
    /// where the driver has it (classic segments otherwise).
    pub expandable: bool,
    /// `GPUPOOL_EXPANDABLE_SLACK`: how far above its peak allocated the pool may hold memory
    /// before it moves free granules to a block that needs them instead of mapping more, in
    /// thousandths; `None` (the default): it maps more.
    pub expandable_slack_permille: Option<u32>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            disable: false,
            driver_hooks: true,
            release_threshold: DeviceBytes::Unbounded,
            release_threshold_chosen: false,
            limit: DeviceBytes::Unbounded,
            reuse: ReuseMode::Strict,
            max_split_size: u64::MAX,
            fence_bytes: 256 << 20,
            thread_cache: DEFAULT_THREAD_CACHE,
            summary: SummaryDest::Off,
            summary_always: false,
            summary_interval_ns: None,
            trace: None,
            expandable: true,
            expandable_slack_permille: None,
        }
    }
}

/// Default bound of each thread's cache of free blocks.
pub const DEFAULT_THREAD_CACHE: u64 = 64 << 20;

/// The variables this module understands: the fuzzer and `tests/hostile_env.rs` try each.
pub const VARIABLES: &[&str] = &[
    "GPUPOOL_DISABLE",
    "GPUPOOL_DRIVER_HOOKS",
    "GPUPOOL_RELEASE_THRESHOLD",
    "GPUPOOL_LIMIT",
    "GPUPOOL_REUSE",
    "GPUPOOL_MAX_SPLIT_SIZE",
    "GPUPOOL_FENCE_BYTES",
    "GPUPOOL_THREAD_CACHE",
    "GPUPOOL_SUMMARY",
    "GPUPOOL_SUMMARY_INTERVAL",
    "GPUPOOL_TRACE",
    "GPUPOOL_EXPANDABLE",
    "GPUPOOL_EXPANDABLE_SLACK",
];

impl Config {
    /// Parse from a lookup function (the environment, or a map in tests). Returns the config and
    /// one warning line per bad value.
    pub fn parse(get: impl Fn(&str) -> Option<Vec<u8>>) -> (Config, Vec<String>) {
        let mut c = Config::default();
        let mut r = Reader {
            get,
            warnings: Vec::new(),
        };
        c.disable = r.read("GPUPOOL_DISABLE", switch, c.disable, "0");
        c.driver_hooks = r.read("GPUPOOL_DRIVER_HOOKS", switch, c.driver_hooks, "1");
        let chosen = r.read(
            "GPUPOOL_RELEASE_THRESHOLD",
            |v| release_threshold(v).map(Some),
            None,
            "none (keep all cached memory)",
        );
        c.release_threshold_chosen = chosen.is_some();
        c.release_threshold = chosen.unwrap_or(c.release_threshold);
        c.limit = r.read("GPUPOOL_LIMIT", limit, c.limit, "no limit");
        c.reuse = r.read("GPUPOOL_REUSE", reuse, c.reuse, "strict");
        c.max_split_size = r.read(
            "GPUPOOL_MAX_SPLIT_SIZE",
            max_split_size,
            c.max_split_size,
            "none",
        );
        c.fence_bytes = r.read("GPUPOOL_FENCE_BYTES", fence_bytes, c.fence_bytes, "256MiB");
        c.thread_cache = r.read(
            "GPUPOOL_THREAD_CACHE",
            thread_cache,
            c.thread_cache,
            "64MiB",
        );
        (c.summary, c.summary_always) = r.read(
            "GPUPOOL_SUMMARY",
            summary,
            (c.summary, c.summary_always),
            "off",
        );
        c.summary_interval_ns = r.read(
            "GPUPOOL_SUMMARY_INTERVAL",
            summary_interval,
            c.summary_interval_ns,
            "no periodic summary",
        );
        c.trace = r.read("GPUPOOL_TRACE", trace, c.trace, "no trace");
        c.expandable = r.read("GPUPOOL_EXPANDABLE", switch, c.expandable, "1");
        c.expandable_slack_permille = r.read(
            "GPUPOOL_EXPANDABLE_SLACK",
            slack,
            c.expandable_slack_permille,
            "none",
        );
        (c, r.warnings)
    }

    /// Parse from the process environment.
    pub fn from_env() -> (Config, Vec<String>) {
        Config::parse(|name| env_value(name).map(|v| v.as_bytes().to_vec()))
    }
}

/// The variables that name a file the pool writes or a library it loads. In a program that runs
/// with rights its user lacks (set-user-ID, set-group-ID, file capabilities: `AT_SECURE`) they
/// are ignored, as glibc ignores `MALLOC_TRACE` there: else any user could have the program
/// write, or load code, where only the program may.
pub const NAMING_FILES: &[&str] = &["GPUPOOL_SUMMARY", "GPUPOOL_TRACE", "GPUPOOL_CUDART"];

/// Whether the process runs in secure mode (`AT_SECURE`). libc-level, for the load-time
/// constructor too.
pub fn secure() -> bool {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// `name`'s value in the environment; none for a variable of `NAMING_FILES` in secure mode.
pub fn env_value(name: &str) -> Option<std::ffi::OsString> {
    if NAMING_FILES.contains(&name) && secure() {
        return None;
    }
    std::env::var_os(name)
}

/// Why a value is not of its variable's form: the middle of the warning.
type Why = Cow<'static, str>;

/// The variables, read through `get`, and one warning line per bad value.
struct Reader<G> {
    get: G,
    warnings: Vec<String>,
}

impl<G: Fn(&str) -> Option<Vec<u8>>> Reader<G> {
    /// `name`'s value as `parse` reads it, or `default` when it is unset or `parse` refuses it;
    /// a refusal is one warning line, saying why and `default_text`, the default in words.
    fn read<T>(
        &mut self,
        name: &str,
        parse: fn(&[u8]) -> Result<T, Why>,
        default: T,
        default_text: &str,
    ) -> T {
        let Some(raw) = (self.get)(name) else {
            return default;
        };
        parse(&raw).unwrap_or_else(|why| {
            self.warnings.push(format!(
                "{name}={:?} ignored ({why}); using {default_text}",
                String::from_utf8_lossy(&raw)
            ));
            default
        })
    }
}

// Each variable's form: its value, or why the text is not of it.

fn switch(v: &[u8]) -> Result<bool, Why> {
    parse_bool(v).ok_or("expected 0 or 1".into())
}

fn release_threshold(v: &[u8]) -> Result<DeviceBytes, Why> {
    parse_device_bytes(v).ok_or(
        "expected bytes with a unit such as 512MiB or 4GiB, a percentage such as 40%, or 'none'"
            .into(),
    )
}

fn limit(v: &[u8]) -> Result<DeviceBytes, Why> {
    match parse_device_bytes(v) {
        Some(DeviceBytes::Fraction(0.0)) => Err("a limit of 0% leaves nothing".into()),
        Some(DeviceBytes::Bytes(0)) => Err("a limit of 0 bytes leaves nothing".into()),
        Some(l) => Ok(l),
        None => Err(
            "expected bytes with a unit such as 20GiB, a percentage such as 50%, or 'none'".into(),
        ),
    }
}

fn reuse(v: &[u8]) -> Result<ReuseMode, Why> {
    match trimmed(v).map(|s| s.to_ascii_lowercase()).as_deref() {
        Some("strict") => Ok(ReuseMode::Strict),
        Some("barrier") => Ok(ReuseMode::Barrier),
        Some("relaxed") => Ok(ReuseMode::Relaxed),
        _ => Err("expected strict, barrier or relaxed".into()),
    }
}

fn max_split_size(v: &[u8]) -> Result<u64, Why> {
    parse_bytes_or_none(v)
        .filter(|&b| b > MAX_SPLIT_SIZE_ABOVE)
        .ok_or("expected a size above 20MiB, or 'none'".into())
}

fn fence_bytes(v: &[u8]) -> Result<u64, Why> {
    parse_bytes_or_none(v).ok_or("expected a size".into())
}

/// `none` is 0: no thread caches.
fn thread_cache(v: &[u8]) -> Result<u64, Why> {
    match parse_bytes_or_none(v) {
        Some(u64::MAX) => Ok(0),
        Some(b) if b <= 1 << 30 => Ok(b),
        _ => Err("expected a size up to 1GiB, 0 or 'none'".into()),
    }
}

/// The destination, and whether `always:` asked for it (never for no summary).
fn summary(v: &[u8]) -> Result<(SummaryDest, bool), Why> {
    let (always, dest) = match strip_always(v) {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let dest = parse_summary_dest(dest)?;
    let always = always && dest != SummaryDest::Off;
    Ok((dest, always))
}

/// An off word or 0: none.
fn summary_interval(v: &[u8]) -> Result<Option<u64>, Why> {
    let off = trimmed(v).is_some_and(|s| is_off_word(&s));
    match parse_duration_ns(v) {
        _ if off => Ok(None),
        Some(0) => Ok(None),
        Some(ns) if ns >= 100_000_000 => Ok(Some(ns)),
        _ => Err("expected a duration of at least 100ms such as 30s, 5m or 500ms, or off".into()),
    }
}

/// An off word: none.
fn trace(v: &[u8]) -> Result<Option<Vec<u8>>, Why> {
    match output_path(v) {
        Output::Empty => Err("empty".into()),
        Output::Word(w) if is_off_word(&w) => Ok(None),
        Output::Word(w) => Err(format!("not a path: write ./{w} for a file of that name").into()),
        Output::Path => Ok(Some(v.to_vec())),
    }
}

fn slack(v: &[u8]) -> Result<Option<u32>, Why> {
    parse_slack_permille(v).ok_or("expected a percentage such as 4%, or 'none'".into())
}

/// Whether the driver's lookups and calls are interposed: `GPUPOOL_DRIVER_HOOKS` not off and
/// the pool not disabled. Read with `getenv` alone: `dlsym` asks it, at any point of a
/// process's life, before the configuration exists (a value that does not parse counts as the
/// default here; `Config::parse` warns about it).
pub fn driver_hooks_from_env() -> bool {
    let read = |name: &std::ffi::CStr| {
        // SAFETY: getenv with a NUL-terminated name; the value is copied at once.
        let v = unsafe { libc::getenv(name.as_ptr()) };
        // SAFETY: a non-NULL getenv result is a NUL-terminated string.
        (!v.is_null()).then(|| parse_bool(unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes()))
    };
    let hooks = read(c"GPUPOOL_DRIVER_HOOKS").flatten().unwrap_or(true);
    let disabled = read(c"GPUPOOL_DISABLE").flatten().unwrap_or(false);
    hooks && !disabled
}

/// `driver_hooks_from_env`, read once: whether the driver's lookups and calls are interposed.
/// Asked by the driver's lookups as well as by the hooks, so it lives below both.
pub fn driver_hooks() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    const UNKNOWN: u8 = 0;
    const ON: u8 = 1;
    static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
    match STATE.load(Ordering::Relaxed) {
        UNKNOWN => {
            let on = driver_hooks_from_env();
            STATE.store(if on { ON } else { ON + 1 }, Ordering::Relaxed);
            on
        }
        s => s == ON,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &[u8])]) -> (Config, Vec<String>) {
        let map: HashMap<String, Vec<u8>> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect();
        Config::parse(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_without_variables() {
        let (c, w) = parse(&[]);
        assert_eq!(c, Config::default());
        assert!(w.is_empty());
        assert_eq!(c.release_threshold.resolve(80 << 30), u64::MAX);
    }

    #[test]
    fn threshold_forms() {
        let (c, _) = parse(&[("GPUPOOL_RELEASE_THRESHOLD", b"256MiB")]);
        assert_eq!(c.release_threshold, DeviceBytes::Bytes(256 << 20));
        let (c, _) = parse(&[("GPUPOOL_RELEASE_THRESHOLD", b"40%")]);
        assert_eq!(c.release_threshold.resolve(100 << 30), 40 << 30);
        let (c, _) = parse(&[("GPUPOOL_RELEASE_THRESHOLD", b"none")]);
        assert_eq!(c.release_threshold, DeviceBytes::Unbounded);
        // Chosen, even as the default's value: a program's own threshold then changes nothing.
        assert!(c.release_threshold_chosen);
        let (c, _) = parse(&[("GPUPOOL_RELEASE_THRESHOLD", b"0")]);
        assert_eq!(c.release_threshold, DeviceBytes::Bytes(0));
        assert!(c.release_threshold_chosen);
        let (c, w) = parse(&[("GPUPOOL_RELEASE_THRESHOLD", b"lots")]);
        assert_eq!(c.release_threshold, DeviceBytes::Unbounded);
        assert!(!c.release_threshold_chosen && w.len() == 1, "{w:?}");
        assert!(!parse(&[]).0.release_threshold_chosen);
    }

    #[test]
    fn bad_values_warn_once_and_keep_defaults() {
        let (c, w) = parse(&[
            ("GPUPOOL_RELEASE_THRESHOLD", b"lots"),
            ("GPUPOOL_REUSE", b"yolo"),
            ("GPUPOOL_DISABLE", b"maybe"),
            ("GPUPOOL_MAX_SPLIT_SIZE", b"1KiB"),
            ("GPUPOOL_FENCE_BYTES", &[0xfe, 0xff]),
            ("GPUPOOL_SUMMARY", b""),
        ]);
        assert_eq!(c, Config::default());
        assert_eq!(w.len(), 6, "{w:?}");
        assert!(w
            .iter()
            .any(|l| l.contains("GPUPOOL_RELEASE_THRESHOLD=\"lots\"")));
        let (_, w) = parse(&[("GPUPOOL_RELEASE_THRESHOLD", b"150%")]);
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn limit_forms() {
        assert_eq!(Config::default().limit, DeviceBytes::Unbounded);
        let (c, w) = parse(&[("GPUPOOL_LIMIT", b"20GiB")]);
        assert_eq!((c.limit, w.len()), (DeviceBytes::Bytes(20 << 30), 0));
        let (c, _) = parse(&[("GPUPOOL_LIMIT", b"50%")]);
        assert_eq!(c.limit.resolve(80 << 30), 40 << 30);
        let (c, w) = parse(&[("GPUPOOL_LIMIT", b"none")]);
        assert_eq!((c.limit, w.len()), (DeviceBytes::Unbounded, 0));
        for bad in [&b"0"[..], b"0%", b"lots", b"150%", b"-1G"] {
            let (c, w) = parse(&[("GPUPOOL_LIMIT", bad)]);
            assert_eq!(c.limit, DeviceBytes::Unbounded, "{bad:?}");
            assert!(
                w[0].contains("GPUPOOL_LIMIT") && w[0].contains("no limit"),
                "{w:?}"
            );
        }
    }

    #[test]
    fn expandable_segments_are_on_unless_turned_off() {
        assert!(Config::default().expandable);
        let (c, w) = parse(&[("GPUPOOL_EXPANDABLE", b"0")]);
        assert!(!c.expandable && w.is_empty());
        let (c, w) = parse(&[("GPUPOOL_EXPANDABLE", b"maybe")]);
        assert!(c.expandable);
        assert!(w[0].contains("GPUPOOL_EXPANDABLE"), "{w:?}");
    }

    #[test]
    fn expandable_slack_is_a_percentage_or_none() {
        assert_eq!(Config::default().expandable_slack_permille, None);
        let (c, w) = parse(&[("GPUPOOL_EXPANDABLE_SLACK", b"4%")]);
        assert_eq!((c.expandable_slack_permille, w.len()), (Some(40), 0));
        let (c, w) = parse(&[("GPUPOOL_EXPANDABLE_SLACK", b" 2.5 % ")]);
        assert_eq!((c.expandable_slack_permille, w.len()), (Some(25), 0));
        let (c, w) = parse(&[("GPUPOOL_EXPANDABLE_SLACK", b"none")]);
        assert_eq!((c.expandable_slack_permille, w.len()), (None, 0));
        for bad in [&b"64MiB"[..], b"150%", b"lots"] {
            let (c, w) = parse(&[("GPUPOOL_EXPANDABLE_SLACK", bad)]);
            assert_eq!(c.expandable_slack_permille, None);
            assert!(w[0].contains("GPUPOOL_EXPANDABLE_SLACK"), "{w:?}");
        }
    }

    #[test]
    fn thread_cache_bound() {
        assert_eq!(Config::default().thread_cache, 64 << 20);
        let (c, w) = parse(&[("GPUPOOL_THREAD_CACHE", b"16MiB")]);
        assert_eq!((c.thread_cache, w.len()), (16 << 20, 0));
        for off in [&b"0"[..], b"none"] {
            let (c, w) = parse(&[("GPUPOOL_THREAD_CACHE", off)]);
            assert_eq!((c.thread_cache, w.len()), (0, 0));
        }
        for bad in [&b"2GiB"[..], b"lots", b"-1"] {
            let (c, w) = parse(&[("GPUPOOL_THREAD_CACHE", bad)]);
            assert_eq!(c.thread_cache, DEFAULT_THREAD_CACHE);
            assert!(w[0].contains("GPUPOOL_THREAD_CACHE"), "{w:?}");
        }
    }

    #[test]
    fn modes_and_switches() {
        let (c, w) = parse(&[
            ("GPUPOOL_REUSE", b"Relaxed"),
            ("GPUPOOL_DISABLE", b"1"),
            ("GPUPOOL_SUMMARY", b"/tmp/x-%p.txt"),
        ]);
        assert!(w.is_empty());
        assert_eq!(c.reuse, ReuseMode::Relaxed);
        assert!(c.disable);
        assert_eq!(c.summary, SummaryDest::Path(b"/tmp/x-%p.txt".to_vec()));
        assert!(!c.summary_always);
        let (c, w) = parse(&[
            ("GPUPOOL_SUMMARY", b"always:stderr"),
            ("GPUPOOL_SUMMARY_INTERVAL", b"1.5m"),
        ]);
        assert!(w.is_empty());
        assert_eq!(c.summary, SummaryDest::Stderr);
        assert!(c.summary_always);
        assert_eq!(c.summary_interval_ns, Some(90_000_000_000));
        let (c, _) = parse(&[("GPUPOOL_SUMMARY", &[b'/', 0xff, b'x'])]);
        assert_eq!(c.summary, SummaryDest::Path(vec![b'/', 0xff, b'x']));
    }

    /// The summary: (destination, always, warnings) for `value`.
    fn summary(value: &[u8]) -> (SummaryDest, bool, Vec<String>) {
        let (c, w) = parse(&[("GPUPOOL_SUMMARY", value)]);
        (c.summary, c.summary_always, w)
    }

    #[test]
    fn summary_keywords_in_any_case() {
        for off in ["OFF", "Off", "off", "0", "none", "NONE", " off "] {
            let want = (SummaryDest::Off, false, vec![]);
            assert_eq!(summary(off.as_bytes()), want, "{off}");
        }
        for err in ["Stderr", "STDERR", "1"] {
            let want = (SummaryDest::Stderr, false, vec![]);
            assert_eq!(summary(err.as_bytes()), want, "{err}");
        }
        assert_eq!(summary(b"STDOUT"), (SummaryDest::Stdout, false, vec![]));
        assert_eq!(
            summary(b"ALWAYS:Stderr"),
            (SummaryDest::Stderr, true, vec![])
        );
        assert_eq!(
            summary(b" Always:stdout"),
            (SummaryDest::Stdout, true, vec![])
        );
        assert_eq!(summary(b"always:OFF"), (SummaryDest::Off, false, vec![]));
        let path = |p: &[u8]| (SummaryDest::Path(p.to_vec()), true, vec![]);
        assert_eq!(summary(b"ALWAYS:/tmp/s.json"), path(b"/tmp/s.json"));
    }

    #[test]
    fn the_paths_of_the_standard_streams_are_the_streams() {
        for err in [
            "/dev/stderr",
            "/dev/fd/2",
            "/proc/self/fd/2",
            " /dev/stderr ",
        ] {
            let want = (SummaryDest::Stderr, false, vec![]);
            assert_eq!(summary(err.as_bytes()), want, "{err}");
        }
        for out in ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"] {
            let want = (SummaryDest::Stdout, false, vec![]);
            assert_eq!(summary(out.as_bytes()), want, "{out}");
        }
        assert_eq!(
            summary(b"always:/dev/stderr"),
            (SummaryDest::Stderr, true, vec![])
        );
        for (p, fd) in [
            ("/dev/fd/3", 3),
            ("/proc/self/fd/63", 63),
            ("/dev/stdin", 0),
            ("/dev/fd/0", 0),
        ] {
            let want = (SummaryDest::Descriptor(fd), false, vec![]);
            assert_eq!(summary(p.as_bytes()), want, "{p}");
        }
        // Only those: a file beside them, or a name that is no descriptor's, is a path.
        for p in [
            "/dev/stderr.json",
            "/tmp/dev/stderr",
            "/dev/fd/3x",
            "/dev/fd/",
            "/dev/fd/-1",
            "/dev/fd/99999999999",
            "/proc/1/fd/3",
        ] {
            let want = (SummaryDest::Path(p.as_bytes().to_vec()), false, vec![]);
            assert_eq!(summary(p.as_bytes()), want, "{p}");
        }
    }

    #[test]
    fn a_bare_word_is_no_file_name() {
        for word in ["stdrr", "yes", "summary", "true"] {
            let (dest, _, w) = summary(word.as_bytes());
            assert_eq!(dest, SummaryDest::Off, "{word}");
            assert_eq!(w.len(), 1, "{word}: {w:?}");
            assert!(
                w[0].starts_with(&format!("GPUPOOL_SUMMARY=\"{word}\" ignored"))
                    && w[0].contains(&format!("./{word}")),
                "{w:?}"
            );
            let (dest, _, w) = summary(format!("always:{word}").as_bytes());
            assert_eq!((dest, w.len()), (SummaryDest::Off, 1), "always:{word}");
        }
        // Anything with a `/`, a `.` or a `%` is a path.
        for p in ["./stdrr", "summary.txt", "/var/log/s", "job-%p", "OFF.json"] {
            let want = (SummaryDest::Path(p.as_bytes().to_vec()), false, vec![]);
            assert_eq!(summary(p.as_bytes()), want, "{p}");
        }
    }

    #[test]
    fn trace_off_words_and_bare_words() {
        for off in [&b"OFF"[..], b"off", b"0", b"None"] {
            let (c, w) = parse(&[("GPUPOOL_TRACE", off)]);
            assert_eq!((c.trace, w.len()), (None, 0), "{off:?}");
        }
        for word in ["trace", "1", "yes"] {
            let (c, w) = parse(&[("GPUPOOL_TRACE", word.as_bytes())]);
            assert_eq!(c.trace, None, "{word}");
            assert_eq!(w.len(), 1, "{word}");
            assert!(w[0].contains(&format!("./{word}")), "{w:?}");
        }
        for p in [&b"./trace"[..], b"t.bin", b"/tmp/%p"] {
            let (c, w) = parse(&[("GPUPOOL_TRACE", p)]);
            assert_eq!((c.trace, w.len()), (Some(p.to_vec()), 0));
        }
    }

    #[test]
    fn interval_off_words() {
        for off in [&b"0"[..], b"off", b"NONE", b"0s", b"0ms"] {
            let (c, w) = parse(&[("GPUPOOL_SUMMARY_INTERVAL", off)]);
            assert_eq!((c.summary_interval_ns, w.len()), (None, 0), "{off:?}");
        }
    }

    #[test]
    fn an_interval_under_100ms_warns() {
        let (c, w) = parse(&[("GPUPOOL_SUMMARY_INTERVAL", b"10ms")]);
        assert_eq!((c.summary_interval_ns, w.len()), (None, 1));
    }
}
