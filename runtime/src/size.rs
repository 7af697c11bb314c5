//! Byte sizes on the command line (`--kv-memory 2GiB`, `--max-body 4MiB`):
//! parsing and printing.
//!
//! Binary units by default, as memory is sized: `K`, `M`, `G`, `T` (with or
//! without `i`/`iB`) are powers of 1024; `KB`, `MB`, `GB`, `TB` are powers of
//! 1000; a plain number (or `B`) is bytes. Fractions are allowed (`1.5GiB`).

/// Why a size string was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid size `{input}`: {reason} (examples: 2GiB, 512MiB, 1G, 1048576)")]
pub struct SizeError {
    /// The string as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Parses a byte size such as `2GiB`, `512MiB`, `1G`, `1.5GB` or `4096`.
pub fn parse_size(input: &str) -> Result<usize, SizeError> {
    let err = |reason| SizeError {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    if number.is_empty() {
        return Err(err("expected a number"));
    }
    let value: f64 = number.parse().map_err(|_| err("expected a number"))?;
    let multiplier: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "ki" | "kib" => 1024.0,
        "m" | "mi" | "mib" => 1024.0 * 1024.0,
        "g" | "gi" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "ti" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => {
            return Err(err(
                "unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)",
            ))
        }
    };
    let bytes = (value * multiplier).round();
    if bytes < 1.0 {
        return Err(err("must be at least 1 byte"));
    }
    if bytes >= usize::MAX as f64 {
        return Err(err("too large"));
    }
    Ok(bytes as usize)
}

/// A size for people: `2.0 GiB`, `512.0 MiB`, `900 B`.
pub fn format_size(bytes: usize) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("10B"), Ok(10));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size(" 3 MiB "), Ok(3 << 20));
        assert_eq!(parse_size("1Ti"), Ok(1 << 40));
    }

    #[test]
    fn rejects_nonsense() {
        for bad in ["", "GiB", "-1", "1.2.3G", "5 parsecs", "0", "0.1B", "1e3"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.to_string().contains("invalid size"), "{bad}");
        }
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(format_size(900), "900 B");
        assert_eq!(format_size(2 << 30), "2.0 GiB");
        assert_eq!(format_size(512 << 20), "512.0 MiB");
    }
}
