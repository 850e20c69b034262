//! One dd against a vhost-user-blk back end: connect to its socket, set the
//! virtio-blk driver up with the DMA ops the platform policy picks (or the
//! [`DmaMode`] override forces), drive a [`Workload`] and report. `iopath
//! blk dd` and `iopath bench blk` both run this.
//!
//! ```text
//!  DdConfig ─► validate ─► Blocks ─► VhostUser::connect_with(socket)
//!     ─► Policy { platform, bounce, override } ─► BlkDriver<dyn DmaOps | Direct>
//!     ─► workload::drive ─► DdReport { runs, stats, ops, dispatch, device }
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use iopath_dma::{Direct, DmaOps};
use iopath_virtio::transport::vhost_user::{Timeouts, VhostUser, VhostUserError};
use iopath_virtio::{BounceGeometry, Choice, Platform, Policy, PollMode, Transport};
use serde::Serialize;

use crate::driver::{BlkDriver, DriverOptions, DEVICE_ID_BLOCK};
use crate::error::BlkError;
use crate::names::names;
use crate::workload::{
    self, Access, Blocks, Op, Pattern, Progress, Run, Stats, Workload, WorkloadError,
};

/// The DMA ops a dd forces on the policy, and how the driver calls them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DmaMode {
    /// Direct ops through `&dyn DmaOps`.
    Direct,
    /// Direct ops, the driver monomorphised over them.
    DirectStatic,
    /// IOMMU ops: IOVAs, IOTLB updates and invalidations.
    Iommu,
    /// Bounce ops: copies through a small shared window.
    Bounce,
}

names!(DmaMode, "dma", Direct => "direct", DirectStatic => "direct-static", Iommu => "iommu", Bounce => "bounce");

impl DmaMode {
    /// Every mode, in table order.
    pub const ALL: [DmaMode; 4] = [
        DmaMode::Direct,
        DmaMode::DirectStatic,
        DmaMode::Iommu,
        DmaMode::Bounce,
    ];

    /// The ops the policy is told to use.
    pub fn choice(self) -> Choice {
        match self {
            DmaMode::Direct | DmaMode::DirectStatic => Choice::Direct,
            DmaMode::Iommu => Choice::Iommu,
            DmaMode::Bounce => Choice::Bounce,
        }
    }
}

/// What to run and against which back end.
#[derive(Debug, Clone)]
pub struct DdConfig {
    /// The back end's vhost-user-blk socket.
    pub socket: PathBuf,
    /// How long to wait for the socket, and for each answer of the back
    /// end.
    pub timeouts: Timeouts,
    /// The platform whose policy picks the DMA ops.
    pub platform: Platform,
    /// The bounce window, when bounce ops are used.
    pub bounce: BounceGeometry,
    /// The override of the policy's choice (`None`: the policy chooses).
    pub dma: Option<DmaMode>,
    /// Virtqueues to use, each driven by its own thread.
    pub queues: usize,
    /// How each queue waits for completions.
    pub poll: PollMode,
    /// The blocks, range and data.
    pub workload: Workload,
}

impl DdConfig {
    /// `workload` on the back end at `socket`: 10 s for the socket to
    /// accept, the transport's default answer timeout (for vhost-user
    /// requests and block requests alike), the direct platform with
    /// swiotlb's bounce window, no override, one queue, the default poll
    /// window.
    pub fn new(socket: impl Into<PathBuf>, workload: Workload) -> Self {
        DdConfig {
            socket: socket.into(),
            timeouts: Timeouts {
                connect: Duration::from_secs(10),
                ..Timeouts::default()
            },
            platform: Platform::Direct,
            bounce: BounceGeometry::DEFAULT,
            dma: None,
            queues: 1,
            poll: PollMode::default(),
            workload,
        }
    }

    /// The platform policy, with the override.
    pub fn policy(&self) -> Policy {
        Policy::new(self.platform)
            .with_bounce(self.bounce)
            .with_override(self.dma.map(DmaMode::choice))
    }

