//! What a virtio device model implements to be served over vhost-user:
//! its features, queues and config space, and the loop that serves one
//! started queue.

use virtio_queue::Queue;

use super::queue_context::QueueContext;

/// A virtio device model served over vhost-user.
pub trait VirtioDevice: Send + Sync + 'static {
    /// The virtio feature bits the device offers (without
    /// `VHOST_USER_F_PROTOCOL_FEATURES`, which the server adds).
    fn features(&self) -> u64;
    /// Number of virtqueues.
    fn num_queues(&self) -> usize;
    /// Largest queue size accepted from the front end.
    fn max_queue_size(&self) -> u16;
    /// Bytes `offset..offset + len` of the device configuration space;
    /// must return exactly `len` bytes (zeros past the end of the layout).
    fn read_config(&self, offset: u32, len: u32) -> Vec<u8>;
    /// Serves one started virtqueue until [`QueueContext::wait`] reports
    /// [`Wake::stop`](super::Wake::stop); then finishes what is in flight
    /// and returns the queue (its indices are kept for the next start).
    fn run_queue(&self, ctx: QueueContext) -> Queue;
}
