//! The virtio-blk driver: a block-device API over any virtio transport and
//! any DMA ops.
//!
//! A [`Request`] (read, write, flush, discard, write-zeroes) is cut into
//! virtio requests that respect the device's `size_max`/`seg_max`, the DMA
//! ops' largest mapping and the ring; each is a descriptor chain
//!
//! ```text
//!   header (coherent) ─► data segments (Buffer ranges, mapped by the ops) ─► status (coherent)
//! ```
//!
//! Headers, range segments and status bytes live in one coherent area per
//! queue (a 64-byte slot per request in flight), so only the data goes
//! through `map`/`unmap`: the cost the DMA ops experiment measures.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use iopath_dma::{Coherent, DmaOps, IotlbRecord, MapWait, Perm};
use iopath_heap::Buffer;
use iopath_virtio::features as vfeatures;
use iopath_virtio::queue::INDIRECT_MAX;
use iopath_virtio::{Policy, PolicyError, PolicyOps, QueueFeatures, Seg, SplitQueue, Transport};

/// Sector size of virtio-blk addressing (virtio 1.x, 5.2.6), whatever the
/// device's logical block size.
pub use crate::request::SECTOR_SIZE as SECTOR;

/// The feature bits the driver uses: virtio-blk's from [`crate::config`],
/// the transport's from `iopath_virtio::features` (both from
/// `virtio-bindings`).
mod features {
    pub use crate::config::{
        VIRTIO_BLK_F_BLK_SIZE as BLK_SIZE, VIRTIO_BLK_F_DISCARD as DISCARD,
        VIRTIO_BLK_F_FLUSH as FLUSH, VIRTIO_BLK_F_MQ as MQ, VIRTIO_BLK_F_RO as RO,
        VIRTIO_BLK_F_SEG_MAX as SEG_MAX, VIRTIO_BLK_F_SIZE_MAX as SIZE_MAX,
        VIRTIO_BLK_F_WRITE_ZEROES as WRITE_ZEROES,
    };
    pub use iopath_virtio::features::{
        VIRTIO_F_ACCESS_PLATFORM as ACCESS_PLATFORM, VIRTIO_F_EVENT_IDX as EVENT_IDX,
        VIRTIO_F_INDIRECT_DESC as INDIRECT_DESC, VIRTIO_F_VERSION_1 as VERSION_1,
    };
}

/// Request types (virtio 1.x, 5.2.6), shared with the back end's parser.
pub(crate) mod req_type {
    pub use crate::request::{
        VIRTIO_BLK_T_DISCARD as DISCARD, VIRTIO_BLK_T_FLUSH as FLUSH,
        VIRTIO_BLK_T_GET_ID as GET_ID, VIRTIO_BLK_T_IN as IN, VIRTIO_BLK_T_OUT as OUT,
        VIRTIO_BLK_T_WRITE_ZEROES as WRITE_ZEROES,
    };
}

/// Size of `struct virtio_blk_config` up to `write_zeroes_may_unmap` and
/// its padding (virtio 1.x, 5.2.4).
pub const CONFIG_LEN: usize = crate::config::CONFIG_LEN;
/// Size of the request header `{type u32, ioprio u32, sector u64}`.
pub const HEADER_LEN: usize = 16;
/// Size of a discard / write-zeroes segment `{sector u64, num_sectors u32,
/// flags u32}`.
pub const RANGE_LEN: usize = 16;
/// Length of the `GET_ID` answer.
pub const ID_LEN: usize = crate::request::VIRTIO_BLK_ID_BYTES;

/// The device's geometry and limits, from its config space and features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Capacity in 512-byte sectors.
    pub capacity: u64,
    /// Largest data segment in bytes (`None`: no limit given).
    pub size_max: Option<u32>,
    /// Most data segments in one request (`None`: no limit given).
    pub seg_max: Option<u32>,
    /// Logical block size in bytes (512 unless `BLK_SIZE`).
    pub blk_size: u32,
    /// Number of request queues (1 unless `MQ`).
    pub num_queues: u16,
    /// Discard limits, when `DISCARD` was offered.
    pub discard: Option<RangeLimits>,
    /// Write-zeroes limits, when `WRITE_ZEROES` was offered.
    pub write_zeroes: Option<RangeLimits>,
    /// Whether write-zeroes may deallocate (`write_zeroes_may_unmap`).
    pub write_zeroes_may_unmap: bool,
    /// Whether the device is read-only (`RO`).
    pub read_only: bool,
    /// Whether the device has a volatile cache that `FLUSH` drains.
    pub flush: bool,
}

/// Limits of the range commands (discard, write-zeroes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeLimits {
    /// Most sectors in one segment.
    pub max_sectors: u32,
    /// Most segments in one request.
    pub max_segs: u32,
    /// Required alignment of a discard segment, in sectors (1 for
    /// write-zeroes).
    pub alignment: u32,
}

impl DeviceConfig {
    /// Reads the config space `raw` (the device's `virtio_blk_config`,
    /// little-endian; its layout is [`crate::config::BlkConfig`]) under the
    /// negotiated `features`. Fields of features not negotiated are ignored;
    /// zero limits mean "no limit" (some devices offer `SIZE_MAX` with
    /// `size_max` 0) and zero range limits fall back to 1.
    pub fn parse(raw: &[u8; CONFIG_LEN], features: u64) -> Self {
        let w = crate::config::BlkConfig::from_bytes(raw);
        let nonzero = |v: u32| (v != 0).then_some(v);
        let has = |f: u64| features & f != 0;
        let range = |sectors: u32, segs: u32, align: u32| RangeLimits {
            max_sectors: sectors.max(1),
            max_segs: segs.max(1),
            alignment: align.max(1),
        };
        // A block size that is not a power-of-two multiple of 512 is
        // nonsense from the device; 512 then.
        let blk_size =
            if has(features::BLK_SIZE) && w.blk_size >= 512 && w.blk_size.is_power_of_two() {
                w.blk_size
            } else {
                512
            };
        DeviceConfig {
            capacity: w.capacity,
            size_max: nonzero(w.size_max).filter(|_| has(features::SIZE_MAX)),
            seg_max: nonzero(w.seg_max).filter(|_| has(features::SEG_MAX)),
            blk_size,
            num_queues: if has(features::MQ) {
                w.num_queues.max(1)
            } else {
                1
            },
            discard: has(features::DISCARD).then(|| {
                range(
                    w.max_discard_sectors,
                    w.max_discard_seg,
                    w.discard_sector_alignment,
                )
            }),
            write_zeroes: has(features::WRITE_ZEROES)
                .then(|| range(w.max_write_zeroes_sectors, w.max_write_zeroes_seg, 1)),
            write_zeroes_may_unmap: has(features::WRITE_ZEROES) && w.write_zeroes_may_unmap,
            read_only: has(features::RO),
            flush: has(features::FLUSH),
        }
    }

