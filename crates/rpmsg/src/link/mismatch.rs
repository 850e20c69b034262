//! Sizes given on each side and negotiated by neither
//! ([`crate::Convention::Fixed`]): the remote sees what the driver was
//! given from its buffers and messages, and says so the first time they
//! disagree with its own, once per direction. Nothing on the wire says it
//! otherwise: a host given larger buffers would only see its pings go
//! unanswered.

use crate::bufsz::BufSizes;
use crate::wire::HDR_LEN;

/// What the remote was given, and which disagreements it has reported.
#[derive(Debug, Clone)]
pub(crate) struct SizeWatch {
    /// The remote's own sizes when fixed; `None`: negotiated, nothing to
    /// watch.
    fixed: Option<BufSizes>,
    /// Reported already: the driver's buffers, its messages.
    said: [bool; 2],
}

impl SizeWatch {
    /// Watches the driver against `fixed`, when the sizes are fixed.
    pub(crate) fn new(fixed: Option<BufSizes>) -> Self {
        SizeWatch {
            fixed,
            said: [false; 2],
        }
    }

    /// A buffer of `len` bytes the driver posted for messages to it; the
    /// message that says how it disagrees, the first time it does.
    pub(crate) fn driver_buffer(&mut self, len: u32) -> Option<String> {
        let own = self.fixed?.to_host;
        if len == own || self.said[0] {
            return None;
        }
        self.said[0] = true;
        let (what, then) = if len > own {
            (
                "larger",
                format!(
                    "messages of {} to {} bytes to the host are refused here",
                    own as usize - HDR_LEN + 1,
                    len as usize - HDR_LEN
                ),
            )
        } else {
            (
                "smaller",
                format!(
                    "messages over {} bytes to the host are refused",
                    (len as usize).saturating_sub(HDR_LEN)
                ),
            )
        };
        Some(format!(
            "buffer-size mismatch: the host posts {len}-byte buffers for messages to it, {what} than the {own} this remote was given; {then}. \
             --buf-size-convention fixed negotiates nothing: give the host and the remote the same sizes"
        ))
    }

    /// A message of `len` bytes (header included) the driver sent; the
    /// message that says it exceeds this side's buffers, the first time.
    pub(crate) fn driver_message(&mut self, len: usize) -> Option<String> {
        let own = self.fixed?.to_remote as usize;
        if len <= own || self.said[1] {
            return None;
        }
        self.said[1] = true;
        Some(format!(
            "buffer-size mismatch: the host sent a {len}-byte message, more than the {own}-byte buffers this remote was given for messages from it (read anyway); \
             --buf-size-convention fixed negotiates nothing: give the host and the remote the same sizes"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_each_disagreement_once() {
        let mut w = SizeWatch::new(Some(BufSizes::both(2048)));
        assert_eq!(w.driver_buffer(2048), None);
        let m = w.driver_buffer(4096).unwrap();
        assert!(m.contains("the host posts 4096-byte buffers"), "{m}");
        assert!(m.contains("larger than the 2048"), "{m}");
        assert!(m.contains("messages of 2033 to 4080 bytes"), "{m}");
        assert!(m.contains("--buf-size-convention fixed"), "{m}");
        assert_eq!(w.driver_buffer(4096), None);
        assert_eq!(w.driver_message(2048), None);
        let m = w.driver_message(4096).unwrap();
        assert!(
            m.contains("a 4096-byte message, more than the 2048-byte"),
            "{m}"
        );
        assert_eq!(w.driver_message(4096), None);

        let mut w = SizeWatch::new(Some(BufSizes::both(4096)));
        let m = w.driver_buffer(512).unwrap();
        assert!(m.contains("smaller than the 4096"), "{m}");
        assert!(m.contains("over 496 bytes"), "{m}");
        // Negotiated sizes: nothing to watch.
        let mut w = SizeWatch::new(None);
        assert_eq!(w.driver_buffer(4096), None);
        assert_eq!(w.driver_message(65536), None);
    }
}
