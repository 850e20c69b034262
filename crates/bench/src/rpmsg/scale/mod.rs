//! `iopath bench rpmsg --scale`: what the endpoint service costs as the
//! work grows, beside limits measured in the same run.
//!
//! ```text
//!  client threads (one per endpoint fd) ─► host (endpoint service, one
//!  thread) ─► vrings ─► remote "echo" / "sink" (another process)
//!
//!  echo     1, 16, 256 endpoints echoing at once, one thread each, for a
//!           fixed time: aggregate round trips/s, each endpoint's p99 and
//!           round trips (fairness: no endpoint starved)
//!  stream   one endpoint sending as fast as it can to the sink (the ring
//!           kept full), then "SYNC", answered with the sink's count:
//!           messages/s and MB/s, beside the same stream over a bare
//!           SOCK_SEQPACKET socket to another process (a raw sink); up to
//!           65520-byte messages, the remote offering 64 KiB buffers
//!  create   10,000 endpoint fds created on one control connection and
//!           held, then closed: time per endpoint per thousand (a curve),
//!           the host's resident memory per endpoint
//! ```
//!
//! The remote offers `EVENT_IDX`, so kicks are batched both ways.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{check, check_failed, invalid};
use crate::place::{on_cpu, Cpus, Placement};
use crate::rpmsg::children::{bound, Servers, Setup};
use crate::rpmsg::raw::sink::RawSink;
use crate::Result;

pub(crate) mod measure;
mod report;

pub use report::ScaleReport;

/// What `iopath bench rpmsg --scale` measures.
#[derive(Debug, Clone)]
pub struct ScaleConfig {
    /// Endpoints echoing at once, one row each.
    pub endpoints: Vec<usize>,
    /// How long each echo row runs per run.
    pub echo_time: Duration,
    /// Runs of each echo and stream row (median and spread reported).
    pub runs: usize,
    /// Messages per stream run, at most ([`STREAM_BYTES`] at most).
    pub stream_msgs: u64,
    /// Payload sizes of the stream rows.
    pub stream_sizes: Vec<usize>,
    /// Endpoints created (and held) at once.
    pub create: usize,
    /// Where the processes run: the client threads where the placement
    /// puts the client, host and remote (and the raw sink) where it puts
    /// the servers.
    pub placement: Placement,
    /// The `iopath` executable (its `rpmsg host`, `rpmsg remote` and the
    /// raw sink child).
    pub iopath: PathBuf,
}

impl ScaleConfig {
    /// 1, 16 and 256 endpoints for 1 s each, 3 runs, streams of 100,000
    /// messages of 16 and 496 bytes and of 32 MiB in 4096- and 65520-byte
    /// messages, 10,000 endpoints, every process on one CPU.
    pub fn new(iopath: PathBuf) -> ScaleConfig {
        ScaleConfig {
            endpoints: vec![1, 16, 256],
            echo_time: Duration::from_secs(1),
            runs: 3,
            stream_msgs: 100_000,
            stream_sizes: vec![16, 496, 4096, 65520],
            create: 10_000,
            placement: Placement::One,
            iopath,
        }
    }
}

/// One echo row over every run.
#[derive(Debug)]
struct EchoRow {
    endpoints: usize,
    /// Aggregate round trips/s per run.
    aggregate: Vec<f64>,
    /// Per run: the median endpoint's p99, the worst endpoint's p99, the
    /// fewest round trips of an endpoint over the median endpoint's.
    p99_median: Vec<f64>,
    p99_max: Vec<f64>,
    fewest_share: Vec<f64>,
}

/// Bytes a stream row sends per run at most.
pub const STREAM_BYTES: u64 = 32 << 20;

/// One stream row: messages/s per run, through the endpoint and raw.
#[derive(Debug)]
struct StreamRow {
    size: usize,
    /// Messages per run.
    msgs: u64,
    ept: Vec<f64>,
    raw: Vec<f64>,
}

/// Creating many endpoints at once.
#[derive(Debug)]
struct CreateRow {
    endpoints: usize,
    /// Microseconds per endpoint, per thousand created (the curve).
    per_thousand_us: Vec<f64>,
    create_s: f64,
    destroy_s: f64,
    /// The host's resident memory before, with every endpoint held, after.
    rss_kib: [u64; 3],
}

