//! The virtio-blk driver: a block-device API over any virtio transport and
//! any DMA ops.
//!
//! A [`Command`] (read, write, flush, discard, write-zeroes) is cut into
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
//!
//! This module sets the device up ([`BlkDriver`]: features, ops from the
//! platform policy, queues, shared memory) and holds the API types; the
//! queue that runs requests is [`BlkQueue`] (`queue.rs`), the commands it
//! takes are in `command.rs` and its errors in `error.rs`, the cutting of a
//! transfer into virtio requests is pure code in `plan.rs`, the wire
//! layouts are in `wire.rs`, and the config space is read by
//! [`DeviceConfig`] (`config.rs`).

use std::sync::Arc;
use std::time::Duration;

use iopath_dma::{DmaOps, IotlbRecord, Perm};
use iopath_heap::Buffer;
use iopath_virtio::driver as vdriver;
use iopath_virtio::{Policy, PolicyOps, PollMode, QueueFeatures, SplitQueue, Transport};

pub use crate::command::{Command, Done};
pub use crate::config::{DeviceConfig, RangeLimits};
pub use crate::error::{BlkError, Result};
pub use crate::queue::BlkQueue;
use crate::wire::CONFIG_LEN;

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
    /// How a queue waits for completions: poll the used ring for a
    /// while, then sleep on the interrupt; never sleep; or sleep at once.
    pub poll: PollMode,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            queues: 1,
            queue_size: 256,
            timeout: Duration::from_secs(30),
            event_idx: true,
            indirect: true,
            poll: PollMode::default(),
        }
    }
}

/// Virtio device id of a block device (`VIRTIO_ID_BLOCK`).
pub use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK as DEVICE_ID_BLOCK;

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
        let negotiated = vdriver::negotiate(&*transport, wanted, required)?;
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
            let meta = crate::queue::META_SLOT;
            let vq = SplitQueue::with_area(Arc::clone(&ops), i, size, qf, meta)?;
            transport.setup_queue(i, &vq.config())?;
            queues.push(BlkQueue::new(
                Arc::clone(&transport),
                config,
                vq,
                opts.timeout,
                qf.indirect,
                opts.poll,
            ));
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
        vdriver::driver_ok(&*drv.transport)?;
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
        self.queues[0].run(Command::Read {
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
        self.queues[0].run(Command::Write {
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
        self.queues[0].run(Command::Flush)
    }

    /// Discards `len` bytes at `offset`.
    ///
    /// # Errors
    /// [`BlkError::NotSupported`] without `DISCARD`; as [`BlkDriver::read`].
    pub fn discard(&mut self, offset: u64, len: u64) -> Result<()> {
        self.queues[0].run(Command::Discard { offset, len })
    }

    /// Zeroes `len` bytes at `offset`.
    ///
    /// # Errors
    /// [`BlkError::NotSupported`] without `WRITE_ZEROES`; as
    /// [`BlkDriver::read`].
    pub fn write_zeroes(&mut self, offset: u64, len: u64, unmap: bool) -> Result<()> {
        self.queues[0].run(Command::WriteZeroes { offset, len, unmap })
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
