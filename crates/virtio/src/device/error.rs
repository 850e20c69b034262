//! How the vhost-user server drops a front end: the errors of the
//! connection loop and of the messages it takes off the socket itself.

use std::io;

use vhost::vhost_user::Error as VhostError;

use crate::vhost_wire::VhostUserWireError;

/// Errors of the vhost-user server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Accepting a connection failed.
    #[error("Accepting a vhost-user connection failed")]
    Accept(#[source] io::Error),
    /// Reading or writing the connection failed.
    #[error("vhost-user socket I/O failed")]
    Socket(#[source] io::Error),
    /// The front end started a message and did not finish it in time;
    /// the connection was closed so that the next front end is served.
    #[error("The front end sent {got} of a message's {need} header bytes and then nothing for {} s, connection closed", .timeout.as_secs())]
    Stalled {
        /// Header bytes received.
        got: usize,
        /// Header bytes needed.
        need: usize,
        /// How long it was given.
        timeout: std::time::Duration,
    },
    /// The front end broke the protocol; the connection was closed.
    #[error("vhost-user protocol error, connection closed")]
    Protocol(#[source] VhostError),
    /// A front end of another user on a private socket; it was hung up.
    #[error("Refused a front end of another user ({peer}): the socket is private (mode {mode:o})")]
    PeerRefused {
        /// Its credentials.
        peer: String,
        /// The socket's mode.
        mode: u32,
    },
    /// A malformed `IOTLB_MSG`.
    #[error("Malformed IOTLB_MSG with {len} payload bytes, connection closed")]
    MalformedIotlb {
        /// Request code.
        request: u32,
        /// Payload length announced in the header.
        len: u32,
    },
    /// A malformed message taken before the `vhost` crate sees it
    /// (`SET_BACKEND_REQ_FD` without exactly one unix stream socket, or
    /// before `BACKEND_REQ` was negotiated; `SET_MEM_TABLE` with other than
    /// one fd per region).
    #[error("Malformed vhost-user request {request} ({len} payload bytes), connection closed")]
    MalformedMessage {
        /// Request code.
        request: u32,
        /// Payload length announced in the header.
        len: u32,
    },
    /// A message whose framing or payload the wire codec refused.
    #[error("Malformed vhost-user message, connection closed")]
    Wire(#[source] VhostUserWireError),
}