    /// Capacity in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity.saturating_mul(SECTOR)
    }
}

impl fmt::Display for DeviceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} sectors ({} MiB), block {} B, {} queue(s), seg_max {}, size_max {}",
            self.capacity,
            self.capacity_bytes() >> 20,
            self.blk_size,
            self.num_queues,
            self.seg_max.map_or("-".into(), |v| v.to_string()),
            self.size_max.map_or("-".into(), |v| v.to_string()),
        )
    }
}

/// Encodes a request header.
pub(crate) fn header(kind: u32, sector: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    // ioprio (4..8) stays 0.
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    h
}

/// Encodes one discard / write-zeroes segment.
pub(crate) fn range(sector: u64, sectors: u32, unmap: bool) -> [u8; RANGE_LEN] {
    let mut r = [0u8; RANGE_LEN];
    r[0..8].copy_from_slice(&sector.to_le_bytes());
    r[8..12].copy_from_slice(&sectors.to_le_bytes());
    r[12..16].copy_from_slice(&u32::from(unmap).to_le_bytes());
    r
}

/// One virtio request's share of a larger transfer: `len` bytes at byte
/// offset `offset` from the start of the transfer, sent as data segments of
/// the given lengths (all contiguous in one mapping).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub offset: u64,
    pub len: u64,
    pub segs: Vec<u32>,
}

/// Cuts a transfer of `len` bytes into requests that respect the device's
/// `size_max`/`seg_max`, the DMA ops' largest mapping `max_map` and the
/// descriptors one request may use (`max_descs`, header and status
/// included). Every chunk but the last is a multiple of `align` (the block
/// size), so each request starts on a block boundary.
pub(crate) fn plan(
    len: u64,
    cfg: &DeviceConfig,
    max_map: u64,
    max_descs: u32,
    align: u64,
) -> Option<Vec<Chunk>> {
    let seg_size = u64::from(cfg.size_max.unwrap_or(u32::MAX))
        .min(u64::from(u32::MAX))
        .max(1);
    // Data descriptors left once the header and status have theirs.
    let seg_count = u64::from(
        cfg.seg_max
            .unwrap_or(u32::MAX)
            .min(max_descs.saturating_sub(2)),
    )
    .max(1);
    let mut per_req = seg_size.saturating_mul(seg_count).min(max_map);
    // Every request must start on a block: a device (or DMA ops) whose
    // limits cannot carry one block per request cannot be driven.
    per_req -= per_req % align.max(1);
    if per_req == 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut off = 0;
    while off < len {
        let n = per_req.min(len - off);
        let mut segs = Vec::new();
        let mut left = n;
        while left > 0 {
            let s = left.min(seg_size);
            // `s <= seg_size <= u32::MAX`.
            segs.push(s as u32);
            left -= s;
        }
        out.push(Chunk {
            offset: off,
            len: n,
            segs,
        });
        off += n;
    }
    Some(out)
}

