//! The scale experiments' measurements: endpoints echoing at once, a
//! one-way stream, many endpoints created and held.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_RDWR};
use iopath_rpmsg::ctrl::{CtrlClient, EptFd, EptInfo};
use iopath_rpmsg::tools::SINK_SYNC;
use rustix::net::{RecvFlags, SendFlags};

use super::{CreateRow, EchoRow};
use crate::error::{check, check_failed, invalid};
use crate::rpmsg::children::{bound, Servers};
use crate::rpmsg::raw::sink::RawSink;
use crate::{percentile, Error, Result};

/// One endpoint's share of an echo run.
#[derive(Debug, Clone, Copy)]
pub(super) struct PerEpt {
    round_trips: u64,
    p99_us: f64,
}

/// `n` endpoints echoing at once from `n` threads for `time`.
pub(super) fn echo_run(c: &CtrlClient, n: usize, time: Duration) -> Result<(f64, Vec<PerEpt>)> {
    let eps = (0..n)
        .map(|_| bound(c, "echo"))
        .collect::<Result<Vec<_>>>()?;
    let go = Barrier::new(n + 1);
    let deadline = AtomicU64::new(0);
    let t0 = Instant::now();
    let per = std::thread::scope(|s| -> Result<Vec<PerEpt>> {
        let mut handles = Vec::with_capacity(n);
        for (i, ep) in eps.iter().enumerate() {
            let (go, deadline) = (&go, &deadline);
            let h = std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn_scoped(s, move || -> Result<PerEpt> {
                    let mut lat = Vec::with_capacity(1 << 14);
                    let mut back = [0u8; 512];
                    go.wait();
                    let end = t0 + Duration::from_nanos(deadline.load(Ordering::SeqCst));
                    let mut seq = 0u64;
                    loop {
                        let t = Instant::now();
                        if t >= end {
                            break;
                        }
                        seq += 1;
                        let mut msg = [0u8; 16];
                        msg[..8].copy_from_slice(&(i as u64).to_le_bytes());
                        msg[8..].copy_from_slice(&seq.to_le_bytes());
                        ep.send(&msg).map_err(Error::layer("sending an echo"))?;
                        let got = ep
                            .recv_timeout(&mut back, Duration::from_secs(10))
                            .map_err(Error::layer("receiving an echo"))?
                            .ok_or_else(|| {
                                Error::Check(format!("endpoint {i}: no echo {seq} in 10 s"))
                            })?;
                        check!(
                            got == 16 && back[..16] == msg,
                            "endpoint {i}: echo {seq} came back wrong"
                        );
                        lat.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    lat.sort_by(f64::total_cmp);
                    Ok(PerEpt {
                        round_trips: lat.len() as u64,
                        p99_us: percentile(&lat, 0.99),
                    })
                })
                .map_err(Error::sys("spawning an echo thread"))?;
            handles.push(h);
        }
        // Every thread made and parked before the clock starts.
        deadline.store(
            (t0.elapsed() + Duration::from_millis(20) + time).as_nanos() as u64,
            Ordering::SeqCst,
        );
        go.wait();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Check("an echo thread panicked".into())))
            })
            .collect()
    })?;
    let total: u64 = per.iter().map(|p| p.round_trips).sum();
    Ok((total as f64 / time.as_secs_f64(), per))
}

/// Sends `msgs` payloads of `size` bytes on `send`, then [`SINK_SYNC`], and
/// waits for the count with `recv`; returns the time taken and the count.
fn stream(
    msgs: u64,
    size: usize,
    mut send: impl FnMut(&[u8]) -> Result<()>,
    mut recv: impl FnMut(&mut [u8]) -> Result<usize>,
) -> Result<(Duration, u64)> {
    let payload = vec![0x5Au8; size];
    let mut answer = [0u8; 64];
    let t0 = Instant::now();
    for _ in 0..msgs {
        send(&payload)?;
    }
    send(SINK_SYNC)?;
    let n = recv(&mut answer)?;
    let took = t0.elapsed();
    check!(n == 8, "the sink answered {n} bytes, not 8");
    let mut c = [0u8; 8];
    c.copy_from_slice(&answer[..8]);
    Ok((took, u64::from_le_bytes(c)))
}

