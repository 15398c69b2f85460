//! The forms a `GPUPOOL_*` value takes, read from its bytes: switches, sizes, percentages of
//! the device, durations, and output destinations. Pure functions: `None` or `Err` for a value
//! that is not of the form, and `Config::parse` turns that into a warning.

use super::{DeviceBytes, SummaryDest};

pub(super) fn trimmed(v: &[u8]) -> Option<String> {
    std::str::from_utf8(v).ok().map(|s| s.trim().to_string())
}

pub fn parse_bool(v: &[u8]) -> Option<bool> {
    match trimmed(v)?.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" | "" => Some(false),
        _ => None,
    }
}

/// `512MiB`, `4GiB`, `1.5G`, `1048576`, `2 MB`. Binary and decimal prefixes both mean powers of
/// 1024 for single letters (`G` = GiB, as CUDA and PyTorch users expect); `KB`/`MB`/`GB` are
/// decimal, `KiB`/`MiB`/`GiB` binary.
pub fn parse_bytes(v: &[u8]) -> Option<u64> {
    number_with_unit(v, |unit| {
        Some(match unit {
            "" | "b" => 1.0,
            "k" | "kib" => 1024.0,
            "m" | "mib" => 1024.0 * 1024.0,
            "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
            "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            "kb" => 1e3,
            "mb" => 1e6,
            "gb" => 1e9,
            "tb" => 1e12,
            _ => return None,
        })
    })
}

/// A decimal number (digits and `.`) followed by a unit, blanks allowed between: the number
/// times what `scale` gives for the unit (lowercase, `""` for none), if it fits a `u64`.
fn number_with_unit(v: &[u8], scale: impl Fn(&str) -> Option<f64>) -> Option<u64> {
    let s = trimmed(v)?;
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let x = n * scale(unit.trim().to_ascii_lowercase().as_str())?;
    (x.is_finite() && x >= 0.0 && x < u64::MAX as f64).then_some(x as u64)
}

/// `GPUPOOL_SUMMARY`'s value after an `always:` prefix (in any case, after leading blanks), or
/// `None` without one. Pure byte work: the load-time constructor calls it.
pub fn strip_always(v: &[u8]) -> Option<&[u8]> {
    const PREFIX: &[u8] = b"always:";
    let v = v.trim_ascii_start();
    (v.len() >= PREFIX.len() && v[..PREFIX.len()].eq_ignore_ascii_case(PREFIX))
        .then(|| &v[PREFIX.len()..])
}

/// What a value naming an output file is.
pub(super) enum Output {
    Empty,
    /// One word without `/`, `.` or `%` (trimmed): a keyword or a typo of one (`stdrr`) far
    /// more often than a file name. `./NAME` says a file is meant.
    Word(String),
    Path,
}

pub(super) fn output_path(v: &[u8]) -> Output {
    let t = v.trim_ascii();
    if t.is_empty() {
        Output::Empty
    } else if t.iter().any(|b| matches!(b, b'/' | b'.' | b'%')) {
        Output::Path
    } else {
        Output::Word(String::from_utf8_lossy(t).into_owned())
    }
}

/// The words that switch an output off, as `0` does, in any case.
pub(super) fn is_off_word(w: &str) -> bool {
    ["off", "0", "none"]
        .iter()
        .any(|k| w.eq_ignore_ascii_case(k))
}

/// The paths that name the process's own descriptors: the streams and descriptors, not files.
/// A file's summary is renamed into place, which would replace `/dev/stderr` (a symbolic link
/// to `/proc/self/fd/2`) with a regular file for every later process, as root.
fn stream_named_by(path: &[u8]) -> Option<SummaryDest> {
    match descriptor_named_by(path)? {
        1 => Some(SummaryDest::Stdout),
        2 => Some(SummaryDest::Stderr),
        fd => Some(SummaryDest::Descriptor(fd)),
    }
}

/// The descriptor `path` names: `/dev/stdin`, `/dev/stdout`, `/dev/stderr`, `/dev/fd/N` or
/// `/proc/self/fd/N` (N in decimal digits). Used at load too: no allocation.
pub fn descriptor_named_by(path: &[u8]) -> Option<i32> {
    match path {
        b"/dev/stdin" => return Some(0),
        b"/dev/stdout" => return Some(1),
        b"/dev/stderr" => return Some(2),
        _ => {}
    }
    let digits = path
        .strip_prefix(b"/dev/fd/")
        .or_else(|| path.strip_prefix(b"/proc/self/fd/"))?;
    if digits.is_empty() || digits.len() > 9 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0, |n, d| n * 10 + i32::from(d - b'0')))
}

