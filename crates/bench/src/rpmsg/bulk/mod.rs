//! `iopath bench rpmsg` bulk rows: one-way streams of large messages over
//! buffers negotiated at 64 KiB, beside what the machine does with the
//! same bytes in the same run.
//!
//! ```text
//!  endpoint fd  client ─► host's endpoint service ─► vrings ─► remote
//!               "sink" (another process), then SYNC for its count
//!  Bus API      a host Bus in this process: TxBuffer built in place ─►
//!               vrings ─► a remote Bus in this process, ZeroCopyEndpoint:
//!               each message read out of its shared buffer once
//!  limit        the same messages over a bare SOCK_SEQPACKET socket to a
//!               process that reads each whole (the fd row's limit)
//!  memcpy       one thread copying the same bytes in message-sized
//!               pieces into a ring-sized area (the Bus row's limit)
//! ```
//!
//! Host and remote, the raw sink and the in-process remote run where the
//! placement puts the servers, the clients where it puts the client.

mod measure;
mod report;

use std::path::PathBuf;

use crate::error::invalid;
use crate::place::{on_cpu, Cpus, Placement};
use crate::rpmsg::children::{bound, Servers, Setup};
use crate::rpmsg::raw::sink::RawSink;
use crate::rpmsg::scale::measure::{stream_ept, stream_raw};
use crate::Result;

pub use report::BulkReport;

/// Buffer size both ways: the largest rpmsg can have.
const BUF: u32 = 64 * 1024;
/// Entries per vring.
const RING: u32 = 64;

/// What the bulk rows measure.
#[derive(Debug, Clone)]
pub struct BulkConfig {
    /// Message sizes, one row each.
    pub sizes: Vec<usize>,
    /// Bytes each way streams per row per run.
    pub bytes: u64,
    /// Runs per row (median and spread reported).
    pub runs: usize,
    /// Where the processes and threads run.
    pub placement: Placement,
    /// The `iopath` executable (host, remote, raw sink).
    pub iopath: PathBuf,
}

impl BulkConfig {
    /// Messages of 496 bytes, 2 KiB, 4 KiB and 65520 bytes (a 64 KiB
    /// buffer's payload), 32 MiB per row per run, 3 runs, client and
    /// servers on different CPUs.
    pub fn new(iopath: PathBuf) -> BulkConfig {
        BulkConfig {
            sizes: vec![496, 2048, 4096, 65520],
            bytes: 32 << 20,
            runs: 3,
            placement: Placement::Split,
            iopath,
        }
    }
}

/// One message size over every run: MB/s per run of each way.
#[derive(Debug, Clone)]
pub(crate) struct BulkRow {
    pub(crate) size: usize,
    pub(crate) msgs: u64,
    pub(crate) fd: Vec<f64>,
    pub(crate) raw: Vec<f64>,
    pub(crate) bus: Vec<f64>,
    pub(crate) memcpy: Vec<f64>,
}

/// Runs the bulk rows.
///
/// # Errors
/// [`crate::Error::Invalid`] for bad settings; when a child cannot start
/// or a stream loses or garbles a message.
pub fn run(cfg: &BulkConfig) -> Result<BulkReport> {
    if cfg.runs == 0 {
        invalid!("--runs", "give at least 1");
    }
    let max = (BUF as usize) - iopath_rpmsg::wire::HDR_LEN;
    if cfg.sizes.is_empty() || cfg.sizes.iter().any(|&s| s == 0 || s > max) {
        invalid!("--bulk-sizes", "give sizes of 1 to {max} bytes");
    }
    let cpus = Cpus::get()?;
    let (client_cpu, server_cpu) = cfg.placement.cpus(&cpus);
    let buf = format!("{}K", BUF / 1024);
    let ring = RING.to_string();
    let size = measure::shm_size();
    let srv = Servers::start(
        &cfg.iopath,
        &Setup {
            parent: &std::env::temp_dir(),
            prefix: "iopath-bench-bulk-",
            poll: false,
            remote_args: &[
                "--event-idx",
                "--sink",
                "sink",
                "--buf-size",
                &buf,
                "--ring",
                &ring,
            ],
            shm_size: size,
            remote_cpu: server_cpu,
            host_cpu: server_cpu,
        },
    )?;
    let raw = RawSink::start(&cfg.iopath, server_cpu)?;
    let pair = measure::BusPair::start(&cpus, client_cpu, server_cpu)?;
    let wheres = cfg.placement.describe(
        &cpus,
        "senders",
        "host, remote, raw sink and the Bus API's receiver",
    );
    on_cpu(client_cpu, &cpus, || {
        let c = srv.connect()?;
        let sink = bound(&c, "sink")?;
        let mut rows: Vec<BulkRow> = cfg
            .sizes
            .iter()
            .map(|&size| BulkRow {
                size,
                msgs: (cfg.bytes / size as u64).max(1),
                fd: Vec::new(),
                raw: Vec::new(),
                bus: Vec::new(),
                memcpy: Vec::new(),
            })
            .collect();
        let (mut fd_seen, mut raw_seen) = (0u64, 0u64);
        for run in 0..cfg.runs {
            for k in 0..rows.len() {
                let n = rows.len();
                let row = &mut rows[(k + run) % n];
                let mb = |took: std::time::Duration| {
                    (row.msgs * row.size as u64) as f64 / took.as_secs_f64() / 1e6
                };
                // The ways take turns, the order rotating per run.
                for w in 0..4 {
                    match (w + run) % 4 {
                        0 => {
                            let (took, count) = stream_ept(&sink, row.msgs, row.size)?;
                            fd_seen += row.msgs + 1;
                            measure::counted("remote", count, fd_seen)?;
                            row.fd.push(mb(took));
                        }
                        1 => {
                            let (took, count) = stream_raw(&raw, row.msgs, row.size)?;
                            raw_seen += row.msgs + 1;
                            measure::counted("raw", count, raw_seen)?;
                            row.raw.push(mb(took));
                        }
                        2 => row.bus.push(mb(pair.stream(row.msgs, row.size)?)),
                        _ => row.memcpy.push(mb(measure::memcpy(row.msgs, row.size))),
                    }
                }
            }
        }
        drop(sink);
        pair.stop();
        Ok(BulkReport {
            runs: cfg.runs,
            bytes: cfg.bytes,
            wheres,
            rows,
        })
    })
}