/// `msgs` payloads of `size` bytes through the endpoint `sink` to the
/// remote's sink, then its count ([`stream`]).
pub(crate) fn stream_ept(sink: &EptFd, msgs: u64, size: usize) -> Result<(Duration, u64)> {
    stream(
        msgs,
        size,
        |m| sink.send(m).map_err(Error::layer("streaming to the sink")),
        |b| {
            sink.recv_timeout(b, Duration::from_secs(60))
                .map_err(Error::layer("waiting for the sink's count"))?
                .ok_or_else(|| Error::Check("no answer from the sink in 60 s".into()))
        },
    )
}

/// The same through the bare socket to the raw sink `raw`.
pub(crate) fn stream_raw(raw: &RawSink, msgs: u64, size: usize) -> Result<(Duration, u64)> {
    stream(
        msgs,
        size,
        |m| {
            rustix::net::send(raw.conn(), m, SendFlags::NOSIGNAL)
                .map(drop)
                .map_err(Error::sys("streaming to the raw sink"))
        },
        |b| {
            rustix::net::recv(raw.conn(), b, RecvFlags::empty())
                .map(|(n, _)| n)
                .map_err(Error::sys("waiting for the raw sink's count"))
        },
    )
}

impl EchoRow {
    /// Adds a run's figures: its aggregate rate `agg` and each endpoint's
    /// share `per`.
    pub(super) fn add(&mut self, agg: f64, per: &[PerEpt]) {
        let mut p99: Vec<f64> = per.iter().map(|p| p.p99_us).collect();
        p99.sort_by(f64::total_cmp);
        let mut rts: Vec<f64> = per.iter().map(|p| p.round_trips as f64).collect();
        rts.sort_by(f64::total_cmp);
        self.aggregate.push(agg);
        self.p99_median.push(percentile(&p99, 0.5));
        self.p99_max.push(p99.last().copied().unwrap_or(0.0));
        self.fewest_share
            .push(rts[0] / percentile(&rts, 0.5).max(1.0));
    }
}

/// The resident memory of process `pid`, KiB.
fn rss_kib(pid: u32) -> Result<u64> {
    let p = format!("/proc/{pid}/status");
    let s = std::fs::read_to_string(&p).map_err(Error::io(&p))?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| Error::Check(format!("no VmRSS in {p}")))
}

pub(super) fn create_many(srv: &Servers, c: &CtrlClient, n: usize) -> Result<CreateRow> {
    let limit = iopath_sys::raise_fd_limit(Some(n as u64 + 256));
    if limit < n as u64 + 64 {
        invalid!(
            "--scale",
            "{n} endpoints need {} open files; the limit here is {limit}",
            n + 64
        );
    }
    let base = c.stats().map_err(Error::layer("STATS"))?.endpoints();
    let before = rss_kib(srv.host_pid())?;
    let info = EptInfo::new("bench");
    let mut held = Vec::with_capacity(n);
    let mut per_thousand_us = Vec::new();
    let t0 = Instant::now();
    let mut tk = Instant::now();
    for i in 0..n {
        held.push(
            c.create_ept_fd(&info, O_RDWR | O_CLOEXEC)
                .map_err(Error::layer(format!("CREATE_EPT_FD number {}", i + 1)))?,
        );
        if (i + 1) % 1000 == 0 {
            per_thousand_us.push(tk.elapsed().as_secs_f64() * 1e6 / 1000.0);
            tk = Instant::now();
        }
    }
    let create_s = t0.elapsed().as_secs_f64();
    let st = c.stats().map_err(Error::layer("STATS"))?;
    check!(
        u64::from(st.endpoints()) == u64::from(base) + n as u64,
        "the service holds {} endpoints, not {}",
        st.endpoints(),
        u64::from(base) + n as u64
    );
    let full = rss_kib(srv.host_pid())?;
    let t1 = Instant::now();
    drop(held);
    while c.stats().map_err(Error::layer("STATS"))?.endpoints() > base {
        check!(
            t1.elapsed() < Duration::from_secs(60),
            "the service did not free {n} closed endpoints in 60 s"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    let destroy_s = t1.elapsed().as_secs_f64();
    Ok(CreateRow {
        endpoints: n,
        per_thousand_us,
        create_s,
        destroy_s,
        rss_kib: [before, full, rss_kib(srv.host_pid())?],
    })
}
