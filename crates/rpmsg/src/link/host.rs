//! The host role: the virtio driver side.
//!
//! The host owns every buffer: `num` buffers per ring from the pool in the
//! shared memory ([`ResourceTable::buffer_pool_for`]), those of vq0 (rx)
//! pre-posted device-writable, those of vq1 used for sends (tx); 512
//! bytes each unless the remote offered other sizes ([`crate::bufsz`]).
//! It negotiates features through the vdev's `gfeatures` word and sets
//! DRIVER_OK in its status byte, as Linux's remoteproc and OpenAMP's
//! driver role do.
//!
//! The rings are the workspace's one driver-side virtqueue,
//! `iopath_virtio::SplitQueue`, placed where the resource table says
//! (legacy layout, `RingPlacement`), and every buffer goes through the DMA
//! ops: `iopath_dma::Direct` with the shared memory registered at device
//! address 0, so a buffer's device address is its offset in the file. The
//! shared memory itself is one heap `Buffer`. Ring fields are little-endian:
//! legacy virtio is native-endian and iopath supports little-endian machines
//! only here.

use std::sync::Arc;

use iopath_dma::{Coherent, Direct};
use iopath_virtio::{Platform, Policy, PolicyOps, QueueFeatures, RingPlacement, Seg, SplitQueue};

use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

use crate::bufsz::{self, BufSizes, Convention, VIRTIO_RPMSG_F_BUFSZ};
use crate::link::{Held, Link, LinkError, LinkMemory, Slot};
use crate::role::Role;
use crate::rsc_table::{status, ResourceTable, VringRsc};
use crate::shm::SharedMem;
use crate::wire::VIRTIO_RPMSG_F_NS;

/// Features the host accepts when the remote offers them: the name
/// service, `EVENT_IDX`, and buffer sizes (bit 1 stands for the
/// negotiation under whichever [`Convention`] the host speaks).
pub const HOST_FEATURES: u32 =
    (1 << VIRTIO_RPMSG_F_NS) | (1 << VIRTIO_RING_F_EVENT_IDX) | (1 << VIRTIO_RPMSG_F_BUFSZ);

/// How a host takes a device over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostOptions {
    /// Features accepted when offered ([`HOST_FEATURES`] by default).
    pub features: u32,
    /// How buffer sizes are negotiated.
    pub convention: Convention,
    /// The sizes used under [`Convention::Fixed`] (ignored otherwise).
    pub fixed: BufSizes,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            features: HOST_FEATURES,
            convention: Convention::Linux,
            fixed: BufSizes::DEFAULT,
        }
    }
}

fn queue_err(q: &str) -> impl FnOnce(iopath_virtio::Error) -> LinkError + '_ {
    move |e| LinkError::Broken(format!("{q}: {e}"))
}

/// The driver side of an rpmsg link.
#[derive(Debug)]
pub struct HostLink {
    shm: SharedMem,
    /// The same memory, as the bus reads and writes it.
    mem: Arc<dyn LinkMemory>,
    table: ResourceTable,
    features: u32,
    /// vq0: the remote's messages land in these pre-posted buffers.
    rx: SplitQueue<Direct>,
    /// vq1: our messages.
    tx: SplitQueue<Direct>,
    pool: u64,
    sizes: BufSizes,
    tx_free: Vec<u16>,
    /// Buffers were added to rx / tx since the last kick decision.
    rx_added: bool,
    tx_added: bool,
    /// A send found every tx buffer with the remote: it is asked to kick
    /// when it gives one back (otherwise sent buffers come back unannounced).
    tx_wanted: bool,
}

fn placed(
    ops: &Arc<Direct>,
    shm: &SharedMem,
    index: u16,
    r: &VringRsc,
    features: QueueFeatures,
) -> Result<SplitQueue<Direct>, LinkError> {
    let place = RingPlacement {
        // The whole shared memory, at device address 0 (as registered).
        mem: Coherent::new(shm.buffer().clone(), 0),
        offset: r.da as usize,
        align: r.align as usize,
    };
    SplitQueue::with_placement(Arc::clone(ops), index, r.num as u16, features, place)
        .map_err(|e| LinkError::Queue(format!("vq{index}: {e}")))
}