/// Runs the scale experiments.
///
/// # Errors
/// [`crate::Error::Invalid`] for bad settings; when the host, remote or
/// raw sink cannot be started or misbehave (an echo wrong, a message lost).
pub fn run(cfg: &ScaleConfig) -> Result<ScaleReport> {
    if cfg.runs == 0 {
        invalid!("--runs", "give at least 1");
    }
    if cfg.endpoints.is_empty() || cfg.endpoints.contains(&0) {
        invalid!("--scale", "give positive endpoint counts");
    }
    let cpus = Cpus::get()?;
    let (client_cpu, server_cpu) = cfg.placement.cpus(&cpus);
    let srv = Servers::start(
        &cfg.iopath,
        &Setup {
            parent: &std::env::temp_dir(),
            prefix: "iopath-bench-scale-",
            poll: false,
            remote_args: &[
                "--event-idx",
                "--echo",
                "echo",
                "--sink",
                "sink",
                "--buf-size",
                "64K",
            ],
            shm_size: iopath_rpmsg::rsc_table::ShmLayout::size_for(
                256,
                iopath_rpmsg::BufSizes::both(64 * 1024),
            )
            .expect("rings of 256 have a layout"),
            remote_cpu: server_cpu,
            host_cpu: server_cpu,
        },
    )?;
    let raw = RawSink::start(&cfg.iopath, server_cpu)?;
    let wheres = cfg
        .placement
        .describe(&cpus, "client threads", "host, remote and the raw sink");
    on_cpu(client_cpu, &cpus, || {
        let c = srv.connect()?;
        let mut echo: Vec<EchoRow> = cfg
            .endpoints
            .iter()
            .map(|&endpoints| EchoRow {
                endpoints,
                aggregate: Vec::new(),
                p99_median: Vec::new(),
                p99_max: Vec::new(),
                fewest_share: Vec::new(),
            })
            .collect();
        let mut streams: Vec<StreamRow> = cfg
            .stream_sizes
            .iter()
            .map(|&size| StreamRow {
                size,
                msgs: cfg
                    .stream_msgs
                    .min(STREAM_BYTES / size.max(1) as u64)
                    .max(1),
                ept: Vec::new(),
                raw: Vec::new(),
            })
            .collect();
        let sink = bound(&c, "sink")?;
        let mut expect = 0u64; // the remote sink's count so far
        let mut raw_count = 0u64;
        for run in 0..cfg.runs {
            // Rows take turns, the order rotating per run.
            for k in 0..echo.len() {
                let row = &mut echo[(k + run) % cfg.endpoints.len()];
                let (agg, per) = measure::echo_run(&c, row.endpoints, cfg.echo_time)?;
                row.add(agg, &per);
            }
            for k in 0..streams.len() {
                let row = &mut streams[(k + run) % cfg.stream_sizes.len()];
                // The endpoint first in even runs, the raw socket in odd.
                for raw_way in [run % 2 == 1, run % 2 == 0] {
                    let (name, seen, rates) = if raw_way {
                        ("raw", &mut raw_count, &mut row.raw)
                    } else {
                        ("remote", &mut expect, &mut row.ept)
                    };
                    let (took, count) = if raw_way {
                        measure::stream_raw(&raw, row.msgs, row.size)?
                    } else {
                        measure::stream_ept(&sink, row.msgs, row.size)?
                    };
                    *seen += row.msgs + 1;
                    check!(
                        count == *seen,
                        "the {name} sink counted {count} messages, not {}: messages were lost",
                        *seen
                    );
                    rates.push(row.msgs as f64 / took.as_secs_f64());
                }
            }
        }
        drop(sink);
        let create = measure::create_many(&srv, &c, cfg.create)?;
        Ok(ScaleReport {
            runs: cfg.runs,
            echo_time: cfg.echo_time,
            stream_msgs: cfg.stream_msgs,
            wheres,
            echo,
            stream: streams,
            create,
        })
    })
}
