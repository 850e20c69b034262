//! What the `rpmsg` subcommands share: argument parsers, and the bus's
//! counters as JSON.

use iopath_rpmsg::Stats;

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

pub(super) fn stats_json(s: &Stats) -> serde_json::Value {
    serde_json::json!({
        "rx_msgs": s.rx_msgs, "tx_msgs": s.tx_msgs, "rx_refused": s.rx_refused,
        "rx_malformed": s.rx_malformed, "rx_unknown_dst": s.rx_unknown_dst,
        "ns_create": s.ns_create, "ns_destroy": s.ns_destroy, "kicks": s.kicks,
        "tx_too_large": s.tx_too_large,
    })
}

/// Buffer sizes from `--buf-size` and its per-direction options (`tx` is
/// this side's sending direction, `rx` its receiving one), as
/// `(tx, rx)`; `None` when none was given.
///
/// # Errors
/// A usage error naming the option whose size is not 512 to 64K or not a
/// multiple of 4.
pub(super) fn buf_sizes(
    both: Option<u64>,
    tx: Option<u64>,
    rx: Option<u64>,
) -> anyhow::Result<Option<(u32, u32)>> {
    use iopath_rpmsg::bufsz::{MAX_BUF_SIZE, MIN_OFFER};
    if both.is_none() && tx.is_none() && rx.is_none() {
        return Ok(None);
    }
    let pick = |opt: &str, one: Option<u64>| -> anyhow::Result<u32> {
        let opt = if one.is_some() { opt } else { "--buf-size" };
        let v = one.or(both).unwrap_or(MIN_OFFER.into());
        u32::try_from(v)
            .ok()
            .filter(|v| (MIN_OFFER..=MAX_BUF_SIZE).contains(v) && v % 4 == 0)
            .ok_or_else(|| {
                crate::usage::usage(format!(
                    "{opt} {v}: a buffer is 512 to 65536 bytes (64K), a multiple of 4"
                ))
            })
    };
    Ok(Some((
        pick("--tx-buf-size", tx)?,
        pick("--rx-buf-size", rx)?,
    )))
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
