//! The create+destroy limits' far end and its client: a bare server that
//! answers each request packet with a packet of CREATE_EPT_FD answer size
//! and an fd, as the endpoint service does, with nothing else the service
//! does; what it passes is cued by the request's first byte ([`Pass`]).

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use iopath_rpmsg::ctrl::proto::{Request, O_CLOEXEC, O_RDWR};
use iopath_rpmsg::ctrl::EptInfo;
use rustix::event::epoll;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};

use super::{accept_one, Connected};
use crate::child::Server;
use crate::error::{check, check_failed};
use crate::{Error, Result};

/// What the raw fd server passes for a request, cued by the request's
/// first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Pass {
    /// Always the same eventfd (no cue: the request as it is, whose magic
    /// starts with neither cue).
    Eventfd = 0,
    /// One end of a fresh `SOCK_SEQPACKET` socketpair, the other end
    /// closed at once.
    Socket = b'S',
    /// One end of a fresh socketpair with the smallest send buffer, the
    /// other end watched with epoll until the client closes its own.
    Watched = b'W',
}

/// Watched sockets passed between two looks at their hang-ups: the
/// endpoint service looks once per drain of 16 requests too.
const WATCH_DRAIN: usize = 16;

/// The ends of the sockets passed with [`Pass::Watched`], in an epoll set
/// of their own, each closed once its client's end is (after the read
/// that finds the end of file): the kernel work the endpoint service
/// cannot skip per endpoint, without anything else the service does.
struct Watched {
    epoll: OwnedFd,
    ends: HashMap<u64, OwnedFd>,
    next_key: u64,
}

impl Watched {
    /// Watches `end` (its peer was just passed) as the service watches an
    /// endpoint's socket; every [`WATCH_DRAIN`] of them, closes the ends
    /// whose peer went.
    fn add(&mut self, end: OwnedFd) -> rustix::io::Result<()> {
        let key = self.next_key;
        self.next_key += 1;
        epoll::add(
            &self.epoll,
            &end,
            epoll::EventData::new_u64(key),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        )?;
        self.ends.insert(key, end);
        if self.next_key % WATCH_DRAIN as u64 == 0 {
            self.look()?;
        }
        Ok(())
    }

