//! Byte sizes on the command line: `4096`, `64K`, `32M`, `1G`, `1GiB`.

/// Parses a size with an optional binary suffix (K, M, G, T; `iB`/`B` after
/// it allowed, case-insensitive).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (num, shift) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 10),
        Some('m') => (&body[..body.len() - 1], 20),
        Some('g') => (&body[..body.len() - 1], 30),
        Some('t') => (&body[..body.len() - 1], 40),
        _ => (body, 0),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (examples: 4096, 64K, 32M, 1G)"))?;
    n.checked_mul(1 << shift)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| format!("`{s}` is too large"))
}

pub use iopath_bench::human;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("32M"), Ok(32 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("64kb"), Ok(64 << 10));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
