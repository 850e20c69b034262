//! The one-way stream's limit: a bare `SOCK_SEQPACKET` socket to another
//! process that counts and drops what it gets.

use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::net::{RecvFlags, SendFlags};

use super::{accept_one, Connected};
use crate::child::Server;
use crate::Result;
use iopath_rpmsg::tools::SINK_SYNC;

/// The stream limit's far end (child [`Server::Sink`]): counts and drops
/// the packets of one connection on the `SOCK_SEQPACKET` socket `sock`,
/// answering [`SINK_SYNC`] with the count so far (u64, little-endian).
/// Returns when the client hangs up.
///
/// # Errors
/// [`crate::Error::Io`] (the socket) when a socket call fails.
pub(crate) fn serve(sock: &Path) -> Result<()> {
    let (c, io) = accept_one(sock)?;
    // Room for the largest rpmsg payload: every message is copied out
    // whole, as the endpoint service copies what it reads.
    let mut buf = vec![0u8; 64 * 1024];
    let mut count = 0u64;
    loop {
        let (n, _) = rustix::net::recv(&c, &mut buf, RecvFlags::empty()).map_err(io)?;
        if n == 0 {
            return Ok(());
        }
        count += 1;
        if buf[..n] == SINK_SYNC[..] {
            rustix::net::send(&c, &count.to_le_bytes(), SendFlags::NOSIGNAL).map_err(io)?;
        }
    }
}

/// A raw sink child and the connection to it.
#[derive(Debug)]
pub(crate) struct RawSink(Connected);

impl RawSink {
    /// Starts the sink of the executable `exe` on `cpu` and connects.
    ///
    /// # Errors
    /// When the child cannot be started or does not listen within 10 s.
    pub(crate) fn start(exe: &Path, cpu: Option<usize>) -> Result<RawSink> {
        Connected::start(exe, "iopath-bench-sink-", cpu, |sock| Server::Sink { sock }).map(RawSink)
    }

    /// The connection to send the stream on.
    pub(crate) fn conn(&self) -> &OwnedFd {
        &self.0.conn
    }
}