    /// Checks the settings against each other (not against a device).
    ///
    /// # Errors
    /// [`WorkloadError::Invalid`] for zero queues; [`Workload::validate`]'s;
    /// [`WorkloadError::DepthBelowQueues`].
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.queues == 0 {
            return Err(WorkloadError::Invalid {
                field: "queues",
                value: 0,
                accepted: "at least 1",
            });
        }
        self.workload.validate()?;
        if self.workload.queue_depth < self.queues {
            return Err(WorkloadError::DepthBelowQueues {
                queue_depth: self.workload.queue_depth,
                queues: self.queues,
            });
        }
        Ok(())
    }

    /// How the driver calls the ops: "static" (monomorphised) or "dyn".
    fn dispatch(&self) -> &'static str {
        if self.dma == Some(DmaMode::DirectStatic) {
            "static"
        } else {
            "dyn"
        }
    }
}

/// What a dd did.
#[derive(Debug, Clone, Serialize)]
pub struct DdReport {
    /// Bytes per run.
    pub bytes: u64,
    /// Block size.
    pub bs: u64,
    /// Blocks per run.
    pub count: u64,
    /// Direction.
    pub op: Op,
    /// Pattern.
    pub pattern: Pattern,
    /// Block order.
    pub access: Access,
    /// Seed of the random order.
    pub seed: u64,
    /// The platform setting of the policy.
    pub platform: String,
    /// The override (null: the policy chose).
    pub dma: Option<DmaMode>,
    /// The DMA ops the driver used.
    pub ops: String,
    /// How the driver calls them: "dyn" (`&dyn DmaOps`) or "static"
    /// (monomorphised).
    pub dispatch: String,
    /// Blocks in flight.
    pub queue_depth: usize,
    /// Queues used.
    pub queues: usize,
    /// Each run.
    pub runs: Vec<Run>,
    /// Median throughput.
    pub median_gib_per_s: f64,
    /// Stats over the runs (GiB/s).
    pub stats: Stats,
    /// Whether the range was read back and matched (null: not asked).
    pub verified: Option<bool>,
    /// The device, as its config space describes it.
    pub device: String,
}

/// The summary `iopath blk dd` prints: `wrote 1024 x 8388608 B
/// (sequential), direct ops (dyn), qd 4: median 3.1 GiB/s (min .., max ..,
/// spread ..%)`, and a `verify:` line when the range was read back.
impl std::fmt::Display for DdReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (op, access) = match (self.op, self.access) {
            (Op::Write, Access::Seq) => ("wrote", "sequential"),
            (Op::Write, Access::Rand) => ("wrote", "random"),
            (Op::Read, Access::Seq) => ("read", "sequential"),
            (Op::Read, Access::Rand) => ("read", "random"),
        };
        let s = &self.stats;
        write!(
            f,
            "{op} {} x {} B ({access}), {} ops ({}), qd {}: median {:.3} GiB/s \
             (min {:.3}, max {:.3}, spread {:.1}%)",
            self.count,
            self.bs,
            self.ops,
            self.dispatch,
            self.queue_depth,
            s.median,
            s.min,
            s.max,
            s.spread * 100.0
        )?;
        if self.verified == Some(true) {
            write!(
                f,
                "\nverify: {} bytes match the {:?} pattern",
                self.bytes, self.pattern
            )?;
        }
        Ok(())
    }
}

