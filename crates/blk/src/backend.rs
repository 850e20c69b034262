//! The vhost-user-blk back end: serves a raw image file.
//!
//! This module is the glue between the image (`image.rs`) and the
//! vhost-user server: it opens the image (`O_DIRECT` when the file system
//! allows it), presents the device (features, config space, queues) and
//! gives each started queue to an executor (`executor.rs`) on that queue's
//! worker thread.
//! There requests are parsed ([`crate::request::Request::parse`]), reads
//! and writes go to the image through io_uring straight from and into the
//! front end's memory when the buffers suit `O_DIRECT` (else through an
//! aligned staging buffer), flushes as `fdatasync`; completions fill in the
//! status byte and the used ring. On a file system that cannot read
//! without blocking (tmpfs: io_uring would hand every request to a worker
//! thread) reads and writes of up to 128 KiB are copied inline instead.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iopath_virtio::device::{
    QueueContext, VirtioDevice, VIRTIO_F_ACCESS_PLATFORM, VIRTIO_F_VERSION_1,
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use iopath_virtio::PollMode;
use virtio_queue::{Queue, QueueT};

use crate::config::{
    BlkConfig, VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_MQ,
    VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX, VIRTIO_BLK_F_WRITE_ZEROES,
};
use crate::executor::Executor;
use crate::image::{self, Image};
use crate::request::Limits;
use crate::wire::{SECTOR_SIZE, VIRTIO_BLK_ID_BYTES};

/// Largest queue accepted from a front end.
const MAX_QUEUE_SIZE: u16 = 1024;
const SEG_MAX: u32 = 126;
const SIZE_MAX: u32 = 4 << 20;
const MAX_DISCARD_SEG: u32 = 32;
/// Most sectors per discard / write-zeroes range (4 GiB - 512 bytes).
const MAX_RANGE_SECTORS: u32 = (u32::MAX / SECTOR_SIZE as u32) & !7;

/// Errors of the blk back end.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The image could not be opened.
    #[error("Cannot open image {path}")]
    Open {
        /// The image path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The image is smaller than one sector or not a regular file.
    #[error("Image {path} is not a regular file of at least 512 bytes")]
    NotAnImage {
        /// The image path.
        path: PathBuf,
    },
    /// Zero queues, or more than the protocol allows.
    #[error("Queue count {queues} is not in 1..=64")]
    Queues {
        /// The requested count.
        queues: usize,
    },
}

/// How to serve an image.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct BlkOptions {
    /// Number of request queues (one worker thread each).
    pub queues: usize,
    /// Refuse writes (`VIRTIO_BLK_F_RO`).
    pub readonly: bool,
    /// How each queue thread waits for requests: poll the available ring
    /// for a while after work, then sleep on kicks; never sleep; or sleep
    /// at once.
    pub poll: PollMode,
}

impl Default for BlkOptions {
    fn default() -> Self {
        Self {
            queues: 1,
            readonly: false,
            poll: PollMode::default(),
        }
    }
}

/// A virtio-blk device serving a raw image file; give it to
/// [`iopath_virtio::device::VhostUserServer`].
#[derive(Debug)]
pub struct BlkBackend {
    image: Arc<Image>,
    config: BlkConfig,
    options: BlkOptions,
    id: [u8; VIRTIO_BLK_ID_BYTES],
}

