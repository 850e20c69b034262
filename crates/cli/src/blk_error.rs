//! The errors of `iopath blk dd` in the command line's terms: the option
//! at fault and what it accepts, a hint where the back end is busy.

use anyhow::anyhow;
use iopath_blk::dd::DdError;
use iopath_blk::workload::WorkloadError;
use iopath_virtio::transport::vhost_user::VhostUserError;

use crate::usage::usage;

/// The dd's error in the command line's terms: the option at fault.
pub fn explain(e: DdError) -> anyhow::Error {
    match e {
        DdError::Workload(e) => explain_workload(e),
        DdError::NotASocket { socket, what } => usage(format!(
            "--socket {}: not a socket ({what}); give the socket `iopath blk serve --socket` made",
            socket.display()
        )),
        DdError::Connect { socket, source } => {
            let hint = if matches!(source, VhostUserError::Timeout { .. }) {
                " (is it serving another front end? --timeout sets the wait)"
            } else {
                ""
            };
            anyhow::Error::new(source).context(format!(
                "cannot reach the back end at {}{hint}",
                socket.display()
            ))
        }
        DdError::Init(source) => {
            anyhow::Error::new(source).context("cannot initialise the virtio-blk device")
        }
    }
}

/// The workload's error in the command line's terms.
fn explain_workload(e: WorkloadError) -> anyhow::Error {
    match e {
        WorkloadError::Invalid {
            field,
            value,
            accepted,
        } => usage(format!(
            "--{} {value} is not accepted: it must be {accepted}",
            field.replace('_', "-")
        )),
        WorkloadError::Overflow { what, limit } => {
            // "offset + bs x count" -> "--offset + --bs x --count".
            let options: Vec<String> = what
                .split(' ')
                .map(|t| match t {
                    "x" | "+" => t.to_string(),
                    field => format!("--{}", field.replace('_', "-")),
                })
                .collect();
            usage(format!(
                "{} overflows: it must be at most {limit}",
                options.join(" ")
            ))
        }
        WorkloadError::DepthBelowQueues {
            queue_depth,
            queues,
        } => usage(format!(
            "--queue-depth ({queue_depth}) must be at least --queues ({queues}): each queue needs a block in flight"
        )),
        WorkloadError::PastEnd { end, capacity } => anyhow!(
            "--offset + --bs x --count = {end} bytes is past the device's end ({capacity} bytes)"
        ),
        WorkloadError::Mismatch { offset, pattern } => anyhow!(
            "verify failed: the device's byte {offset} differs from the {pattern:?} pattern"
        ),
        other => anyhow::Error::new(other),
    }
}
