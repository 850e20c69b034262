//! Usage errors found after clap has parsed the command line (options that
//! conflict, values the library refuses): they exit with status 2, as
//! clap's own usage errors do, and other failures with 1.

use std::fmt;

/// An error in how the command was called; its message names the option.
#[derive(Debug)]
pub struct Usage(pub String);

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// A usage error with this message, as an [`anyhow::Error`].
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Usage(msg.into()))
}

/// Whether `e` (or one of its causes) is a usage error.
pub fn is_usage(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<Usage>())
}

/// A count that must be at least 1, as a clap value parser: `0` is refused
/// as "at least 1", not as a range whose end is the type's largest value.
pub fn at_least_one<T>(s: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + From<u8>,
{
    match s.trim().parse::<T>() {
        Ok(n) if n >= T::from(1) => Ok(n),
        Ok(_) => Err("must be at least 1".into()),
        Err(_) => Err(format!("`{s}` is not a whole number (at least 1)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_start_at_one() {
        assert_eq!(at_least_one::<u64>("5"), Ok(5));
        assert_eq!(
            at_least_one::<u64>("0"),
            Err("must be at least 1".to_string())
        );
        assert_eq!(
            at_least_one::<u32>("-1"),
            Err("`-1` is not a whole number (at least 1)".to_string())
        );
    }
}