impl HostLink {
    /// Takes the device over: negotiates features, sets up both rings,
    /// pre-posts every rx buffer, then sets DRIVER_OK. The caller kicks the
    /// remote afterwards.
    ///
    /// # Errors
    /// [`LinkError::Shm`] (table refused, region too small),
    /// [`LinkError::Queue`].
    pub fn start(shm: SharedMem, features: u32) -> Result<Self, LinkError> {
        Self::start_with(
            shm,
            &HostOptions {
                features,
                ..HostOptions::default()
            },
        )
    }

    /// As [`HostLink::start`], with the buffer-size convention of `opts`.
    /// A device whose buffer-size offer is refused gets FAILED in its
    /// status byte.
    ///
    /// # Errors
    /// As [`HostLink::start`]; [`LinkError::BufSize`] when the offer is
    /// refused.
    pub fn start_with(shm: SharedMem, opts: &HostOptions) -> Result<Self, LinkError> {
        let table = shm.table(0)?;
        let v = &table.vdev;
        let st = v.status_offset() as u64;
        shm.store_u8(st, 0)?;
        shm.store_u8(st, status::ACKNOWLEDGE | status::DRIVER)?;
        let negotiated = bufsz::host_negotiate(
            v.dfeatures,
            opts.features,
            opts.convention,
            &v.config,
            opts.fixed,
        )
        .and_then(|(f, sizes)| {
            let (pool, _) = table.buffer_pool_for(shm.len() as u64, sizes)?;
            Ok((f, sizes, pool))
        });
        let (features, sizes, pool) = match negotiated {
            Ok(n) => n,
            Err(e) => {
                shm.store_u8(st, status::ACKNOWLEDGE | status::DRIVER | status::FAILED)?;
                return Err(LinkError::BufSize(e));
            }
        };
        shm.write_u32(v.gfeatures_offset() as u64, features)?;
        let qf = QueueFeatures {
            event_idx: features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0,
            indirect: false,
        };
        // The remote reads the shared memory at the addresses the resource
        // table gives: no ACCESS_PLATFORM, so the platform policy gives
        // direct ops.
        let ops = <Direct as PolicyOps>::from_policy(&Policy::new(Platform::Direct), 0)
            .map_err(|e| LinkError::Queue(format!("DMA ops for the rings: {e}")))?;
        ops.register_at(shm.buffer(), 0)
            .map_err(|e| LinkError::Queue(format!("registering the shared memory: {e}")))?;
        let mut rx = placed(&ops, &shm, 0, &v.vrings[0], qf)?;
        let mut tx = placed(&ops, &shm, 1, &v.vrings[1], qf)?;
        // OpenAMP's device role returns sent buffers with their length.
        tx.ignore_readonly_used_len(true);
        // Sent buffers are reclaimed on the next send; no interrupt wanted
        // for them (OpenAMP suppresses tx-complete interrupts too) unless a
        // send finds none free (`tx_wanted`).
        tx.disable_interrupts();
        let rx_size = sizes.to_host as usize;
        let zero = vec![0u8; rx_size];
        for id in 0..rx.size() {
            let addr = pool + u64::from(id) * rx_size as u64;
            shm.write(addr, &zero)?;
            rx.add(
                &[],
                &[Seg::buf(shm.buffer(), addr as usize, rx_size)],
                u64::from(id),
            )
            .map_err(queue_err("vq0"))?;
        }
        rx.enable_interrupts();
        let tx_free = (0..tx.size()).rev().collect();
        shm.store_u8(
            st,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK,
        )?;
        Ok(HostLink {
            mem: Arc::new(shm.clone()),
            shm,
            table,
            features,
            rx,
            tx,
            pool,
            sizes,
            tx_free,
            rx_added: true,
            tx_added: false,
            tx_wanted: false,
        })
    }

    fn tx_addr(&self, id: u16) -> u64 {
        self.pool
            + u64::from(self.rx.size()) * u64::from(self.sizes.to_host)
            + u64::from(id) * u64::from(self.sizes.to_remote)
    }

    fn rx_addr(&self, id: u16) -> u64 {
        self.pool + u64::from(id) * u64::from(self.sizes.to_host)
    }

    /// The buffer sizes negotiated.
    pub fn buf_sizes(&self) -> BufSizes {
        self.sizes
    }

