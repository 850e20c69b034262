//! Transports: how the driver talks to a device — status, features, config
//! space, queue addresses, notifications, and the memory the device may see.

use std::fmt;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

use iopath_dma::{DmaAddr, DmaOps, IotlbSink, SharedRegion};

use crate::{Error, Result};

pub mod loopback;
pub mod vhost_user;

/// What the device needs to know about one queue (virtio 1.x §4.1.4.3:
/// `queue_size`, `queue_desc`, `queue_driver`, `queue_device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Number of entries.
    pub size: u16,
    /// Device address of the descriptor table.
    pub desc: DmaAddr,
    /// Device address of the available (driver) ring.
    pub avail: DmaAddr,
    /// Device address of the used (device) ring.
    pub used: DmaAddr,
    /// Whether `VIRTIO_F_EVENT_IDX` was negotiated.
    pub event_idx: bool,
}

/// The driver's view of a virtio device, whatever carries it (vhost-user,
/// in-process loopback, ...). Object-safe.
pub trait Transport: Send + Sync + fmt::Debug {
    /// Virtio device id (§5: 2 block, 7 rpmsg, ...).
    fn device_id(&self) -> u32;

    /// Number of queues the device has.
    fn num_queues(&self) -> u16;

    /// Largest size of queue `index`.
    ///
    /// # Errors
    /// [`Error::NoSuchQueue`].
    fn queue_max_size(&self, index: u16) -> Result<u16>;

    /// The device's feature bits.
    ///
    /// # Errors
    /// Transport errors.
    fn device_features(&self) -> Result<u64>;

    /// Writes the driver's accepted feature bits.
    ///
    /// # Errors
    /// Transport errors.
    fn set_driver_features(&self, features: u64) -> Result<()>;

    /// Device status (§2.1).
    ///
    /// # Errors
    /// Transport errors.
    fn status(&self) -> Result<u8>;

    /// Writes device status; 0 resets the device (§2.1, §3.1.1).
    ///
    /// # Errors
    /// Transport errors.
    fn set_status(&self, status: u8) -> Result<()>;

    /// Reads device config space at `offset`.
    ///
    /// # Errors
    /// Transport errors (out-of-range reads included).
    fn read_config(&self, offset: u32, data: &mut [u8]) -> Result<()>;

    /// Writes device config space at `offset`.
    ///
    /// # Errors
    /// Transport errors.
    fn write_config(&self, offset: u32, data: &[u8]) -> Result<()>;

    /// Shares `regions` with the device (replacing what was shared before):
    /// vhost-user `SET_MEM_TABLE`.
    ///
    /// # Errors
    /// Transport errors; [`Error::MapRegion`] when the device cannot map one.
    fn set_memory(&self, regions: &[SharedRegion]) -> Result<()>;

    /// Where IOTLB records go, if this transport can enforce them
    /// (vhost-user with `VHOST_USER_PROTOCOL_F_IOTLB`, loopback).
    fn iotlb_sink(&self) -> Option<Arc<dyn IotlbSink>>;

    /// Gives the device queue `index` and enables it.
    ///
    /// # Errors
    /// [`Error::NoSuchQueue`], [`Error::BadQueueSize`], transport errors.
    fn setup_queue(&self, index: u16, config: &QueueConfig) -> Result<()>;

    /// Notifies the device that queue `index` has new buffers (a kick).
    ///
    /// # Errors
    /// Transport errors.
    fn notify(&self, index: u16) -> Result<()>;

    /// Waits for a used-buffer notification (an interrupt) on queue `index`,
    /// at most `timeout` (forever if `None`). Returns whether one came; it is
    /// consumed.
    ///
    /// # Errors
    /// [`Error::NoSuchQueue`], transport errors, [`Error::Closed`].
    fn wait_interrupt(&self, index: u16, timeout: Option<Duration>) -> Result<bool>;

    /// [`Transport::wait_interrupt`] that leaves the interrupt pending, for
    /// [`Transport::take_interrupt`] to consume later: a driver that takes
    /// it just before it sleeps again keeps that step (a system call on an
    /// eventfd) off the path from a completion to its next request.
    /// Returns whether one is pending. By default it is consumed at once.
    ///
    /// # Errors
    /// As [`Transport::wait_interrupt`].
    fn wait_interrupt_pending(&self, index: u16, timeout: Option<Duration>) -> Result<bool> {
        self.wait_interrupt(index, timeout)
    }

    /// Consumes a pending interrupt of queue `index` without waiting;
    /// returns whether there was one.
    ///
    /// # Errors
    /// [`Error::NoSuchQueue`], transport errors.
    fn take_interrupt(&self, index: u16) -> Result<bool> {
        self.wait_interrupt(index, Some(Duration::ZERO))
    }

    /// A pollable fd that becomes readable on interrupts of queue `index`
    /// (an eventfd), for event loops; read it (8 bytes) to consume.
    fn interrupt_fd(&self, index: u16) -> Option<BorrowedFd<'_>>;

    /// The device's process, when it is another process on this machine
    /// and the transport can tell (a vhost-user socket's `SO_PEERCRED`):
    /// a [`crate::Poller`] looks where it may run.
    fn peer(&self) -> Option<rustix::process::Pid> {
        None
    }
}

/// Connects DMA ops to a transport: hooks up the IOTLB enforcer when the ops
/// translate, then shares the ops' regions. Call after allocating the queues
/// (their rings are regions too) and again whenever
/// [`DmaOps::regions_generation`] changes (e.g. after registering buffers).
///
/// # Errors
/// [`Error::NoIotlb`] when the ops need an enforcer the transport lacks;
/// transport and DMA errors.
pub fn share_memory<O: DmaOps + ?Sized>(transport: &dyn Transport, ops: &O) -> Result<()> {
    if ops.uses_iotlb() {
        let sink = transport.iotlb_sink().ok_or(Error::NoIotlb)?;
        transport.set_memory(&ops.regions())?;
        ops.set_iotlb_sink(sink)?;
    } else {
        transport.set_memory(&ops.regions())?;
    }
    Ok(())
}
