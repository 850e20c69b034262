//! The `--poll` echo's limit: the same three hops in the same places, with
//! no rpmsg in them.
//!
//! The polled echo goes client → (socket) → host → (shared memory) →
//! remote and back, all three polling; on two cores one shares a core, so
//! its floor is not the eventfd ping-pong's. Here a forwarder process
//! stands for the host (a `SOCK_SEQPACKET` connection to the client) and
//! an echo process for the remote (a flag word in a shared page), each
//! polling with the bus's [`PollSpin`], and nothing else.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use iopath_rpmsg::notify::PollSpin;
use iopath_rpmsg::SharedMem;
use rustix::net::{RecvFlags, SendFlags};

use super::{accept_one, Connected};
use crate::child::Server;
use crate::error::{check, check_failed};
use crate::{Error, Result};

/// The flag word's states: the forwarder asks, the echo answers.
const IDLE: u16 = 0;
const ASKED: u16 = 1;
const ANSWERED: u16 = 2;
/// How long any side waits for the next step before giving up.
const PATIENCE: Duration = Duration::from_secs(10);

/// Polls `ready` with `spin` until it says yes; `false` after [`PATIENCE`].
/// Idle for 2 ms (the other rows' turn), it naps between polls as the
/// polling bus does, so that it does not take the CPU from them.
fn poll_until(spin: &mut PollSpin, mut ready: impl FnMut() -> Result<bool>) -> Result<bool> {
    let start = Instant::now();
    let mut tries = 0u32;
    let mut napping = false;
    loop {
        if ready()? {
            spin.worked();
            return Ok(true);
        }
        tries = tries.wrapping_add(1);
        // The clock is read every 64 tries only: it costs as much as a try.
        if napping || tries % 64 == 0 {
            let idle = start.elapsed();
            if idle >= PATIENCE {
                return Ok(false);
            }
            napping = idle >= Duration::from_millis(2);
            if napping {
                std::thread::sleep((idle / 16).min(Duration::from_millis(1)));
                continue;
            }
        }
        spin.idle();
    }
}

fn flag(shm: &SharedMem) -> Result<u16> {
    shm.load_u16(0, Ordering::Acquire)
        .map_err(|e| Error::Check(format!("the poll floor's flag: {e}")))
}

fn set_flag(shm: &SharedMem, v: u16) -> Result<()> {
    shm.store_u16(0, v, Ordering::Release)
        .map_err(|e| Error::Check(format!("the poll floor's flag: {e}")))
}

/// Polls `c` with `spin` for a packet into `buf`: its length, `None`
/// after [`PATIENCE`]; `who` names the receiver in errors.
fn poll_recv(spin: &mut PollSpin, c: &OwnedFd, buf: &mut [u8], who: &str) -> Result<Option<usize>> {
    let mut n = None;
    poll_until(spin, || {
        n = match rustix::net::recv(c, &mut *buf, RecvFlags::DONTWAIT) {
            Ok((0, _)) => check_failed!("{who}: the other end hung up"),
            Ok((got, _)) => Some(got),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => None,
            Err(e) => return Err(Error::sys("recv on the poll floor's socket")(e)),
        };
        Ok(n.is_some())
    })?;
    Ok(n)
}

/// The host's stand-in (child [`Server::PollForward`]): takes each packet
/// from the one client on `sock`, raises the flag in `shm`, waits for the
/// echo's answer and sends the packet back; `count` times.
pub(crate) fn forward(sock: &Path, shm: &Path, count: u64) -> Result<()> {
    let shm = SharedMem::open(shm)
        .map_err(|e| Error::Check(format!("the poll floor's page {}: {e}", shm.display())))?;
    let (c, io) = accept_one(sock)?;
    let mut spin = PollSpin::new();
    let mut buf = [0u8; 512];
    for i in 0..count {
        let Some(n) = poll_recv(&mut spin, &c, &mut buf, "forwarder")? else {
            check_failed!("the poll floor's forwarder got no packet {i} in 10 s");
        };
        set_flag(&shm, ASKED)?;
        if !poll_until(&mut spin, || Ok(flag(&shm)? == ANSWERED))? {
            check_failed!("the poll floor's echo never answered {i}");
        }
        set_flag(&shm, IDLE)?;
        rustix::net::send(&c, &buf[..n], SendFlags::NOSIGNAL).map_err(io)?;
    }
    Ok(())
}

/// The remote's stand-in (child [`Server::PollEcho`]): answers each
/// raised flag in `shm`, `count` times.
pub(crate) fn echo(shm: &Path, count: u64) -> Result<()> {
    let shm = SharedMem::open(shm)
        .map_err(|e| Error::Check(format!("the poll floor's page {}: {e}", shm.display())))?;
    let mut spin = PollSpin::new();
    for i in 0..count {
        if !poll_until(&mut spin, || Ok(flag(&shm)? == ASKED))? {
            check_failed!("the poll floor's echo was asked nothing ({i}) in 10 s");
        }
        set_flag(&shm, ANSWERED)?;
    }
    Ok(())
}

/// The floor running: its two processes and the client's connection.
#[derive(Debug)]
pub(crate) struct RawPollPath(Connected);

impl RawPollPath {
    /// The forwarder on `forward_cpu` and the echo on `echo_cpu` (children
    /// of the executable `iopath`), good for `count` round trips.
    pub(crate) fn start(
        iopath: &Path,
        count: u64,
        forward_cpu: Option<usize>,
        echo_cpu: Option<usize>,
    ) -> Result<RawPollPath> {
        let parent = crate::rpmsg::shm_dir();
        let c = Connected::start("iopath-bench-pollfloor-", &parent, |dir, sock| {
            let shm = dir.join("page");
            let f = std::fs::File::create(&shm).map_err(Error::io(&shm))?;
            f.set_len(rustix::param::page_size() as u64)
                .map_err(Error::io(&shm))?;
            let child = |name, cpu, server: Server| {
                crate::place::spawn(
                    name,
                    None,
                    cpu,
                    server.command(iopath).stdout(Stdio::null()),
                )
            };
            let page = shm.clone();
            let echo = Server::PollEcho { shm: page, count };
            let forward = Server::PollForward { sock, shm, count };
            Ok(vec![
                child("the poll floor's echo", echo_cpu, echo)?,
                child("the poll floor's forwarder", forward_cpu, forward)?,
            ])
        })?;
        Ok(RawPollPath(c))
    }

    /// `count` round trips of a 16-byte packet, busy-polled; latencies
    /// appended to `lat`; the time taken.
    pub(crate) fn round_trips(&self, count: u64, lat: &mut Vec<f64>) -> Result<Duration> {
        let mut back = [0u8; 512];
        let t0 = Instant::now();
        for seq in 0..count {
            let msg = u128::from(seq).to_le_bytes();
            let t = Instant::now();
            rustix::net::send(&self.0.conn, &msg, SendFlags::NOSIGNAL)
                .map_err(Error::sys("send on the poll floor's socket"))?;
            let mut spin = PollSpin::new();
            let Some(n) = poll_recv(&mut spin, &self.0.conn, &mut back, "poll floor client")?
            else {
                check_failed!("the poll floor answered nothing in 10 s");
            };
            lat.push(t.elapsed().as_secs_f64() * 1e6);
            check!(
                n == 16 && back[..16] == msg,
                "the poll floor's answer {seq} came back wrong"
            );
        }
        Ok(t0.elapsed())
    }
}