    fn reclaim(&mut self) -> Result<(), LinkError> {
        while let Some(c) = self.tx.pop_used().map_err(queue_err("vq1"))? {
            self.tx_free.push(c.token as u16);
        }
        if self.tx_wanted && !self.tx_free.is_empty() {
            self.tx_wanted = false;
            self.tx.disable_interrupts();
        }
        Ok(())
    }
}

impl Link for HostLink {
    fn role(&self) -> Role {
        Role::Host
    }

    fn memory(&self) -> &Arc<dyn LinkMemory> {
        &self.mem
    }

    fn hold_rx(&mut self) -> Result<Option<Result<Held, String>>, LinkError> {
        // The queue checks the device's id, length (at most the buffer
        // offered) and index movement; a lie breaks the link.
        let Some(c) = self.rx.pop_used().map_err(queue_err("vq0"))? else {
            return Ok(None);
        };
        Ok(Some(Ok(Held {
            token: c.token,
            addr: self.rx_addr(c.token as u16),
            len: c.len as usize,
        })))
    }

    fn release_rx(&mut self, held: Held) -> Result<(), LinkError> {
        self.rx
            .add(
                &[],
                &[Seg::buf(
                    self.shm.buffer(),
                    held.addr as usize,
                    self.sizes.to_host as usize,
                )],
                held.token,
            )
            .map_err(queue_err("vq0"))?;
        self.rx_added = true;
        Ok(())
    }

    fn get_tx(&mut self) -> Result<Option<Slot>, LinkError> {
        self.reclaim()?;
        if self.tx_free.is_empty() && !self.tx_wanted {
            // Whoever waits for a buffer hears of the first one back (a
            // kick from the remote) instead of finding it by polling; one
            // back since then is taken at once.
            self.tx_wanted = true;
            if !self.tx.enable_interrupts() {
                self.reclaim()?;
            }
        }
        Ok(self.tx_free.pop().map(|id| Slot {
            token: u64::from(id),
            addr: self.tx_addr(id),
            cap: self.sizes.to_remote as usize,
        }))
    }

    fn put_tx(&mut self, slot: Slot, len: usize) -> Result<(), LinkError> {
        if len == 0 || len > slot.cap {
            let cap = slot.cap;
            self.drop_tx(slot);
            return Err(LinkError::Broken(format!(
                "send of {len} bytes from a {cap}-byte buffer"
            )));
        }
        self.tx
            .add(
                &[Seg::buf(self.shm.buffer(), slot.addr as usize, len)],
                &[],
                slot.token,
            )
            .map_err(queue_err("vq1"))?;
        self.tx_added = true;
        Ok(())
    }

    fn drop_tx(&mut self, slot: Slot) {
        self.tx_free.push(slot.token as u16);
    }

    fn buf_size(&self) -> usize {
        self.sizes.to_remote as usize
    }

    fn rx_buf_size(&self) -> usize {
        self.sizes.to_host as usize
    }

    fn take_kick(&mut self) -> bool {
        let rx = std::mem::take(&mut self.rx_added) && self.rx.should_notify();
        let tx = std::mem::take(&mut self.tx_added) && self.tx.should_notify();
        rx || tx
    }

    fn arm(&mut self) -> Result<bool, LinkError> {
        self.reclaim()?;
        Ok(!self.rx.enable_interrupts())
    }

    fn disarm(&mut self) -> Result<(), LinkError> {
        self.rx.disable_interrupts();
        Ok(())
    }

    fn check(&mut self) -> Result<(), LinkError> {
        let st = self.shm.load_u8(self.table.vdev.status_offset() as u64)?;
        if st & (status::DEVICE_NEEDS_RESET | status::FAILED) != 0 || st & status::DRIVER_OK == 0 {
            return Err(LinkError::Reset { status: st });
        }
        Ok(())
    }

    fn features(&self) -> u32 {
        self.features
    }

    fn tx_in_flight(&mut self) -> Result<usize, LinkError> {
        self.reclaim()?;
        Ok(usize::from(self.tx.size()) - self.tx_free.len())
    }

    fn shutdown(&mut self) {
        let _ = self.shm.store_u8(self.table.vdev.status_offset() as u64, 0);
    }
}
