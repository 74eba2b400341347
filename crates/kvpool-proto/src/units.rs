//! Human sizes (`4GiB`, `16MB`, `1073741824`) and durations (`10s`, `500ms`),
//! parsed the same way by flags, env vars, config files and Python `setup`.

use std::time::Duration;

/// Parses a byte size. Units are case-insensitive; `K/M/G/T` with or without
/// `B`/`iB` are all powers of 1024 (Mooncake treats `"16MB"` as 16 MiB).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("invalid size {s:?}: unknown unit {unit:?}")),
    };
    if num.is_empty() {
        return Err(format!("invalid size {s:?}: no number"));
    }
    if num.contains('.') {
        let v: f64 = num
            .parse()
            .map_err(|_| format!("invalid size {s:?}: bad number"))?;
        let bytes = v * mult as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(format!("invalid size {s:?}: out of range"));
        }
        return Ok(bytes as u64);
    }
    let v: u64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: bad number"))?;
    v.checked_mul(mult)
        .ok_or_else(|| format!("invalid size {s:?}: out of range"))
}

/// Parses a duration like `10s`, `500ms`, `2m`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return seconds(s, secs);
        }
        return Err(format!("invalid duration {s:?}"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: bad number"))?;
    let secs = match unit.trim() {
        "ns" => v / 1e9,
        "us" => v / 1e6,
        "ms" => v / 1e3,
        "s" => v,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        u => return Err(format!("invalid duration {s:?}: unknown unit {u:?}")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("invalid duration {s:?}"));
    }
    seconds(s, secs)
}

/// `secs` as a duration; more seconds than a `Duration` holds is an error
/// (`Duration::from_secs_f64` would panic).
fn seconds(s: &str, secs: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(secs).map_err(|_| format!("invalid duration {s:?}: out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("16MB").unwrap(), 16 << 20);
        assert_eq!(parse_size("4gb").unwrap(), 4 << 30);
        assert_eq!(parse_size("1073741824").unwrap(), 1 << 30);
        assert_eq!(parse_size("512 KiB").unwrap(), 512 << 10);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert!(parse_size("").is_err());
        assert!(parse_size("4XB").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("3 weeks").is_err());
        assert!(parse_duration("1e20").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
    }
}