    /// Closes every end whose peer closed (without waiting).
    fn look(&mut self) -> rustix::io::Result<()> {
        let mut space = [MaybeUninit::<epoll::Event>::uninit(); 64];
        let zero = rustix::event::Timespec::default();
        let (events, _) = epoll::wait(&self.epoll, &mut space[..], Some(&zero))?;
        let mut b = [0u8; 512];
        for ev in events.iter() {
            let key = ev.data.u64();
            let Some(end) = self.ends.get(&key) else {
                continue;
            };
            match rustix::net::recv(end, &mut b, RecvFlags::DONTWAIT | RecvFlags::TRUNC) {
                Ok((_, 0)) => drop(self.ends.remove(&key)),
                Ok(_) | Err(rustix::io::Errno::AGAIN) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The limit's server (child [`Server::Fd`]): answers every packet on one
/// connection with a packet of CREATE_EPT_FD answer size and an fd, as
/// [`Pass`] says. Returns when the client hangs up.
pub(crate) fn serve(sock: &Path) -> Result<()> {
    let (c, io) = accept_one(sock)?;
    let ev = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).map_err(io)?;
    let mut watched = Watched {
        epoll: epoll::create(epoll::CreateFlags::CLOEXEC).map_err(io)?,
        ends: HashMap::new(),
        next_key: 0,
    };
    let answer = [0u8; 12 + 48];
    let mut req = [0u8; 128];
    loop {
        let (n, _) = rustix::net::recv(&c, &mut req, RecvFlags::empty()).map_err(io)?;
        if n == 0 {
            return Ok(());
        }
        let pass = match req[0] {
            b'S' => Pass::Socket,
            b'W' => Pass::Watched,
            _ => Pass::Eventfd,
        };
        // For a socket: a fresh pair, (the end kept, the end passed).
        let (unix, seqpacket) = (AddressFamily::UNIX, SocketType::SEQPACKET);
        let pair = (pass != Pass::Eventfd)
            .then(|| rustix::net::socketpair(unix, seqpacket, SocketFlags::CLOEXEC, None))
            .transpose()
            .map_err(io)?;
        let passed = [pair.as_ref().map_or(ev.as_fd(), |p| p.1.as_fd())];
        if pass == Pass::Watched {
            rustix::net::sockopt::set_socket_send_buffer_size(passed[0], 0).map_err(io)?;
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut anc = SendAncillaryBuffer::new(&mut space);
        anc.push(SendAncillaryMessage::ScmRights(&passed));
        rustix::net::sendmsg(&c, &[IoSlice::new(&answer)], &mut anc, SendFlags::NOSIGNAL)
            .map_err(io)?;
        if let (Pass::Watched, Some((ours, theirs))) = (pass, pair) {
            drop(theirs);
            watched.add(ours).map_err(io)?;
        }
    }
}

/// A raw fd server child (on `cpu`) and the connection to it.
#[derive(Debug)]
pub(crate) struct RawFdServer(Connected);

impl RawFdServer {
    /// Starts the server of the executable `exe` on `cpu` and connects.
    pub(crate) fn start(exe: &Path, cpu: Option<usize>) -> Result<RawFdServer> {
        Connected::server(exe, "iopath-bench-raw-", cpu, |sock| Server::Fd { sock })
            .map(RawFdServer)
    }

    /// The bench's CREATE_EPT_FD request, its first byte the cue of `pass`.
    pub(crate) fn request(pass: Pass) -> Result<Vec<u8>> {
        let req = Request::CreateEptFd(EptInfo::new("bench"), O_RDWR | O_CLOEXEC).encode();
        let mut req = req.ok_or_else(|| {
            Error::Check("the bench's CREATE_EPT_FD request does not encode".into())
        })?;
        if pass != Pass::Eventfd {
            req[0] = pass as u8;
        }
        Ok(req)
    }

    /// The client side of one cycle of the limit: sends `req` (of
    /// [`RawFdServer::request`]), receives the answer and its fd, closes it.
    pub(crate) fn cycle(&self, req: &[u8]) -> Result<()> {
        let (bytes, fds) = ask(&self.0.conn, req, &mut [0u8; 128])?;
        check!(
            bytes == 60 && fds.len() == 1,
            "the raw fd server answered {bytes} bytes and {} fds, not 60 and 1",
            fds.len()
        );
        Ok(())
    }
}

/// Sends `req` to the raw fd server on `c` and takes its answer into `b`:
/// the answer's length and the fds that rode along.
fn ask(c: &OwnedFd, req: &[u8], b: &mut [u8]) -> Result<(usize, Vec<OwnedFd>)> {
    rustix::net::send(c, req, SendFlags::NOSIGNAL)
        .map_err(Error::sys("sending to the raw fd server"))?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let iov = &mut [IoSliceMut::new(b)];
    let got = rustix::net::recvmsg(c, iov, &mut anc, RecvFlags::CMSG_CLOEXEC)
        .map_err(Error::sys("receiving from the raw fd server"))?;
    let rights = anc.drain().filter_map(|m| match m {
        RecvAncillaryMessage::ScmRights(r) => Some(r),
        _ => None,
    });
    Ok((got.bytes, rights.flatten().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One request with cue `cue` to the raw fd server on `c`: the fd.
    fn ask_for(c: &OwnedFd, cue: u8) -> OwnedFd {
        let mut req = [0u8; 56];
        req[0] = cue;
        let (bytes, mut fds) = ask(c, &req, &mut [0u8; 128]).unwrap();
        assert_eq!(bytes, 60);
        assert_eq!(fds.len(), 1);
        fds.pop().unwrap()
    }

    #[test]
    fn the_raw_fd_server_passes_what_each_cue_asks_for() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("sock");
        let s2 = sock.clone();
        let server = std::thread::spawn(move || serve(&s2));
        let c = super::super::connect_retry(&sock).expect("no raw fd server");
        let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
        // An eventfd: 8-byte counter writes.
        let ev = ask_for(&c, 0);
        assert_eq!(rustix::io::write(&ev, &1u64.to_ne_bytes()), Ok(8));
        // A fresh socket with the default send buffer: a 5000-byte packet
        // is not refused for its size (it goes, or finds the far end
        // closed already).
        let s = ask_for(&c, b'S');
        let sent = rustix::net::send(&s, &[5u8; 5000], flags);
        assert!(
            matches!(sent, Ok(5000) | Err(rustix::io::Errno::PIPE)),
            "{sent:?}"
        );
        // A watched socket: the far end is alive and reads nothing, the
        // send buffer is at the smallest, so the kernel refuses 5000 bytes
        // and takes 16.
        let mut watched = Vec::new();
        for _ in 0..2 * WATCH_DRAIN {
            let w = ask_for(&c, b'W');
            assert_eq!(
                rustix::net::send(&w, &[5u8; 5000], flags),
                Err(rustix::io::Errno::MSGSIZE)
            );
            assert_eq!(rustix::net::send(&w, &[1u8; 16], flags), Ok(16));
            watched.push(w);
        }
        // Closing them all and asking for more: the server closes its ends
        // of the closed ones as it goes, and keeps answering.
        drop(watched);
        for _ in 0..2 * WATCH_DRAIN {
            drop(ask_for(&c, b'W'));
        }
        drop(c);
        server.join().unwrap().unwrap();
    }
}
