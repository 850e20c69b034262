//! Byte sizes as people type them, one grammar for every option and file:
//! `4096`, `0x1000`, `64K`, `32M`, `1G`, `2T`, with an optional `B` or `iB`
//! after the unit, any case. Units are binary (K = 1024).

/// Why a string is not a size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Not a number with an optional unit.
    #[error("`{0}` is not a size (examples: 4096, 0x1000, 64K, 32M, 1G)")]
    Malformed(String),
    /// A size too large for the type it is read into.
    #[error("`{0}` is too large")]
    TooLarge(String),
}

/// Parses a size (see the module's grammar) into any integer type that
/// holds it: `parse_size::<u64>("64K")`, or as a clap value parser,
/// `value_parser = parse_size::<usize>`.
///
/// # Errors
/// [`SizeError::Malformed`] for anything but a decimal or `0x` hexadecimal
/// number with an optional unit; [`SizeError::TooLarge`] when it overflows
/// 64 bits or `T`.
pub fn parse_size<T: TryFrom<u64>>(s: &str) -> Result<T, SizeError> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    // "0xb" is eleven, not zero bytes with a unit: a hex body keeps its b.
    let body = if lower.starts_with("0x") && !lower.ends_with("ib") {
        lower.as_str()
    } else {
        body
    };
    let (num, shift) = match body.as_bytes().last() {
        Some(b'k') => (&body[..body.len() - 1], 10),
        Some(b'm') => (&body[..body.len() - 1], 20),
        Some(b'g') => (&body[..body.len() - 1], 30),
        Some(b't') => (&body[..body.len() - 1], 40),
        _ => (body, 0),
    };
    let malformed = || SizeError::Malformed(s.to_owned());
    let n = match num.strip_prefix("0x") {
        Some(h) if !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u64::from_str_radix(h, 16).map_err(|_| SizeError::TooLarge(s.to_owned()))?
        }
        Some(_) => return Err(malformed()),
        None if !num.is_empty() && num.bytes().all(|b| b.is_ascii_digit()) => num
            .parse::<u64>()
            .map_err(|_| SizeError::TooLarge(s.to_owned()))?,
        None => return Err(malformed()),
    };
    n.checked_mul(1 << shift)
        .and_then(|v| T::try_from(v).ok())
        .ok_or_else(|| SizeError::TooLarge(s.to_owned()))
}

/// A size in the grammar [`parse_size`] reads, as short as it is exact:
/// `512`, `4K`, `1M`, `8M`, `1G` (otherwise bytes), as fio and dd write
/// them.
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Bytes as a short binary size for people: `512 B`, `32 MiB`, `1.50 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_grammar() {
        assert_eq!(parse_size::<u64>("4096"), Ok(4096));
        assert_eq!(parse_size::<u64>("32M"), Ok(32 << 20));
        assert_eq!(parse_size::<u64>("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size::<u64>("64kb"), Ok(64 << 10));
        assert_eq!(parse_size::<u64>(" 2T "), Ok(2 << 40));
        assert_eq!(parse_size::<u64>("0x80000"), Ok(0x80000));
        assert_eq!(parse_size::<u64>("0X1000"), Ok(0x1000));
        assert_eq!(parse_size::<u64>("0xb"), Ok(11));
        assert_eq!(parse_size::<u64>("0x2K"), Ok(2048));
        assert_eq!(parse_size::<u64>("0x1KiB"), Ok(1024));
        assert_eq!(
            parse_size::<u32>("4G"),
            Err(SizeError::TooLarge("4G".into()))
        );
        assert_eq!(parse_size::<usize>("512K"), Ok(512 << 10));
        for bad in [
            "lots", "1.5G", "", "K", "0x", "0xg", "-1", "+4", "4 K", "1e3",
        ] {
            assert_eq!(
                parse_size::<u64>(bad),
                Err(SizeError::Malformed(bad.into())),
                "{bad:?}"
            );
        }
        assert!(matches!(
            parse_size::<u64>("99999999999T"),
            Err(SizeError::TooLarge(_))
        ));
        assert!(matches!(
            parse_size::<u64>("99999999999999999999"),
            Err(SizeError::TooLarge(_))
        ));
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(32 << 20), "32 MiB");
        assert_eq!(human(3 << 29), "1.50 GiB");
    }

    #[test]
    fn formatted_sizes_parse_back() {
        for (n, s) in [
            (512, "512"),
            (4096, "4K"),
            (8 << 20, "8M"),
            (1 << 30, "1G"),
            (1536, "1536"),
        ] {
            assert_eq!(format_size(n), s);
            assert_eq!(parse_size::<u64>(s), Ok(n));
        }
    }
}
