//! One-way streams to a sink that counts what it gets: the remote's sink
//! through an endpoint fd, and the limit, a bare `SOCK_SEQPACKET` socket
//! to another process (the raw sink).

use std::path::Path;
use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::EptFd;
use iopath_rpmsg::tools::SINK_SYNC;
use rustix::net::{RecvFlags, SendFlags};

use super::{accept_one, Connected};
use crate::child::Server;
use crate::error::{check, check_failed};
use crate::{Error, Result};

/// The raw sink (child [`Server::Sink`]): counts and drops the packets of
/// one connection on the `SOCK_SEQPACKET` socket `sock`, answering
/// [`SINK_SYNC`] with the count so far (u64, little-endian). Returns when
/// the client hangs up.
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

/// The two sinks a stream goes to, and how many messages each has been
/// sent.
#[derive(Debug)]
pub(crate) struct Sinks {
    ept: EptFd,
    raw: Connected,
    sent: [u64; 2],
}

impl Sinks {
    /// The remote's sink behind `ept`, and a raw sink of the executable
    /// `exe` started on `cpu`.
    pub(crate) fn start(ept: EptFd, exe: &Path, cpu: Option<usize>) -> Result<Sinks> {
        let raw = Connected::server(exe, "iopath-bench-sink-", cpu, |sock| Server::Sink { sock })?;
        Ok(Sinks {
            ept,
            raw,
            sent: [0; 2],
        })
    }

    /// Sends `msgs` payloads of `size` bytes to the raw sink (`raw`) or the
    /// remote's, then [`SINK_SYNC`], and waits for its count: the time
    /// taken, once the count shows that no message was lost.
    pub(crate) fn stream(&mut self, raw: bool, msgs: u64, size: usize) -> Result<Duration> {
        let payload = vec![0x5Au8; size];
        let mut answer = [0u8; 64];
        let (conn, ept) = (&self.raw.conn, &self.ept);
        let send = |m: &[u8]| match raw {
            true => rustix::net::send(conn, m, SendFlags::NOSIGNAL)
                .map(drop)
                .map_err(Error::sys("streaming to the raw sink")),
            false => ept.send(m).map_err(Error::layer("streaming to the sink")),
        };
        let t0 = Instant::now();
        for _ in 0..msgs {
            send(&payload)?;
        }
        send(SINK_SYNC)?;
        let n = match raw {
            true => rustix::net::recv(conn, &mut answer, RecvFlags::empty())
                .map(|(n, _)| n)
                .map_err(Error::sys("waiting for the raw sink's count"))?,
            false => ept
                .recv_timeout(&mut answer, Duration::from_secs(60))
                .map_err(Error::layer("waiting for the sink's count"))?
                .ok_or_else(|| Error::Check("no answer from the sink in 60 s".into()))?,
        };
        let took = t0.elapsed();
        check!(n == 8, "the sink answered {n} bytes, not 8");
        let count = u64::from_le_bytes(answer[..8].try_into().expect("8 bytes"));
        let sent = &mut self.sent[usize::from(raw)];
        *sent += msgs + 1;
        let name = if raw { "raw" } else { "remote" };
        check!(
            count == *sent,
            "the {name} sink counted {count} messages, not {sent}: messages were lost"
        );
        Ok(took)
    }
}