/// Errors of a dd.
#[derive(Debug, thiserror::Error)]
pub enum DdError {
    /// A setting out of range, or the workload failing.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The socket path names something that is not a socket.
    #[error("{}: not a socket ({what})", socket.display())]
    NotASocket {
        /// The path.
        socket: PathBuf,
        /// What it is: "a directory", "a regular file", ...
        what: &'static str,
    },
    /// The back end cannot be reached.
    #[error("Cannot reach the back end at {socket}")]
    Connect {
        /// Its socket.
        socket: PathBuf,
        /// The transport's error.
        #[source]
        source: VhostUserError,
    },
    /// The device refused to be set up (or the policy refused it).
    #[error("Cannot initialise the virtio-blk device")]
    Init(#[source] BlkError),
}

/// Runs the dd `cfg` describes, telling `progress` as blocks complete.
///
/// # Errors
/// [`DdConfig::validate`]'s and the block buffers', before connecting;
/// [`DdError::Connect`]; [`DdError::Init`]; the workload's (a block that
/// fails, a verification mismatch).
pub fn run(cfg: &DdConfig, progress: &dyn Progress) -> Result<DdReport, DdError> {
    cfg.validate()?;
    not_a_socket(&cfg.socket)?;
    let blocks = Blocks::new(&cfg.workload)?;
    let transport: Arc<dyn Transport> = Arc::new(
        VhostUser::connect_with(&cfg.socket, DEVICE_ID_BLOCK, cfg.timeouts).map_err(|source| {
            DdError::Connect {
                socket: cfg.socket.clone(),
                source,
            }
        })?,
    );
    let opts = DriverOptions {
        queues: cfg.queues.try_into().unwrap_or(u16::MAX),
        timeout: cfg.timeouts.reply,
        poll: cfg.poll,
        ..DriverOptions::default()
    };
    let policy = cfg.policy();
    if cfg.dma == Some(DmaMode::DirectStatic) {
        let mut drv = BlkDriver::<Direct>::new(transport, &policy, &opts, blocks.buffers())
            .map_err(DdError::Init)?;
        return report(&mut drv, cfg, &blocks, progress);
    }
    let mut drv = BlkDriver::<dyn DmaOps>::new(transport, &policy, &opts, blocks.buffers())
        .map_err(DdError::Init)?;
    report(&mut drv, cfg, &blocks, progress)
}

/// Refuses a socket path that exists but is not a socket (connecting to it
/// would only say "Connection refused"); a missing path is left to the
/// connect, which waits for a back end to create it.
fn not_a_socket(path: &std::path::Path) -> Result<(), DdError> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(t) = std::fs::metadata(path).map(|m| m.file_type()) else {
        return Ok(());
    };
    let what = match () {
        () if t.is_socket() => return Ok(()),
        () if t.is_dir() => "a directory",
        () if t.is_file() => "a regular file",
        () => "something else",
    };
    Err(DdError::NotASocket {
        socket: path.to_owned(),
        what,
    })
}

/// Drives the workload on `drv` and builds the report; generic over the
/// ops type like [`workload::drive`].
fn report<O: DmaOps + ?Sized>(
    drv: &mut BlkDriver<O>,
    cfg: &DdConfig,
    blocks: &Blocks,
    progress: &dyn Progress,
) -> Result<DdReport, DdError> {
    let w = &cfg.workload;
    if drv.num_queues() < cfg.queues {
        tracing::warn!(
            "{} queues asked, but the device offers {}: running {}",
            cfg.queues,
            drv.config().num_queues,
            drv.num_queues()
        );
    }
    let out = workload::drive(drv, w, blocks, progress)?;
    let g: Vec<f64> = out.runs.iter().map(|r| r.gib_per_s).collect();
    let stats = Stats::of(&g);
    Ok(DdReport {
        bytes: w.bytes(),
        bs: w.bs as u64,
        count: w.count,
        op: w.op,
        pattern: w.pattern,
        access: w.access,
        seed: w.seed,
        platform: cfg.platform.to_string(),
        dma: cfg.dma,
        ops: drv.ops().name().to_string(),
        dispatch: cfg.dispatch().to_string(),
        queue_depth: w.queue_depth,
        queues: drv.num_queues(),
        runs: out.runs,
        median_gib_per_s: stats.median,
        stats,
        verified: out.verified.then_some(true),
        device: drv.config().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_print_and_choose_ops() {
        for m in DmaMode::ALL {
            assert_eq!(m.name().parse::<DmaMode>().unwrap(), m);
        }
        assert_eq!(DmaMode::DirectStatic.to_string(), "direct-static");
        assert_eq!(DmaMode::DirectStatic.choice(), Choice::Direct);
        assert_eq!(DmaMode::Bounce.choice(), Choice::Bounce);
        assert!("static".parse::<DmaMode>().is_err());
    }

    #[test]
    fn validate_names_queues_and_depth() {
        let mut cfg = DdConfig::new("/nonexistent", Workload::default());
        cfg.queues = 0;
        assert!(matches!(
            cfg.validate(),
            Err(WorkloadError::Invalid {
                field: "queues",
                ..
            })
        ));
        cfg.queues = 8;
        assert!(matches!(
            cfg.validate(),
            Err(WorkloadError::DepthBelowQueues {
                queue_depth: 4,
                queues: 8
            })
        ));
    }
}