/// Errors of the virtio-blk driver.
#[derive(Debug, thiserror::Error)]
pub enum BlkError {
    /// The virtio layer failed (queue, transport, DMA).
    #[error(transparent)]
    Virtio(#[from] iopath_virtio::Error),
    /// A DMA ops call failed.
    #[error(transparent)]
    Dma(#[from] iopath_dma::Error),
    /// The platform policy refused the device or could not make its ops.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The transport refused an IOTLB record of the shared regions.
    #[error("Cannot map the shared regions in the device's IOTLB")]
    Iotlb(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A heap buffer access failed.
    #[error(transparent)]
    Heap(#[from] iopath_heap::Error),
    /// The device is not a block device.
    #[error("Device id {id} is not a block device (2)")]
    NotBlock {
        /// Device id the transport reports.
        id: u32,
    },
    /// Offset or length not a multiple of the 512-byte sector.
    #[error("Offset {offset} or length {len} is not a multiple of 512")]
    Unaligned {
        /// Byte offset on the device.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// A range past the end of the device.
    #[error("Range {offset}+{len} is past the device's end ({capacity} bytes)")]
    OutOfRange {
        /// Byte offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Device capacity in bytes.
        capacity: u64,
    },
    /// A zero-length transfer.
    #[error("Zero-length transfer")]
    Empty,
    /// The device's segment limits (or the DMA ops' largest mapping) do not
    /// allow even one block per request.
    #[error("Device limits (size_max {size_max:?}, seg_max {seg_max:?}, largest mapping {max_map}) cannot carry one block per request")]
    Limits {
        /// Largest segment, from config space.
        size_max: Option<u32>,
        /// Most segments, from config space.
        seg_max: Option<u32>,
        /// The DMA ops' largest mapping.
        max_map: u64,
    },
    /// The device does not offer the command (feature not negotiated).
    #[error("Device does not support {what}")]
    NotSupported {
        /// The command.
        what: &'static str,
    },
    /// The device is read-only.
    #[error("Device is read-only")]
    ReadOnly,
    /// The device answered `VIRTIO_BLK_S_IOERR`.
    #[error("Device reported an I/O error at sector {sector}")]
    IoError {
        /// First sector of the failed request.
        sector: u64,
    },
    /// The device answered `VIRTIO_BLK_S_UNSUPP`.
    #[error("Device does not support request type {kind}")]
    Unsupported {
        /// The request type.
        kind: u32,
    },
    /// The device wrote a status byte that means nothing, or none at all.
    #[error("Device returned invalid status {status:#x} for request type {kind}")]
    BadStatus {
        /// The status byte.
        status: u8,
        /// The request type.
        kind: u32,
    },
    /// The device did not complete anything within the timeout.
    #[error("No completion on queue {queue} within {timeout:?}")]
    Timeout {
        /// The queue.
        queue: u16,
        /// How long we waited.
        timeout: Duration,
    },
    /// A queue index past the queues the driver set up.
    #[error("Queue {index} does not exist (driver uses {count})")]
    NoSuchQueue {
        /// Index.
        index: usize,
        /// Queues in use.
        count: usize,
    },
    /// A tag that is already in flight on the queue.
    #[error("Tag {tag} is already in flight")]
    DuplicateTag {
        /// The tag.
        tag: u64,
    },
}

/// Result of the virtio-blk driver.
pub type Result<T, E = BlkError> = std::result::Result<T, E>;

/// One block-device command.
#[derive(Debug, Clone, Copy)]
pub enum Request<'a> {
    /// Read `len` bytes at byte `offset` of the device into `buf` at
    /// `buf_offset`.
    Read {
        /// Byte offset on the device (sector multiple).
        offset: u64,
        /// Destination.
        buf: &'a Buffer,
        /// Start in `buf`.
        buf_offset: usize,
        /// Bytes (sector multiple).
        len: usize,
    },
    /// Write `len` bytes of `buf` at `buf_offset` to byte `offset`.
    Write {
        /// Byte offset on the device (sector multiple).
        offset: u64,
        /// Source.
        buf: &'a Buffer,
        /// Start in `buf`.
        buf_offset: usize,
        /// Bytes (sector multiple).
        len: usize,
    },
    /// Make every completed write durable (`VIRTIO_BLK_T_FLUSH`).
    Flush,
    /// Let the device forget `len` bytes at `offset` (`DISCARD`).
    Discard {
        /// Byte offset (sector multiple).
        offset: u64,
        /// Bytes (sector multiple).
        len: u64,
    },
    /// Zero `len` bytes at `offset` (`WRITE_ZEROES`), deallocating them if
    /// `unmap` and the device allows it.
    WriteZeroes {
        /// Byte offset (sector multiple).
        offset: u64,
        /// Bytes (sector multiple).
        len: u64,
        /// Whether the device may deallocate.
        unmap: bool,
    },
}

/// A finished request: its tag and outcome.
#[derive(Debug)]
pub struct Done {
    /// The tag given to [`BlkQueue::submit`].
    pub tag: u64,
    /// Outcome (the first error, if any of its pieces failed).
    pub result: Result<()>,
}

/// Driver options.
#[derive(Debug, Clone, Copy)]
pub struct DriverOptions {
    /// Queues to use (clamped to what the device has; 0 = all).
    pub queues: u16,
    /// Entries per queue (clamped to the transport's maximum).
    pub queue_size: u16,
    /// Longest wait for a completion before [`BlkError::Timeout`].
    pub timeout: Duration,
    /// Ask for `EVENT_IDX` notification suppression.
    pub event_idx: bool,
    /// Ask for indirect descriptors.
    pub indirect: bool,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            queues: 1,
            queue_size: 256,
            timeout: Duration::from_secs(30),
            event_idx: true,
            indirect: true,
        }
    }
}

/// Per-request metadata slot in coherent memory: header (16), range
/// segment (16), `GET_ID` answer (20), status (1), padded to 64.
const META_SLOT: usize = 64;
const META_RANGE: usize = 16;
const META_ID: usize = 32;
const META_STATUS: usize = 56;
/// Status byte written before submission; a device that completes without
/// writing a status is caught by it.
const STATUS_UNSET: u8 = 0xff;

// `VIRTIO_BLK_S_*`, shared with the back end.
use crate::request::{
    VIRTIO_BLK_S_IOERR as S_IOERR, VIRTIO_BLK_S_OK as S_OK, VIRTIO_BLK_S_UNSUPP as S_UNSUPP,
};

/// Virtio device id of a block device (`VIRTIO_ID_BLOCK`).
pub use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK as DEVICE_ID_BLOCK;

/// A transfer (a [`Request`]) in flight: the virtio requests it was cut into.
#[derive(Debug)]
struct Transfer {
    /// Pieces not yet completed.
    pending: usize,
    /// Pieces not yet submitted (the submit loop is still going).
    submitting: bool,
    error: Option<BlkError>,
}

/// One virtio request in flight, by metadata slot.
#[derive(Debug, Clone, Copy)]
struct Piece {
    tag: u64,
    kind: u32,
    sector: u64,
}

/// The virtio-blk driver: a device reached through a [`Transport`] whose
/// buffers go through DMA ops `O`.
///
/// `O` is `dyn DmaOps` when the ops are chosen at run time (the "DMA API"
/// path) or a concrete type such as `Direct` (static dispatch); the code is
/// the same.
#[derive(Debug)]
pub struct BlkDriver<O: DmaOps + ?Sized = dyn DmaOps> {
    // Field order is drop order: the queues free their ring memory (IOTLB
    // invalidations in IOMMU mode) while the transport is still connected.
    queues: Vec<BlkQueue<O>>,
    transport: Arc<dyn Transport>,
    ops: Arc<O>,
    config: DeviceConfig,
    features: u64,
    shared_generation: u64,
}

impl<O: PolicyOps + ?Sized> BlkDriver<O> {
    /// Initialises the device behind `transport` (virtio 1.x §3.1.1) with
    /// the DMA ops `policy` picks: negotiates features (`ACCESS_PLATFORM`
    /// as the policy asks), builds the ops from the negotiated features,
    /// registers `buffers` with them (the memory the device must see from
    /// the start; register more later and call
    /// [`BlkDriver::share_memory`]), reads the config space, allocates the
    /// queues in coherent memory from the ops, shares the ops' regions
    /// (and connects the IOTLB when the ops translate), and sets
    /// `DRIVER_OK`.
    ///
    /// `O` is `dyn DmaOps` for whatever the policy chooses, or `Direct`
    /// for the monomorphised path (refused when the policy chooses other
    /// ops).
    ///
    /// # Errors
    /// [`BlkError::NotBlock`]; [`BlkError::Policy`] (a protected platform
    /// and a device without `ACCESS_PLATFORM`, IOMMU ops forced on one, a
    /// bounce window that cannot be made), checked before the device is
    /// told anything; [`BlkError::Virtio`] (negotiation, transport, queue
    /// allocation), [`BlkError::Dma`].
    pub fn new(
        transport: Arc<dyn Transport>,
        policy: &Policy,
        opts: &DriverOptions,
        buffers: &[Buffer],
    ) -> Result<Self> {
        let id = transport.device_id();
        if id != DEVICE_ID_BLOCK {
            return Err(BlkError::NotBlock { id });
        }
        let mut wanted = features::SIZE_MAX
            | features::SEG_MAX
            | features::BLK_SIZE
            | features::RO
            | features::FLUSH
            | features::MQ
            | features::DISCARD
            | features::WRITE_ZEROES
            | policy.driver_features();
        if opts.event_idx {
            wanted |= features::EVENT_IDX;
        }
        if opts.indirect {
            wanted |= features::INDIRECT_DESC;
        }
        let required = features::VERSION_1 | policy.required_features();
        // A device the policy refuses (it lacks a feature the policy
        // requires) is refused with the policy's reason, before
        // negotiation starts.
        let offered = transport.device_features()?;
        let would = offered & (wanted | required);
        if would & policy.required_features() != policy.required_features() {
            policy.choose(would)?;
        }
        let negotiated = vfeatures::negotiate(&*transport, wanted, required)?;
        let ops = O::from_policy(policy, negotiated)?;
        for b in buffers {
            ops.register(b)?;
        }
        Self::init(transport, ops, opts, negotiated)
    }
}

impl<O: DmaOps + ?Sized> BlkDriver<O> {
    /// The rest of [`BlkDriver::new`], once features are negotiated and the
    /// ops made.
    fn init(
        transport: Arc<dyn Transport>,
        ops: Arc<O>,
        opts: &DriverOptions,
        negotiated: u64,
    ) -> Result<Self> {
        let mut raw = [0u8; CONFIG_LEN];
        transport.read_config(0, &mut raw)?;
        let config = DeviceConfig::parse(&raw, negotiated);

        let available = config.num_queues.min(transport.num_queues()).max(1);
        let nq = match opts.queues {
            0 => available,
            n => n.min(available),
        };
        let qf = QueueFeatures::from_bits(negotiated);
        let mut queues = Vec::with_capacity(nq.into());
        for i in 0..nq {
            let size = opts.queue_size.min(transport.queue_max_size(i)?).max(2);
            // Largest power of two not above the wish.
            let size = 1u16 << (15 - size.leading_zeros().min(15));
            let vq = SplitQueue::new(Arc::clone(&ops), i, size, qf)?;
            let meta = ops.alloc_coherent(usize::from(size) * META_SLOT)?;
            transport.setup_queue(i, &vq.config())?;
            queues.push(BlkQueue {
                transport: Arc::clone(&transport),
                config,
                vq,
                meta: Some(meta),
                free_slots: (0..size).rev().collect(),
                pieces: vec![None; usize::from(size)],
                transfers: HashMap::new(),
                done: VecDeque::new(),
                timeout: opts.timeout,
                indirect: qf.indirect,
            });
        }
        let mut drv = BlkDriver {
            transport,
            ops,
            config,
            features: negotiated,
            queues,
            shared_generation: 0,
        };
        drv.share_memory()?;
        vfeatures::driver_ok(&*drv.transport)?;
        Ok(drv)
    }

    /// Shares the ops' current regions with the device again (after more
    /// buffers were registered); connects the IOTLB when the ops translate.
    ///
    /// # Errors
    /// [`BlkError::Virtio`] (no IOTLB on the transport, transport errors),
    /// [`BlkError::Dma`].
    pub fn share_memory(&mut self) -> Result<()> {
        let generation = self.ops.regions_generation();
        let regions = self.ops.regions();
        self.transport.set_memory(&regions)?;
        if self.ops.uses_iotlb() {
            let sink = self
                .transport
                .iotlb_sink()
                .ok_or(iopath_virtio::Error::NoIotlb)?;
            self.ops.set_iotlb_sink(sink)?;
        } else if self.features & features::ACCESS_PLATFORM != 0 {
            // A translating device and ops that do not translate (bounce
            // ops on a protected platform): what is shared is mapped one to
            // one in the device's IOTLB, like an IOMMU in passthrough mode,
            // so the device reaches the shared regions and nothing else.
            let sink = self
                .transport
                .iotlb_sink()
                .ok_or(iopath_virtio::Error::NoIotlb)?;
            for r in &regions {
                sink.send(IotlbRecord::Update {
                    iova: r.gpa,
                    size: r.len() as u64,
                    uaddr: r.uaddr(),
                    perm: Perm::ReadWrite,
                })
                .map_err(BlkError::Iotlb)?;
            }
        }
        self.shared_generation = generation;
        Ok(())
    }

    /// Whether buffers were registered with the ops since the last
    /// [`BlkDriver::share_memory`].
    pub fn memory_stale(&self) -> bool {
        self.ops.regions_generation() != self.shared_generation
    }

    /// The device's geometry and limits.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// Negotiated feature bits.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// The DMA ops.
    pub fn ops(&self) -> &Arc<O> {
        &self.ops
    }

    /// The transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// Queues in use.
    pub fn num_queues(&self) -> usize {
        self.queues.len()
    }

    /// Queue `index`, to submit and complete requests on it.
    ///
    /// # Errors
    /// [`BlkError::NoSuchQueue`].
    pub fn queue(&mut self, index: usize) -> Result<&mut BlkQueue<O>> {
        let count = self.queues.len();
        self.queues
            .get_mut(index)
            .ok_or(BlkError::NoSuchQueue { index, count })
    }

    /// All queues, e.g. to drive each from its own thread.
    pub fn queues_mut(&mut self) -> &mut [BlkQueue<O>] {
        &mut self.queues
    }

    /// Reads `len` bytes at device byte `offset` into `buf` at `buf_offset`
    /// (queue 0; waits).
    ///
    /// # Errors
    /// As [`BlkQueue::submit`], plus the request's own outcome.
    pub fn read(&mut self, offset: u64, buf: &Buffer, buf_offset: usize, len: usize) -> Result<()> {
        self.queues[0].run(Request::Read {
            offset,
            buf,
            buf_offset,
            len,
        })
    }

    /// Writes `len` bytes of `buf` at `buf_offset` to device byte `offset`
    /// (queue 0; waits).
    ///
    /// # Errors
    /// As [`BlkDriver::read`].
    pub fn write(
        &mut self,
        offset: u64,
        buf: &Buffer,
        buf_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.queues[0].run(Request::Write {
            offset,
            buf,
            buf_offset,
            len,
        })
    }

    /// Flushes the device's volatile cache (a no-op success when the device
    /// has none, i.e. did not offer `FLUSH`).
    ///
    /// # Errors
    /// As [`BlkDriver::read`].
    pub fn flush(&mut self) -> Result<()> {
        if !self.config.flush {
            return Ok(());
        }
        self.queues[0].run(Request::Flush)
    }

    /// Discards `len` bytes at `offset`.
    ///
    /// # Errors
    /// [`BlkError::NotSupported`] without `DISCARD`; as [`BlkDriver::read`].
    pub fn discard(&mut self, offset: u64, len: u64) -> Result<()> {
        self.queues[0].run(Request::Discard { offset, len })
    }

    /// Zeroes `len` bytes at `offset`.
    ///
    /// # Errors
    /// [`BlkError::NotSupported`] without `WRITE_ZEROES`; as
    /// [`BlkDriver::read`].
    pub fn write_zeroes(&mut self, offset: u64, len: u64, unmap: bool) -> Result<()> {
        self.queues[0].run(Request::WriteZeroes { offset, len, unmap })
    }

    /// The device's serial number (`GET_ID`, up to 20 bytes, NULs trimmed).
    ///
    /// # Errors
    /// [`BlkError::Unsupported`] if the device refuses `GET_ID`; as
    /// [`BlkDriver::read`].
    pub fn get_id(&mut self) -> Result<Vec<u8>> {
        self.queues[0].get_id()
    }
}

impl<O: DmaOps + ?Sized> Drop for BlkDriver<O> {
    fn drop(&mut self) {
        // Reset first, so the device stops using the rings before the
        // queues unmap their buffers and free ring memory.
        if let Err(e) = self.transport.set_status(0) {
            tracing::warn!(error = %e, "virtio-blk: device reset on drop failed");
        }
    }
}

/// One virtio-blk request queue: submit [`Request`]s with tags, collect
/// [`Done`]s. Many requests may be in flight; a request larger than the
/// device's limits is cut into several virtio requests and completes once.
#[derive(Debug)]
pub struct BlkQueue<O: DmaOps + ?Sized = dyn DmaOps> {
    // The ring goes before the transport (drop order, as in `BlkDriver`).
    vq: SplitQueue<O>,
    meta: Option<Coherent>,
    transport: Arc<dyn Transport>,
    config: DeviceConfig,
    free_slots: Vec<u16>,
    pieces: Vec<Option<Piece>>,
    transfers: HashMap<u64, Transfer>,
    done: VecDeque<Done>,
    timeout: Duration,
    indirect: bool,
}

impl<O: DmaOps + ?Sized> BlkQueue<O> {
    fn meta(&self) -> &Coherent {
        self.meta.as_ref().expect("meta lives until drop")
    }

    /// Queue index.
    pub fn index(&self) -> u16 {
        self.vq.index()
    }

    /// Requests submitted and not yet returned by [`BlkQueue::complete`].
    pub fn in_flight(&self) -> usize {
        self.transfers.len()
    }

    /// Submits `req` under `tag` (unique among this queue's requests in
    /// flight). Returns once every piece is on the ring; when the ring or
    /// the DMA ops' space is full it first waits for completions (kept for
    /// [`BlkQueue::complete`]).
    ///
    /// # Errors
    /// Argument errors ([`BlkError::Unaligned`], [`BlkError::OutOfRange`],
    /// [`BlkError::Empty`], [`BlkError::NotSupported`],
    /// [`BlkError::ReadOnly`], [`BlkError::DuplicateTag`], a buffer range
    /// outside the buffer) before anything is queued; queue, DMA and
    /// transport errors after (pieces already queued still complete under
    /// `tag`, with the error).
    pub fn submit(&mut self, req: Request<'_>, tag: u64) -> Result<()> {
        if self.transfers.contains_key(&tag) {
            return Err(BlkError::DuplicateTag { tag });
        }
        let pieces = self.cut(&req)?;
        self.transfers.insert(
            tag,
            Transfer {
                pending: 0,
                submitting: true,
                error: None,
            },
        );
        let mut result = Ok(());
        for p in pieces {
            if let Err(e) = self.submit_piece(&req, &p, tag) {
                result = Err(e);
                break;
            }
            if let Some(t) = self.transfers.get_mut(&tag) {
                t.pending += 1;
            }
        }
        if self.vq.should_notify() {
            if let Err(e) = self.transport.notify(self.vq.index()) {
                result = result.and(Err(e.into()));
            }
        }
        let t = self.transfers.get_mut(&tag).expect("inserted above");
        t.submitting = false;
        if let Err(e) = result {
            if t.pending == 0 {
                self.transfers.remove(&tag);
                return Err(e);
            }
            t.error.get_or_insert(e);
        } else if t.pending == 0 {
            self.finish(tag);
        }
        Ok(())
    }

    /// Checks `req` and cuts it into virtio requests.
    fn cut(&self, req: &Request<'_>) -> Result<Vec<PieceSpec>> {
        let cap = self.config.capacity_bytes();
        let check = |offset: u64, len: u64| -> Result<()> {
            if len == 0 {
                return Err(BlkError::Empty);
            }
            if offset % SECTOR != 0 || len % SECTOR != 0 {
                return Err(BlkError::Unaligned { offset, len });
            }
            match offset.checked_add(len) {
                Some(end) if end <= cap => Ok(()),
                _ => Err(BlkError::OutOfRange {
                    offset,
                    len,
                    capacity: cap,
                }),
            }
        };
        let max_descs = u32::from(self.vq.size()).min(if self.indirect {
            INDIRECT_MAX as u32
        } else {
            u32::MAX
        });
        Ok(match *req {
            Request::Read {
                offset,
                buf,
                buf_offset,
                len,
            }
            | Request::Write {
                offset,
                buf,
                buf_offset,
                len,
            } => {
                check(offset, len as u64)?;
                buf.check_range(buf_offset, len)?;
                if matches!(req, Request::Write { .. }) && self.config.read_only {
                    return Err(BlkError::ReadOnly);
                }
                let max_map = self.vq.ops().max_mapping_size() as u64;
                plan(
                    len as u64,
                    &self.config,
                    max_map,
                    max_descs,
                    u64::from(self.config.blk_size),
                )
                .ok_or(BlkError::Limits {
                    size_max: self.config.size_max,
                    seg_max: self.config.seg_max,
                    max_map,
                })?
                .into_iter()
                .map(|c| PieceSpec::Data {
                    sector: (offset + c.offset) / SECTOR,
                    buf_offset: buf_offset + c.offset as usize,
                    segs: c.segs,
                })
                .collect()
            }
            Request::Flush => {
                if !self.config.flush {
                    return Err(BlkError::NotSupported { what: "flush" });
                }
                vec![PieceSpec::Flush]
            }
            Request::Discard { offset, len } | Request::WriteZeroes { offset, len, .. } => {
                let (limits, kind, unmap, what) = match *req {
                    Request::Discard { .. } => {
                        (self.config.discard, req_type::DISCARD, false, "discard")
                    }
                    Request::WriteZeroes { unmap, .. } => (
                        self.config.write_zeroes,
                        req_type::WRITE_ZEROES,
                        unmap && self.config.write_zeroes_may_unmap,
                        "write-zeroes",
                    ),
                    _ => unreachable!("matched above"),
                };
                let limits = limits.ok_or(BlkError::NotSupported { what })?;
                if self.config.read_only {
                    return Err(BlkError::ReadOnly);
                }
                check(offset, len)?;
                let mut out = Vec::new();
                let mut sector = offset / SECTOR;
                let mut left = len / SECTOR;
                while left > 0 {
                    let n = left.min(u64::from(limits.max_sectors));
                    out.push(PieceSpec::Range {
                        kind,
                        sector,
                        // `n <= max_sectors`, a u32.
                        sectors: n as u32,
                        unmap,
                    });
                    sector += n;
                    left -= n;
                }
                out
            }
        })
    }

    /// Puts one virtio request on the ring, waiting for room if needed.
    fn submit_piece(&mut self, req: &Request<'_>, p: &PieceSpec, tag: u64) -> Result<()> {
        loop {
            if self.free_slots.is_empty() {
                self.reap_blocking()?;
                continue;
            }
            // With requests of ours in flight, fail fast and reap them to get
            // room back; with none, the room (bounce slots, IOVAs) is held by
            // other queues of the same ops: wait for them to free it.
            let wait = if self.vq.in_flight() > 0 {
                MapWait::Fail
            } else {
                MapWait::Timeout(self.timeout)
            };
            match self.try_add(req, p, tag, wait) {
                Ok(()) => return Ok(()),
                Err(BlkError::Virtio(iopath_virtio::Error::QueueFull { .. }))
                | Err(BlkError::Virtio(iopath_virtio::Error::Dma(iopath_dma::Error::NoSpace {
                    ..
                })))
                | Err(BlkError::Dma(iopath_dma::Error::NoSpace { .. }))
                    if self.vq.in_flight() > 0 =>
                {
                    // Room comes back as requests complete.
                    self.reap_blocking()?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn try_add(&mut self, req: &Request<'_>, p: &PieceSpec, tag: u64, wait: MapWait) -> Result<()> {
        let slot = *self.free_slots.last().expect("checked by caller");
        let base = usize::from(slot) * META_SLOT;
        let meta = self.meta.as_ref().expect("meta lives until drop");
        let (kind, sector) = match *p {
            PieceSpec::Data { sector, .. } => (
                if matches!(req, Request::Write { .. }) {
                    req_type::OUT
                } else {
                    req_type::IN
                },
                sector,
            ),
            PieceSpec::Flush => (req_type::FLUSH, 0),
            PieceSpec::Range {
                kind,
                sector,
                sectors,
                unmap,
            } => {
                meta.buffer()
                    .write_at(base + META_RANGE, &range(sector, sectors, unmap))?;
                (kind, sector)
            }
            PieceSpec::GetId => (req_type::GET_ID, 0),
        };
        meta.buffer().write_at(base, &header(kind, sector))?;
        meta.buffer()
            .write_at(base + META_STATUS, &[STATUS_UNSET])?;
        let hdr = Seg::coherent(meta, base, HEADER_LEN);
        let status = Seg::coherent(meta, base + META_STATUS, 1);
        let mut data: Vec<Seg<'_>> = Vec::new();
        if let PieceSpec::Data {
            buf_offset, segs, ..
        } = p
        {
            let buf = match req {
                Request::Read { buf, .. } | Request::Write { buf, .. } => *buf,
                _ => unreachable!("data pieces come from reads and writes"),
            };
            let mut at = *buf_offset;
            for &s in segs {
                data.push(Seg::buf(buf, at, s as usize));
                at += s as usize;
            }
        }
        let (out, inp): (Vec<Seg<'_>>, Vec<Seg<'_>>) = match (kind, p) {
            (req_type::OUT, _) => (std::iter::once(hdr).chain(data).collect(), vec![status]),
            (req_type::IN, _) => (vec![hdr], data.into_iter().chain([status]).collect()),
            (_, PieceSpec::Range { .. }) => (
                vec![hdr, Seg::coherent(meta, base + META_RANGE, RANGE_LEN)],
                vec![status],
            ),
            (_, PieceSpec::GetId) => (
                vec![hdr],
                vec![Seg::coherent(meta, base + META_ID, ID_LEN), status],
            ),
            _ => (vec![hdr], vec![status]),
        };
        self.vq.add_wait(&out, &inp, u64::from(slot), wait)?;
        self.free_slots.pop();
        self.pieces[usize::from(slot)] = Some(Piece { tag, kind, sector });
        Ok(())
    }

    /// Takes every completion the device has published. Returns how many.
    fn reap(&mut self) -> Result<usize> {
        let mut n = 0;
        while let Some(c) = self.vq.pop_used()? {
            n += 1;
            let slot = c.token as usize;
            let Some(piece) = self.pieces.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            self.free_slots.push(slot as u16);
            let mut st = [0u8; 1];
            self.meta()
                .buffer()
                .read_at(slot * META_SLOT + META_STATUS, &mut st)?;
            let outcome = match st[0] {
                S_OK => Ok(()),
                S_IOERR => Err(BlkError::IoError {
                    sector: piece.sector,
                }),
                S_UNSUPP => Err(BlkError::Unsupported { kind: piece.kind }),
                other => Err(BlkError::BadStatus {
                    status: other,
                    kind: piece.kind,
                }),
            };
            let Some(t) = self.transfers.get_mut(&piece.tag) else {
                continue;
            };
            t.pending -= 1;
            if let Err(e) = outcome {
                t.error.get_or_insert(e);
            }
            if t.pending == 0 && !t.submitting {
                self.finish(piece.tag);
            }
        }
        Ok(n)
    }

    fn finish(&mut self, tag: u64) {
        if let Some(t) = self.transfers.remove(&tag) {
            self.done.push_back(Done {
                tag,
                result: t.error.map_or(Ok(()), Err),
            });
        }
    }

    /// Waits (interrupt-driven, up to the timeout) until at least one
    /// completion was taken.
    fn reap_blocking(&mut self) -> Result<()> {
        // Whatever was queued but not yet announced must be, or the wait
        // below would be for requests the device never heard of.
        if self.vq.should_notify() {
            self.transport.notify(self.vq.index())?;
        }
        loop {
            if self.reap()? > 0 {
                return Ok(());
            }
            // §2.7.10: re-arm, then re-check before sleeping.
            if !self.vq.enable_interrupts() {
                continue;
            }
            if !self
                .transport
                .wait_interrupt(self.vq.index(), Some(self.timeout))?
                && !self.vq.has_used()
            {
                return Err(BlkError::Timeout {
                    queue: self.vq.index(),
                    timeout: self.timeout,
                });
            }
        }
    }

    /// Returns a finished request without waiting, if there is one.
    ///
    /// # Errors
    /// Queue errors (a device breaking the ring).
    pub fn try_complete(&mut self) -> Result<Option<Done>> {
        if self.done.is_empty() {
            self.reap()?;
        }
        Ok(self.done.pop_front())
    }

    /// Waits for the next finished request.
    ///
    /// # Errors
    /// [`BlkError::Timeout`] if nothing completes in time (or nothing is in
    /// flight), queue and transport errors.
    pub fn complete(&mut self) -> Result<Done> {
        loop {
            if let Some(d) = self.try_complete()? {
                return Ok(d);
            }
            if self.transfers.is_empty() {
                return Err(BlkError::Timeout {
                    queue: self.vq.index(),
                    timeout: Duration::ZERO,
                });
            }
            self.reap_blocking()?;
        }
    }

    /// Submits `req` and waits for it (other requests' completions are kept).
    ///
    /// # Errors
    /// As [`BlkQueue::submit`] and the request's outcome.
    pub fn run(&mut self, req: Request<'_>) -> Result<()> {
        let tag = u64::MAX - 1;
        self.submit(req, tag)?;
        self.wait_tag(tag)
    }

    fn wait_tag(&mut self, tag: u64) -> Result<()> {
        loop {
            if let Some(i) = self.done.iter().position(|d| d.tag == tag) {
                return self.done.remove(i).expect("index from position").result;
            }
            self.reap_blocking()?;
        }
    }

    /// `GET_ID` on this queue.
    ///
    /// # Errors
    /// As [`BlkDriver::get_id`].
    pub fn get_id(&mut self) -> Result<Vec<u8>> {
        let tag = u64::MAX - 2;
        if self.transfers.contains_key(&tag) {
            return Err(BlkError::DuplicateTag { tag });
        }
        self.transfers.insert(
            tag,
            Transfer {
                pending: 0,
                submitting: true,
                error: None,
            },
        );
        if let Err(e) = self.submit_piece(&Request::Flush, &PieceSpec::GetId, tag) {
            self.transfers.remove(&tag);
            return Err(e);
        }
        // The slot used is the one whose piece carries `tag`.
        let slot = self
            .pieces
            .iter()
            .position(|p| p.is_some_and(|p| p.tag == tag))
            .expect("piece just added");
        if let Some(t) = self.transfers.get_mut(&tag) {
            t.pending = 1;
            t.submitting = false;
        }
        if self.vq.should_notify() {
            self.transport.notify(self.vq.index())?;
        }
        self.wait_tag(tag)?;
        let mut id = [0u8; ID_LEN];
        self.meta()
            .buffer()
            .read_at(slot * META_SLOT + META_ID, &mut id)?;
        let end = id.iter().position(|&b| b == 0).unwrap_or(ID_LEN);
        Ok(id[..end].to_vec())
    }
}

impl<O: DmaOps + ?Sized> Drop for BlkQueue<O> {
    fn drop(&mut self) {
        if let Some(meta) = self.meta.take() {
            if let Err(e) = self.vq.ops().free_coherent(meta) {
                tracing::warn!(error = %e, "virtio-blk: freeing request metadata failed");
            }
        }
    }
}

/// One virtio request to build.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PieceSpec {
    Data {
        sector: u64,
        buf_offset: usize,
        segs: Vec<u32>,
    },
    Flush,
    Range {
        kind: u32,
        sector: u64,
        sectors: u32,
        unmap: bool,
    },
    GetId,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// qemu-storage-daemon 10.0's config space, as read from a 24 MiB export
    /// with two queues.
    const QSD_CONFIG: [u8; CONFIG_LEN] = [
        0x00, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7e, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x80, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    const QSD_FEATURES: u64 = 0x1_7500_7e46;

    #[test]
    fn parses_qemu_storage_daemon_config() {
        let c = DeviceConfig::parse(&QSD_CONFIG, QSD_FEATURES);
        assert_eq!(c.capacity, 49152);
        assert_eq!(c.capacity_bytes(), 24 << 20);
        assert_eq!(c.size_max, None, "size_max 0 means no limit");
        assert_eq!(c.seg_max, Some(126));
        assert_eq!(c.blk_size, 512);
        assert_eq!(c.num_queues, 2);
        assert_eq!(
            c.discard,
            Some(RangeLimits {
                max_sectors: 32768,
                max_segs: 1,
                alignment: 1
            })
        );
        assert_eq!(c.write_zeroes.map(|w| w.max_sectors), Some(32768));
        assert!(c.flush);
        assert!(!c.read_only);
    }

    #[test]
    fn fields_of_unnegotiated_features_are_ignored() {
        let c = DeviceConfig::parse(&QSD_CONFIG, features::VERSION_1);
        assert_eq!(c.seg_max, None);
        assert_eq!(c.num_queues, 1);
        assert_eq!(c.discard, None);
        assert!(!c.flush);
    }

    #[test]
    fn header_layout() {
        assert_eq!(
            header(req_type::OUT, 0x0102_0304_0506_0708),
            [1, 0, 0, 0, 0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1]
        );
        assert_eq!(
            range(2, 3, true),
            [2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0]
        );
    }

    fn cfg(size_max: Option<u32>, seg_max: Option<u32>) -> DeviceConfig {
        let mut c = DeviceConfig::parse(&QSD_CONFIG, QSD_FEATURES);
        c.size_max = size_max;
        c.seg_max = seg_max;
        c
    }

    #[test]
    fn plan_splits_by_size_and_segment_limits() {
        // 8 MiB, 64 KiB segments, 4 segments per request: 32 requests of
        // 256 KiB each, four segments apiece.
        let p = plan(8 << 20, &cfg(Some(64 << 10), Some(4)), u64::MAX, 256, 512).unwrap();
        assert_eq!(p.len(), 32);
        assert!(p
            .iter()
            .all(|c| c.len == 256 << 10 && c.segs == vec![64 << 10; 4]));
        assert_eq!(p[31].offset, 31 * (256 << 10));
        // No limits: one request, one segment.
        let p = plan(8 << 20, &cfg(None, None), u64::MAX, 256, 512).unwrap();
        assert_eq!(
            p,
            vec![Chunk {
                offset: 0,
                len: 8 << 20,
                segs: vec![8 << 20]
            }]
        );
        // The DMA ops' largest mapping (a 1 MiB bounce window) bounds it too.
        let p = plan(3 << 20, &cfg(None, Some(126)), 1 << 20, 256, 512).unwrap();
        assert_eq!(p.len(), 3);
        // Limits that cannot carry one 512-byte block: refused, not split
        // at an unaligned offset.
        assert_eq!(
            plan(4096, &cfg(Some(100), Some(2)), u64::MAX, 256, 512),
            None
        );
        assert_eq!(plan(4096, &cfg(None, None), 256, 256, 512), None);
        // A 4 KiB block device with 3 KiB x 2 segments: 4 KiB requests.
        let p = plan(16384, &cfg(Some(3072), Some(2)), u64::MAX, 256, 4096).unwrap();
        assert!(p
            .iter()
            .all(|c| c.len == 4096 && c.segs == vec![3072, 1024]));
    }

    proptest! {
        #[test]
        fn plan_covers_the_transfer_within_limits(
            len in 1u64..(64 << 20),
            size_max in proptest::option::of(512u32..(4 << 20)),
            seg_max in proptest::option::of(1u32..300),
            max_map in 4096u64..(16 << 20),
            max_descs in 3u32..1024,
        ) {
            let c = cfg(size_max, seg_max);
            let p = plan(len, &c, max_map, max_descs, 512).unwrap();
            let mut next = 0;
            for (i, ch) in p.iter().enumerate() {
                prop_assert_eq!(ch.offset, next);
                prop_assert!(ch.len <= max_map);
                prop_assert_eq!(ch.segs.iter().map(|&s| u64::from(s)).sum::<u64>(), ch.len);
                prop_assert!(ch.segs.len() as u32 <= max_descs - 2);
                if let Some(sm) = seg_max { prop_assert!(ch.segs.len() as u32 <= sm); }
                if let Some(sz) = size_max { prop_assert!(ch.segs.iter().all(|&s| s <= sz)); }
                if i + 1 < p.len() { prop_assert_eq!(ch.len % 512, 0); }
                next += ch.len;
            }
            prop_assert_eq!(next, len);
        }
    }
}