/// `stderr` (or `1`, `/dev/stderr`), `stdout` (`/dev/stdout`), `off` (or `0`, `none`) in any
/// case, or a path (any bytes but NUL: paths need not be UTF-8). `Err` says why the value is
/// none of those.
pub fn parse_summary_dest(v: &[u8]) -> Result<SummaryDest, String> {
    match output_path(v) {
        Output::Empty => Err("empty; expected stderr, stdout, off or a file path".into()),
        Output::Word(w) if is_off_word(&w) => Ok(SummaryDest::Off),
        Output::Word(w) if w.eq_ignore_ascii_case("stderr") || w == "1" => Ok(SummaryDest::Stderr),
        Output::Word(w) if w.eq_ignore_ascii_case("stdout") => Ok(SummaryDest::Stdout),
        Output::Word(w) => Err(format!(
            "neither stderr, stdout nor off, and not a path: write ./{w} for a file of that name"
        )),
        Output::Path if v.contains(&0) => Err("a path cannot hold a NUL byte".into()),
        Output::Path => {
            Ok(stream_named_by(v.trim_ascii()).unwrap_or(SummaryDest::Path(v.to_vec())))
        }
    }
}

/// `30s`, `5m`, `1h`, `500ms`, `1.5s` (units in any case); a bare number is seconds.
pub fn parse_duration_ns(v: &[u8]) -> Option<u64> {
    number_with_unit(v, |unit| {
        Some(match unit {
            "" | "s" => 1e9,
            "ms" => 1e6,
            "m" | "min" => 60e9,
            "h" => 3600e9,
            _ => return None,
        })
    })
}

pub(super) fn parse_bytes_or_none(v: &[u8]) -> Option<u64> {
    match trimmed(v)?.to_ascii_lowercase().as_str() {
        "none" | "unlimited" | "inf" => Some(u64::MAX),
        _ => parse_bytes(v),
    }
}

/// Bytes as `parse_bytes` reads them, a percentage of the device (`40%`), or `none`.
pub fn parse_device_bytes(v: &[u8]) -> Option<DeviceBytes> {
    let s = trimmed(v)?;
    if let Some(pct) = s.strip_suffix('%') {
        let p: f64 = pct.trim().parse().ok()?;
        if !(0.0..=100.0).contains(&p) || !p.is_finite() {
            return None;
        }
        return Some(DeviceBytes::Fraction(p / 100.0));
    }
    match parse_bytes_or_none(v)? {
        u64::MAX => Some(DeviceBytes::Unbounded),
        b => Some(DeviceBytes::Bytes(b)),
    }
}

/// `GPUPOOL_EXPANDABLE_SLACK` (and the trace tool's `--slack`): a percentage such as `4%`, in
/// thousandths, or `none` for no slack (`Some(None)`). A size is no slack: it would not follow
/// the program's peak.
pub fn parse_slack_permille(v: &[u8]) -> Option<Option<u32>> {
    if trimmed(v)?.eq_ignore_ascii_case("none") {
        return Some(None);
    }
    match parse_device_bytes(v)? {
        DeviceBytes::Fraction(f) => Some(Some((f * 1000.0).round() as u32)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_units() {
        assert_eq!(parse_bytes(b"512MiB"), Some(512 << 20));
        assert_eq!(parse_bytes(b"4GiB"), Some(4 << 30));
        assert_eq!(parse_bytes(b"1.5G"), Some(3 << 29));
        assert_eq!(parse_bytes(b"1048576"), Some(1 << 20));
        assert_eq!(parse_bytes(b" 2 MB "), Some(2_000_000));
        assert_eq!(parse_bytes(b"0"), Some(0));
        assert_eq!(parse_bytes(b"-1G"), None);
        assert_eq!(parse_bytes(b"12XB"), None);
        assert_eq!(parse_bytes(b""), None);
        assert_eq!(parse_bytes(b"1e400"), None);
        assert_eq!(parse_bytes(b"99999999999T"), None);
        assert_eq!(parse_bytes(&[0xff, 0x31]), None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns(b"30s"), Some(30_000_000_000));
        assert_eq!(parse_duration_ns(b"500ms"), Some(500_000_000));
        assert_eq!(parse_duration_ns(b"2"), Some(2_000_000_000));
        assert_eq!(parse_duration_ns(b"1h"), Some(3_600_000_000_000));
        assert_eq!(parse_duration_ns(b"-1s"), None);
        assert_eq!(parse_duration_ns(b"soon"), None);
    }

    #[test]
    fn duration_units_in_any_case() {
        assert_eq!(parse_duration_ns(b"30S"), Some(30_000_000_000));
        assert_eq!(parse_duration_ns(b"500MS"), Some(500_000_000));
        assert_eq!(parse_duration_ns(b"2Min"), Some(120_000_000_000));
    }

    #[test]
    fn slack_is_a_percentage_in_thousandths_or_none() {
        assert_eq!(parse_slack_permille(b"4%"), Some(Some(40)));
        assert_eq!(parse_slack_permille(b" None "), Some(None));
        assert_eq!(parse_slack_permille(b"64MiB"), None);
        assert_eq!(parse_slack_permille(b"inf%"), None);
    }

    #[test]
    fn the_always_prefix_in_any_case() {
        assert_eq!(strip_always(b"Always:x"), Some(&b"x"[..]));
        assert_eq!(strip_always(b"always"), None);
        assert_eq!(strip_always(b"alwaysx:"), None);
    }
}
