//! `iopath bench rpmsg`: its arguments, mapped to [`RpmsgConfig`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use iopath_bench::rpmsg::bulk::BulkConfig;
use iopath_bench::rpmsg::scale::ScaleConfig;
use iopath_bench::rpmsg::RpmsgConfig;
use iopath_bench::Report;

use super::{Outputs, PlacementArg};

/// Arguments of `iopath bench rpmsg`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
A cycle: legacy = CREATE_EPT, open the node (connect + greeting), destroy
through it (shutdown + the service's hang-up), close; fd = CREATE_EPT_FD
(the endpoint comes back over SCM_RIGHTS), close (the service notices and
frees it; the row's time includes waiting until it has freed them all).
limit = the same request size answered with an fd by a bare server process
(an eventfd; limit-s: a fresh SOCK_SEQPACKET socket, as an endpoint is;
limit-w: that socket with the kernel work the service cannot skip per
endpoint: the passed end's send buffer at the smallest, the kept end
watched by epoll until the client's close, then read and closed).
The ways take turns in chunks of 500 cycles (rotating which goes first), so
that load from elsewhere hits them alike; medians with (min-max) over --runs.

Placement matters more than code on a small VM: a wake-up that crosses to
an idle CPU costs tens of microseconds there, on the same CPU a few. Each
placement pins every process, the limit's included, the same way:
  one    every process on the first CPU
  split  client on the first CPU; host, remote, raw server on the second
  free   no pinning

With --openamp DIR (OpenAMP's rpmsg-echo and iopath's rpmsg-ping-timed on
OpenAMP's API, built by `scripts/openamp-demo build SRC DIR`), the peer
rows: strict 16-byte ping-pong between each driver side (OpenAMP's driver;
`iopath rpmsg host` + a client's endpoint fd; the in-process Bus API) and
each remote (OpenAMP's rpmsg-echo; `iopath rpmsg remote`), all on OpenAMP's
demo platform (/dev/shm/openamp.shm, unix:/tmp/openamp.event.0: run no other
OpenAMP demo meanwhile), per --peer-placement, the pairs taking turns, --runs
times. Without it those rows are a note.
Example: iopath bench rpmsg --loops 1000,10000,100000 --poll --openamp DIR")]
pub struct RpmsgArgs {
    /// Create+destroy cycles per row, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub loops: Vec<u64>,
    /// Runs per row (median and spread are reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Echo round trips (16-byte messages) for the latency rows.
    #[arg(long, default_value_t = 10_000)]
    pub count: u64,
    /// Also measure echo latency with host and remote polling the rings and
    /// the client busy-polling its fd (no notifications; spins two cores),
    /// beside its floor: the same hops in the same places with no rpmsg
    /// (a forwarder process and a flag word in a shared page).
    #[arg(long)]
    pub poll: bool,
    /// Also measure cost as work grows (about half a minute), every process
    /// on one CPU: 1, 16 and 256 endpoints echoing at once (aggregate round
    /// trips/s, per-endpoint p99), a one-way stream beside a raw
    /// SOCK_SEQPACKET stream, 10,000 endpoints created and held (JSON
    /// `scale`).
    #[arg(long)]
    pub scale: bool,
    /// MiB each bulk row streams per run (0: no bulk rows): one-way
    /// streams over 64 KiB buffers through an endpoint fd and the
    /// in-process Bus API (zero-copy receive), beside a raw SOCK_SEQPACKET
    /// stream and a one-thread memcpy of the same bytes, client and
    /// servers on different CPUs (JSON `bulk`).
    #[arg(long, default_value_t = 32, value_name = "MIB")]
    pub bulk_mib: u64,
    /// Message sizes of the bulk rows, comma-separated (at most 65520,
    /// a 64 KiB buffer's payload).
    #[arg(long, value_delimiter = ',', default_value = "496,2048,4096,65520")]
    pub bulk_sizes: Vec<usize>,
    /// Where the processes run, comma-separated; the first one fills the
    /// main table and JSON `rows`: one (all on one CPU), split (client on
    /// one CPU, servers on another), free (no pinning).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "one,split,free"
    )]
    pub placement: Vec<PlacementArg>,
    /// OpenAMP's demo binaries (rpmsg-echo, rpmsg-ping-timed), built by
    /// `scripts/openamp-demo build SRC DIR`: adds the peer rows.
    #[arg(long, value_name = "DIR")]
    pub openamp: Option<PathBuf>,
    /// Where the peer rows' processes run, comma-separated: split (driver
    /// side on one CPU, the remote on another, as a co-processor), one
    /// (all on one CPU), free (no pinning).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "split,one")]
    pub peer_placement: Vec<PlacementArg>,
    /// Longest a peer row's measured round trips may take per run, seconds
    /// (OpenAMP's driver spins: sharing a CPU with its remote it manages a
    /// few hundred round trips a second).
    #[arg(long, default_value_t = 2)]
    pub peer_seconds: u64,
    /// Print one JSON object: `rows`, `limit` and `echo` of the first
    /// placement, every placement under `placements`, the peer rows under
    /// `peers`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub out: Outputs,
}

impl RpmsgArgs {
    fn config(&self) -> Result<RpmsgConfig> {
        Ok(RpmsgConfig {
            loops: self.loops.clone(),
            runs: self.runs,
            count: self.count,
            poll: self.poll,
            placement: self.placement.iter().map(|&p| p.into()).collect(),
            openamp: self.openamp.clone(),
            peer_placement: self.peer_placement.iter().map(|&p| p.into()).collect(),
            peer_budget: Duration::from_secs(self.peer_seconds),
            iopath: iopath_bench::current_exe()?,
            progress: !self.json,
        })
    }

    /// Runs the experiment (and the scale experiments with `--scale`).
    pub(super) fn report(&self) -> Result<Report> {
        let cfg = self.config()?;
        let mut rep = iopath_bench::rpmsg::run(&cfg)?;
        if self.scale {
            let sc = iopath_bench::rpmsg::scale::run(&ScaleConfig::new(cfg.iopath.clone()))?;
            rep.add_scale(sc);
        }
        if self.bulk_mib > 0 {
            let bc = BulkConfig {
                sizes: self.bulk_sizes.clone(),
                bytes: self.bulk_mib << 20,
                runs: self.runs,
                ..BulkConfig::new(cfg.iopath.clone())
            };
            rep.add_bulk(iopath_bench::rpmsg::bulk::run(&bc)?);
        }
        Ok(rep.report())
    }
}
