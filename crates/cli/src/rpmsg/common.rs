//! What the `rpmsg` subcommands share: argument parsers, the buffer-size
//! options, and the stop on a signal.

use anyhow::Context;
use iopath_rpmsg::tools::session::Cleanup;
use iopath_rpmsg::{BufSizes, Convention, Role};

/// Checks an endpoint or channel name as rpmsg's 32-byte name field holds
/// it (with its terminating NUL).
pub(super) fn parse_name(s: &str) -> Result<String, String> {
    iopath_rpmsg::wire::check_name(s).map_err(|_| {
        format!(
            "{} bytes: a name is 1 to 31 bytes with no NUL (rpmsg's name field is 32 bytes, terminator included)",
            s.len()
        )
    })?;
    Ok(s.to_owned())
}

/// Parses an octal file mode: 600, 0660 (`blk serve --socket-mode` too).
pub(crate) fn parse_mode(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(format!("not an octal mode: {s:?} (try 600 or 660)")),
    }
}

/// The buffer sizes of `host` and `remote`, and how they are agreed.
#[derive(Debug, clap::Args)]
pub(super) struct BufSizeArgs {
    /// Buffers of SIZE bytes both ways, header included (512 to 64K, a
    /// multiple of 4). A remote offers them (with --create in the table,
    /// with --vhost-user in its features and config space) as
    /// --buf-size-convention says, and a host that takes the offer uses
    /// them; without them nothing is offered: 512 bytes. A host is given
    /// sizes of its own with --buf-size-convention fixed only.
    #[arg(long, value_parser = iopath_sys::parse_size::<u64>, value_name = "SIZE")]
    pub buf_size: Option<u64>,
    /// SIZE-byte buffers for the messages this side sends (overrides
    /// --buf-size that way).
    #[arg(long, value_parser = iopath_sys::parse_size::<u64>, value_name = "SIZE")]
    pub tx_buf_size: Option<u64>,
    /// SIZE-byte buffers for the messages this side receives (overrides
    /// --buf-size that way).
    #[arg(long, value_parser = iopath_sys::parse_size::<u64>, value_name = "SIZE")]
    pub rx_buf_size: Option<u64>,
    /// How the sizes are offered and read: linux (feature bit 1 and the
    /// 13-byte versioned config Linux's virtio_rpmsg_bus reads), nuttx
    /// (bit 2, the sizes first in the config, as NuttX's OpenAMP reads
    /// them; a host never takes bit 1, NuttX's ACK, then) or fixed (no
    /// bit, no config: each side uses the sizes it is given, 512 without
    /// --buf-size, and both must be given the same, as upstream
    /// OpenAMP's RPMSG_BUFFER_SIZE).
    #[arg(long, default_value = "linux", value_name = "CONVENTION")]
    pub buf_size_convention: Convention,
}

impl BufSizeArgs {
    /// Whether any of the three was given.
    pub fn given(&self) -> bool {
        self.buf_size.is_some() || self.tx_buf_size.is_some() || self.rx_buf_size.is_some()
    }

    /// The sizes given, this side (`role`) sending with the tx size;
    /// `None` when none was given.
    ///
    /// # Errors
    /// A usage error naming the option whose size is not 512 to 64K or
    /// not a multiple of 4.
    pub fn sizes(&self, role: Role) -> anyhow::Result<Option<BufSizes>> {
        use iopath_rpmsg::bufsz::{MAX_BUF_SIZE, MIN_OFFER};
        if !self.given() {
            return Ok(None);
        }
        let pick = |opt: &str, one: Option<u64>| -> anyhow::Result<u32> {
            let opt = if one.is_some() { opt } else { "--buf-size" };
            let v = one.or(self.buf_size).unwrap_or(MIN_OFFER.into());
            u32::try_from(v)
                .ok()
                .filter(|v| (MIN_OFFER..=MAX_BUF_SIZE).contains(v) && v % 4 == 0)
                .ok_or_else(|| {
                    crate::usage::usage(format!(
                        "{opt} {v}: a buffer is 512 to 65536 bytes (64K), a multiple of 4"
                    ))
                })
        };
        let tx = pick("--tx-buf-size", self.tx_buf_size)?;
        let rx = pick("--rx-buf-size", self.rx_buf_size)?;
        Ok(Some(match role {
            Role::Host => BufSizes {
                to_remote: tx,
                to_host: rx,
            },
            Role::Remote => BufSizes {
                to_host: tx,
                to_remote: rx,
            },
        }))
    }
}

/// `e` after what it came from (an option and its value, or a step).
pub(super) fn at<E>(e: E, what: impl std::fmt::Display + Send + Sync + 'static) -> anyhow::Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    anyhow::Error::new(e).context(what)
}

/// Runs `serve` with a stop on SIGINT/SIGTERM (`ROLE: stopped by signal
/// N`, exit 0) installed before any thread starts, then cleans up.
pub(super) fn until_stopped(
    role: &'static str,
    serve: impl FnOnce(&Cleanup) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let stop = Cleanup::on_stop_signals(move |sig| eprintln!("{role}: stopped by signal {sig}"))
        .context("cannot install the SIGINT/SIGTERM handling")?;
    let r = serve(&stop);
    stop.run();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_checked() {
        assert_eq!(parse_name("echo").as_deref(), Ok("echo"));
        assert!(parse_name(&"x".repeat(31)).is_ok());
        let e = parse_name(&"x".repeat(40)).unwrap_err();
        assert!(e.starts_with("40 bytes: a name is 1 to 31 bytes"), "{e}");
        assert!(parse_name("").is_err());
    }
}