impl BlkBackend {
    /// Opens `path` for serving: with `O_DIRECT` when the file system
    /// allows it, buffered otherwise. The capacity is the file size rounded
    /// down to whole sectors.
    ///
    /// # Errors
    /// [`BackendError::Open`] when the file cannot be opened (read-write unless
    /// `readonly`), [`BackendError::NotAnImage`] for a directory, device-less
    /// or sub-sector file, [`BackendError::Queues`] for a bad queue count.
    pub fn open(path: &Path, options: BlkOptions) -> Result<Self, BackendError> {
        if options.queues == 0 || options.queues > 64 {
            return Err(BackendError::Queues {
                queues: options.queues,
            });
        }
        let open_err = |source| BackendError::Open {
            path: path.to_owned(),
            source,
        };
        let (file, direct) = image::open(path, options.readonly).map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        let capacity = meta.len() / SECTOR_SIZE;
        if !meta.is_file() || capacity == 0 {
            return Err(BackendError::NotAnImage {
                path: path.to_owned(),
            });
        }
        let limits = Limits {
            capacity,
            readonly: options.readonly,
            max_discard_sectors: MAX_RANGE_SECTORS,
            max_discard_seg: MAX_DISCARD_SEG,
            max_write_zeroes_sectors: MAX_RANGE_SECTORS,
            max_write_zeroes_seg: MAX_DISCARD_SEG,
        };
        let config = BlkConfig {
            capacity,
            size_max: SIZE_MAX,
            seg_max: SEG_MAX,
            blk_size: SECTOR_SIZE as u32,
            num_queues: options.queues as u16,
            max_discard_sectors: MAX_RANGE_SECTORS,
            max_discard_seg: MAX_DISCARD_SEG,
            discard_sector_alignment: 1,
            max_write_zeroes_sectors: MAX_RANGE_SECTORS,
            max_write_zeroes_seg: MAX_DISCARD_SEG,
            write_zeroes_may_unmap: true,
        };
        let mut id = [0u8; VIRTIO_BLK_ID_BYTES];
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let label = format!("iopath:{name}");
        let n = label.len().min(VIRTIO_BLK_ID_BYTES);
        id[..n].copy_from_slice(&label.as_bytes()[..n]);
        Ok(Self {
            image: Arc::new(Image {
                nowait: image::reads_nowait(&file),
                file,
                direct,
                limits,
            }),
            config,
            options,
            id,
        })
    }

    /// The configuration space the device presents.
    pub fn config(&self) -> &BlkConfig {
        &self.config
    }

    /// Whether the image is accessed with `O_DIRECT`.
    pub fn direct_io(&self) -> bool {
        self.image.direct
    }

    /// The `GET_ID` string (zero-padded).
    pub fn id(&self) -> &[u8; VIRTIO_BLK_ID_BYTES] {
        &self.id
    }
}

impl VirtioDevice for BlkBackend {
    fn features(&self) -> u64 {
        let mut f = VIRTIO_F_VERSION_1
            | VIRTIO_F_ACCESS_PLATFORM
            | VIRTIO_RING_F_EVENT_IDX
            | VIRTIO_RING_F_INDIRECT_DESC
            | VIRTIO_BLK_F_SIZE_MAX
            | VIRTIO_BLK_F_SEG_MAX
            | VIRTIO_BLK_F_BLK_SIZE
            | VIRTIO_BLK_F_FLUSH
            | VIRTIO_BLK_F_MQ;
        if self.options.readonly {
            f |= VIRTIO_BLK_F_RO;
        } else {
            f |= VIRTIO_BLK_F_DISCARD | VIRTIO_BLK_F_WRITE_ZEROES;
        }
        f
    }

    fn num_queues(&self) -> usize {
        self.options.queues
    }

    fn max_queue_size(&self) -> u16 {
        MAX_QUEUE_SIZE
    }

    fn read_config(&self, offset: u32, len: u32) -> Vec<u8> {
        self.config.read(offset, len)
    }

    fn run_queue(&self, mut ctx: QueueContext) -> Queue {
        let size = ctx.queue_mut().size();
        match Executor::new(Arc::clone(&self.image), self.id, size, self.options.poll) {
            Ok(mut ex) => {
                if let Err(e) = ex.run(&mut ctx) {
                    tracing::error!("queue {}: {e}", ctx.index());
                }
            }
            Err(e) => {
                tracing::error!("queue {}: cannot set up io_uring: {e}", ctx.index());
                // Stay stopped until the server asks us to return.
                while ctx.wait(None).is_ok_and(|w| !w.stop) {}
            }
        }
        ctx.into_queue()
    }
}
