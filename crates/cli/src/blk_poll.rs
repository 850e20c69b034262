//! `--poll-us` and `--poll`, shared by `iopath blk serve` and `iopath blk
//! dd`: how a queue waits for the other side.

use iopath_virtio::poll::{PollMode, DEFAULT_WINDOW_US, MAX_WINDOW_US};

/// How a queue waits for the other side of the ring.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct PollArgs {
    /// After work, poll the ring up to US microseconds before re-enabling
    /// notifications and sleeping (0: sleep at once; 0 to 100000). The
    /// default, 50, covers one 4 KiB round trip with the other side on
    /// another CPU (10 to 30 us measured), so a request that follows
    /// another closely costs no wake-up; an idle queue stops spinning
    /// after 50 us.
    #[arg(long, value_name = "US", value_parser = parse_poll_us, conflicts_with = "poll")]
    pub poll_us: Option<u64>,
    /// Poll the ring and never sleep: one CPU spins per queue, for a CPU
    /// given to it. The poller still yields the CPU to a peer that needs
    /// it, and when the other side may run only on this side's one CPU
    /// (both pinned to it), it hands the CPU over and sleeps rather than
    /// spin.
    #[arg(long)]
    pub poll: bool,
}

impl PollArgs {
    /// The mode these options give.
    pub fn mode(&self) -> PollMode {
        if self.poll {
            return PollMode::Busy;
        }
        PollMode::from_us(self.poll_us.unwrap_or(DEFAULT_WINDOW_US)).expect("checked by the parser")
    }
}

/// `--poll-us`: whole microseconds, 0 to [`MAX_WINDOW_US`].
fn parse_poll_us(s: &str) -> Result<u64, String> {
    let us: u64 = s.parse().map_err(|_| {
        format!("{s:?} is not a whole number of microseconds (0 to {MAX_WINDOW_US})")
    })?;
    PollMode::from_us(us)
        .map_err(|e| format!("{} us is out of range (0 to {} us)", e.us, e.max))?;
    Ok(us)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_parsed_and_bounded() {
        assert_eq!(parse_poll_us("0"), Ok(0));
        assert_eq!(parse_poll_us("100000"), Ok(100_000));
        assert_eq!(
            parse_poll_us("100001").unwrap_err(),
            "100001 us is out of range (0 to 100000 us)"
        );
        assert!(parse_poll_us("-1").unwrap_err().contains("0 to 100000"));
        assert!(parse_poll_us("5us").is_err());
        let a = PollArgs {
            poll_us: None,
            poll: false,
        };
        assert_eq!(a.mode(), PollMode::default());
        let a = PollArgs {
            poll_us: Some(0),
            poll: false,
        };
        assert_eq!(a.mode(), PollMode::SLEEP);
        let a = PollArgs {
            poll_us: None,
            poll: true,
        };
        assert_eq!(a.mode(), PollMode::Busy);
    }
}
