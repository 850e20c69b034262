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
