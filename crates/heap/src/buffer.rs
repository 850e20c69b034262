//! [`Buffer`]: an owned fd, its length and a shared mapping.

use std::fmt;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::heap::HeapKind;
use crate::mmap::Mmap;
use crate::range::BufRange;
use crate::{Error, Result};

mod of_file;
pub use of_file::{POPULATE_READ, TOUCH_READ};

/// Magic that starts an exported-buffer message ("IOPB").
const EXPORT_MAGIC: u32 = 0x4250_4f49;
/// Exported-buffer message: magic u32, kind u32, length u64 (little-endian).
const EXPORT_MSG_LEN: usize = 16;

struct Inner {
    fd: OwnedFd,
    /// For a udmabuf: the memfd whose pages back the dma-buf. The mapping
    /// is the memfd's, because a dma-buf's own mapping cannot be pinned by
    /// direct I/O (its pages are inserted as PFNs).
    memfd: Option<OwnedFd>,
    map: Mmap,
    kind: HeapKind,
    /// Whether the mapping's pages can be pinned for direct I/O.
    direct_io: bool,
    /// Whether [`Buffer::populate`] has faulted every page in (a pooled
    /// buffer's second user skips it).
    populated: AtomicBool,
    /// Live device mappings (see [`DevicePin`]).
    device_maps: AtomicUsize,
    /// Whether its fd has left this process's control (see
    /// [`Buffer::mark_exported`]): a [`crate::Pool`] never reuses it.
    exported: AtomicBool,
}

/// An fd-backed buffer shared with other processes and devices.
///
/// Cloning is cheap and yields another handle to the same memory. The memory
/// is never exposed as `&[u8]`: another process or a device may write it at
/// any time, so bytes are copied in and out through the accessors.
#[derive(Clone)]
pub struct Buffer {
    inner: Arc<Inner>,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("kind", &self.inner.kind)
            .field("fd", &self.inner.fd)
            .field("len", &self.len())
            .field("device_maps", &self.device_maps())
            .finish()
    }
}

impl Buffer {
    /// Wraps `fd` (a memfd, a dma-buf, a shared-memory file) of `len` bytes and
    /// maps it shared.
    ///
    /// A file that another process could shrink under the mapping (one
    /// that is neither sealed with `F_SEAL_SHRINK` nor a dma-buf, e.g. a
    /// file in `/dev/shm` or one received from a peer), whatever `kind`
    /// says, is guarded against SIGBUS as a [`crate::SharedMapping`] is:
    /// pages past the new end read as zeros instead of killing the
    /// process, and [`Buffer::peer_truncated`] says it happened.
    ///
    /// # Errors
    /// [`Error::BadSize`] for a zero length, [`Error::Sys`] if `mmap` fails,
    /// [`Error::Unguarded`] if a mapping that needs the guard cannot have
    /// it.
    pub fn from_fd(fd: OwnedFd, len: usize, kind: HeapKind) -> Result<Self> {
        // Whatever the kind says: only a file that cannot shrink goes
        // unguarded.
        let guarded = !(sealed_against_shrinking(fd.as_fd()) || is_dmabuf(fd.as_fd()));
        let map = Mmap::map(fd.as_fd(), 0, len, guarded)?;
        Ok(Buffer {
            inner: Arc::new(Inner {
                fd,
                memfd: None,
                map,
                kind,
                direct_io: kind == HeapKind::Memfd,
                populated: AtomicBool::new(false),
                device_maps: AtomicUsize::new(0),
                exported: AtomicBool::new(false),
            }),
        })
    }

    /// Wraps a udmabuf: `dmabuf` made by `UDMABUF_CREATE` over the first
    /// `len` bytes of `memfd`. The buffer is mapped through the memfd, whose
    /// pages are the dma-buf's, so direct I/O and io_uring fill it at memfd
    /// speed; [`Buffer::fd`] is the dma-buf, what a device or a peer takes.
    ///
    /// # Errors
    /// [`Error::BadSize`] for a zero length, [`Error::Sys`] if `mmap` fails.
    pub fn from_udmabuf(dmabuf: OwnedFd, memfd: OwnedFd, len: usize) -> Result<Self> {
        let map = Mmap::map(memfd.as_fd(), 0, len, false)?;
        Ok(Buffer {
            inner: Arc::new(Inner {
                fd: dmabuf,
                memfd: Some(memfd),
                map,
                kind: HeapKind::Udmabuf,
                direct_io: true,
                populated: AtomicBool::new(false),
                device_maps: AtomicUsize::new(0),
                exported: AtomicBool::new(false),
            }),
        })
    }

    /// Whether the mapping takes direct I/O: its pages are ordinary memory
    /// the kernel can pin (a memfd, or the memfd under a udmabuf). A
    /// dma-buf's own mapping (a dma-heap buffer, a udmabuf imported without
    /// its memfd) is made of PFNs that `O_DIRECT` and io_uring cannot pin:
    /// the kernel fails them with `EFAULT`.
    pub fn takes_direct_io(&self) -> bool {
        self.inner.direct_io
    }

    /// A dma-buf whose mapping a probe found to take direct I/O after all
    /// (a heap whose exporter maps ordinary pages).
    pub(crate) fn set_takes_direct_io(mut self, yes: bool) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.direct_io = yes;
        }
        self
    }

    /// The memfd under a udmabuf (`None` for other buffers and for a
    /// udmabuf imported without it).
    pub fn memfd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.memfd.as_ref().map(|f| f.as_fd())
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.inner.map.len()
    }

    /// Whether the buffer has no bytes (never true for a mapped buffer).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The heap the buffer came from.
    pub fn kind(&self) -> HeapKind {
        self.inner.kind
    }

    /// The buffer's file descriptor, e.g. to share it with a device back end.
    /// A caller that sends it to another process calls
    /// [`Buffer::mark_exported`] too, or a [`crate::Pool`] may reuse the
    /// memory under the peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }

    /// This process's address of the first byte, as a number: for alignment
    /// maths and address translation records (the user address of an IOTLB
    /// entry or a vhost-user memory region). The memory itself is reached
    /// through [`Buffer::range`].
    #[inline]
    pub fn addr(&self) -> usize {
        self.inner.map.as_ptr() as usize
    }

    /// Start of the mapping, for [`BufRange`] alone.
    #[inline]
    pub(crate) fn mapping_ptr(&self) -> *mut u8 {
        self.inner.map.as_ptr()
    }

    /// Whether a SIGBUS in the mapping is caught (see [`Buffer::from_fd`]).
    pub fn is_guarded(&self) -> bool {
        self.inner.map.is_guarded()
    }

    /// Whether a SIGBUS was caught in the mapping: another process shrank
    /// the file, and the pages past its new end now read as zeros (writes
    /// to them reach no one).
    pub fn peer_truncated(&self) -> bool {
        self.inner.map.faulted()
    }

    /// Handles to this buffer alive now (clones and device pins included).
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// Marks the buffer's memory as reachable outside this process's
    /// handles: its fd was sent to another process ([`Buffer::export`]
    /// does this) or handed to code that may keep it. Such a buffer is
    /// never taken back by a [`crate::Pool`], since a peer may still map
    /// it when the last handle here drops; the pool frees it instead.
    pub fn mark_exported(&self) {
        self.inner.exported.store(true, Ordering::Release);
    }

    /// Whether [`Buffer::mark_exported`] was called on any handle.
    pub fn exported(&self) -> bool {
        self.inner.exported.load(Ordering::Acquire)
    }

    /// Whether `self` and `other` are handles to the same mapping.
    pub fn same_as(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Checks that `offset..offset+len` lies inside the buffer.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] otherwise (overflow included).
    #[inline]
    pub fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(Error::OutOfRange {
                offset,
                len,
                buf_len: self.len(),
            }),
        }
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the buffer.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if the range is not inside the buffer.
    #[inline]
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.range(offset, dst.len())?.copy_to(dst)
    }

    /// Copies `src` into the buffer at `offset`.
    ///
    /// # Errors
    /// [`Error::Busy`] while the buffer is mapped for a device,
    /// [`Error::OutOfRange`] if the range is not inside the buffer.
    #[inline]
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.range(offset, src.len())?.copy_from(src)
    }

    /// Sets `len` bytes at `offset` to `byte`.
    ///
    /// # Errors
    /// As [`Buffer::write_at`].
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        self.check_not_busy()?;
        self.range(offset, len)?.fill(byte)
    }

    /// `self[offset..offset + len]` as a borrowed range: volatile integer
    /// and byte accesses, bounds-checked. Writes through it fail with
    /// [`Error::Busy`] while the buffer is mapped for a device (the device
    /// side writes through [`DevicePin::range`]).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] unless the range is inside the buffer.
    #[inline]
    pub fn range(&self, offset: usize, len: usize) -> Result<BufRange<'_>> {
        BufRange::new(self, offset, len, false)
    }

    /// `self[offset..offset + len]` as a range of coherent memory: memory
    /// the CPU and a device share at all times, with no ownership handed
    /// back and forth (virtqueue rings, a shared-memory region holding
    /// them), so writes through it skip the busy check. For the owners of
    /// such memory (ring accessors); everything else uses
    /// [`Buffer::range`].
    ///
    /// # Errors
    /// [`Error::OutOfRange`] unless the range is inside the buffer.
    #[inline]
    pub fn coherent_range(&self, offset: usize, len: usize) -> Result<BufRange<'_>> {
        BufRange::new(self, offset, len, true)
    }

    /// Advises transparent huge pages for the whole mapping.
    pub(crate) fn advise_hugepage(&self) -> Result<()> {
        self.inner.map.advise_hugepage()
    }

    /// Faults every page of the buffer in now (`MADV_POPULATE_WRITE`), so
    /// later transfers do not pay for page allocation. The loader calls this
    /// on its allocator thread to overlap allocation with I/O. Once it has
    /// succeeded, later calls return at once (the pages stay: the file is
    /// sealed against shrinking), which is what makes a pooled buffer's
    /// next load cheap. A [`HeapKind::File`] buffer's pages are mapped for
    /// reading ([`Buffer::populate_read`]), never copied.
    ///
    /// # Errors
    /// [`Error::Sys`] if the kernel refuses (e.g. a dma-buf mapping that
    /// cannot be populated this way, or out of memory).
    pub fn populate(&self) -> Result<()> {
        if self.inner.populated.load(Ordering::Acquire) {
            return Ok(());
        }
        if self.kind() == HeapKind::File {
            // Writing would copy every page of the file: map them instead.
            self.populate_read(0, self.len())?;
        } else {
            self.inner.map.populate_write()?;
        }
        self.inner.populated.store(true, Ordering::Release);
        Ok(())
    }

    /// Allocates every page of the buffer's file now (`fallocate(2)`, mode
    /// 0) without mapping it; a later first touch only maps the page.
    ///
    /// # Errors
    /// [`Error::Sys`] if the file does not support `fallocate` (dma-bufs) or
    /// memory runs out.
    pub fn allocate_pages(&self) -> Result<()> {
        rustix::fs::fallocate(
            self.fd(),
            rustix::fs::FallocateFlags::empty(),
            0,
            self.len() as u64,
        )
        .map_err(|e| Error::sys("fallocate", e))
    }

    /// Live device mappings of this buffer.
    #[inline]
    pub fn device_maps(&self) -> usize {
        self.inner.device_maps.load(Ordering::Acquire)
    }

    /// Fails with [`Error::Busy`] while the buffer is mapped for a device.
    ///
    /// # Errors
    /// [`Error::Busy`].
    #[inline]
    pub fn check_not_busy(&self) -> Result<()> {
        match self.device_maps() {
            0 => Ok(()),
            maps => Err(Error::Busy { maps }),
        }
    }

    /// Marks the buffer as mapped for a device until the returned pin drops.
    /// Used by the DMA layer; CPU writes and file transfers are refused while
    /// any pin is alive.
    pub fn pin_for_device(&self) -> DevicePin {
        self.inner.device_maps.fetch_add(1, Ordering::AcqRel);
        DevicePin { buf: self.clone() }
    }

    /// Sends the buffer (its fd, kind and length; for a udmabuf also its
    /// memfd, second) over a unix socket with `SCM_RIGHTS`; the peer gets it
    /// back with [`Buffer::import`]. Marks it exported
    /// ([`Buffer::mark_exported`]), sent or not.
    ///
    /// # Errors
    /// [`Error::Sys`] if `sendmsg` fails.
    pub fn export(&self, sock: &UnixStream) -> Result<()> {
        // Before the send: once the fd is on its way, a peer may map it.
        self.mark_exported();
        let both = [self.fd(), self.memfd().unwrap_or(self.fd())];
        let fds = if self.memfd().is_some() {
            &both[..]
        } else {
            &both[..1]
        };
        send_export(sock, self.kind().to_wire(), self.len() as u64, fds)
    }

    /// Receives a buffer sent with [`Buffer::export`] and maps it (a
    /// udmabuf through its memfd when the peer sent it).
    ///
    /// What arrives is checked against what it claims to be: a file at
    /// least as long as the length given, a buffer labelled udmabuf or
    /// dma-heap that is a dma-buf indeed (a memfd or a file so labelled
    /// could be shrunk under the mapping), a udmabuf's memfd sealed
    /// against shrinking. A memfd not sealed is mapped under the SIGBUS
    /// guard.
    ///
    /// # Errors
    /// [`Error::BadMessage`] if the peer sent something else (no fd, a short
    /// or foreign message, a kind the fd is not), [`Error::Sys`] if `recvmsg`
    /// or `mmap` fails.
    pub fn import(sock: &UnixStream) -> Result<Self> {
        let mut msg = [0u8; EXPORT_MSG_LEN];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut anc = RecvAncillaryBuffer::new(&mut space);
        let got = recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut msg)],
            &mut anc,
            RecvFlags::CMSG_CLOEXEC,
        )
        .map_err(|e| Error::sys("recvmsg(SCM_RIGHTS)", e))?;
        let mut fd = None;
        let mut second = None;
        for m in anc.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = m {
                // Keep the first two fds; any others are closed when dropped.
                for f in fds {
                    if fd.is_none() {
                        fd = Some(f);
                    } else {
                        second.get_or_insert(f);
                    }
                }
            }
        }
        if got.bytes != EXPORT_MSG_LEN {
            return Err(Error::BadMessage("short message"));
        }
        if u32::from_le_bytes(msg[0..4].try_into().expect("4 bytes")) != EXPORT_MAGIC {
            return Err(Error::BadMessage("not an iopath buffer"));
        }
        let kind = HeapKind::from_wire(u32::from_le_bytes(msg[4..8].try_into().expect("4 bytes")))
            .ok_or(Error::BadMessage("unknown heap kind"))?;
        let len = u64::from_le_bytes(msg[8..16].try_into().expect("8 bytes"));
        let len = usize::try_from(len).map_err(|_| Error::BadMessage("length too large"))?;
        let fd = fd.ok_or(Error::BadMessage("no file descriptor attached"))?;
        if file_size(fd.as_fd())? < len as u64 {
            return Err(Error::BadMessage("length larger than the file"));
        }
        match kind {
            HeapKind::File => Buffer::map_file(fd, len),
            HeapKind::Memfd if is_dmabuf(fd.as_fd()) => Err(Error::BadMessage(
                "a buffer labelled memfd is a dma-buf (direct I/O into its mapping would fail)",
            )),
            HeapKind::Memfd => Buffer::from_fd(fd, len, kind),
            // A dma-buf cannot be shrunk; a file labelled as one could be,
            // under a mapping made unguarded on the label's word.
            HeapKind::Udmabuf | HeapKind::DmaHeap if !is_dmabuf(fd.as_fd()) => {
                Err(Error::BadMessage(
                    "a buffer labelled udmabuf or dma-heap is not a dma-buf (its sender could \
                     shrink it under the mapping)",
                ))
            }
            HeapKind::Udmabuf => match second {
                Some(memfd) => {
                    let st = rustix::fs::fstat(&memfd).map_err(|e| Error::sys("fstat", e))?;
                    if !sealed_against_shrinking(memfd.as_fd())
                        || (st.st_size.max(0) as u64) < len as u64
                    {
                        return Err(Error::BadMessage(
                            "udmabuf memfd is not sealed or shorter than the buffer",
                        ));
                    }
                    Buffer::from_udmabuf(fd, memfd, len)
                }
                None => Buffer::from_fd(fd, len, kind),
            },
            HeapKind::DmaHeap => Buffer::from_fd(fd, len, kind),
        }
    }
}

/// Sends one exported-buffer message: `kind` (on the wire), `len` and
/// `fds` (at most two) with `SCM_RIGHTS`.
pub(crate) fn send_export(
    sock: &UnixStream,
    kind: u32,
    len: u64,
    fds: &[BorrowedFd<'_>],
) -> Result<()> {
    let mut msg = [0u8; EXPORT_MSG_LEN];
    msg[0..4].copy_from_slice(&EXPORT_MAGIC.to_le_bytes());
    msg[4..8].copy_from_slice(&kind.to_le_bytes());
    msg[8..16].copy_from_slice(&len.to_le_bytes());
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    anc.push(SendAncillaryMessage::ScmRights(fds));
    sendmsg(sock, &[IoSlice::new(&msg)], &mut anc, SendFlags::NOSIGNAL)
        .map_err(|e| Error::sys("sendmsg(SCM_RIGHTS)", e))?;
    Ok(())
}

/// Whether `fd` is a memfd sealed with `F_SEAL_SHRINK`: no one can cut
/// it under a mapping.
pub(crate) fn sealed_against_shrinking(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fcntl_get_seals(fd).is_ok_and(|s| s.contains(rustix::fs::SealFlags::SHRINK))
}

/// The size of the file or dma-buf `fd` (a dma-buf's by `lseek(SEEK_END)`,
/// which every kernel with dma-bufs answers with it).
fn file_size(fd: BorrowedFd<'_>) -> Result<u64> {
    if is_dmabuf(fd) {
        return rustix::fs::seek(fd, rustix::fs::SeekFrom::End(0))
            .map_err(|e| Error::sys("lseek(SEEK_END) of a dma-buf", e));
    }
    let st = rustix::fs::fstat(fd).map_err(|e| Error::sys("fstat", e))?;
    Ok(st.st_size.max(0) as u64)
}

/// `DMA_BUF_MAGIC` (include/uapi/linux/magic.h): the file system of every
/// dma-buf's file.
const DMA_BUF_MAGIC: u64 = 0x444d_4142;

/// Whether `fd` is a dma-buf (its file is on the dma-buf pseudo file
/// system, see statfs(2)): a buffer whose size is fixed.
pub(crate) fn is_dmabuf(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fstatfs(fd).is_ok_and(|s| s.f_type as u64 == DMA_BUF_MAGIC)
}

/// Proof that a buffer is mapped for a device; the buffer is busy until the
/// last pin drops. Held by DMA mappings.
#[derive(Debug)]
pub struct DevicePin {
    buf: Buffer,
}

impl DevicePin {
    /// The pinned buffer.
    pub fn buffer(&self) -> &Buffer {
        &self.buf
    }

    /// Writes device-produced bytes back into the pinned buffer (what the
    /// DMA ops' copy-out at unmap or a sync-for-CPU does); allowed while busy because the
    /// pin holder is the device side.
    ///
    /// # Errors
    /// [`Error::OutOfRange`].
    pub fn write_back(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.range(offset, src.len())?.copy_from(src)
    }

    /// `buffer[offset..offset + len]` as the device side's range: writes
    /// through it are allowed while the buffer is pinned.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] unless the range is inside the buffer.
    pub fn range(&self, offset: usize, len: usize) -> Result<BufRange<'_>> {
        BufRange::new(&self.buf, offset, len, true)
    }
}

impl Drop for DevicePin {
    fn drop(&mut self) {
        self.buf.inner.device_maps.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::fd::AsFd;

    use super::*;

    /// An unsealed memfd of `len` bytes (sealing allowed): a file its
    /// holder can shrink.
    pub(crate) fn unsealed(len: u64) -> OwnedFd {
        let fd = rustix::fs::memfd_create(
            "forged",
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )
        .unwrap();
        rustix::fs::ftruncate(&fd, len).unwrap();
        fd
    }

    #[test]
    fn a_file_labelled_a_dma_buf_is_guarded_anyway() {
        for kind in [HeapKind::DmaHeap, HeapKind::Udmabuf, HeapKind::Memfd] {
            let b = Buffer::from_fd(unsealed(8192), 8192, kind).unwrap();
            assert!(b.is_guarded(), "{kind:?}");
        }
    }

    #[test]
    fn an_import_refuses_a_kind_its_fd_is_not() {
        let refused = |kind: HeapKind, fds: &[BorrowedFd<'_>]| {
            let (a, b) = UnixStream::pair().unwrap();
            send_export(&a, kind.to_wire(), 8192, fds).unwrap();
            match Buffer::import(&b) {
                Err(Error::BadMessage(m)) => m,
                other => panic!("{kind:?} with {} fds: {other:?}", fds.len()),
            }
        };
        let (memfd, sealed) = (unsealed(8192), unsealed(8192));
        rustix::fs::fcntl_add_seals(&sealed, rustix::fs::SealFlags::SHRINK).unwrap();
        let not_dmabuf = "a buffer labelled udmabuf or dma-heap is not a dma-buf (its sender \
                          could shrink it under the mapping)";
        assert_eq!(refused(HeapKind::DmaHeap, &[memfd.as_fd()]), not_dmabuf);
        assert_eq!(refused(HeapKind::Udmabuf, &[memfd.as_fd()]), not_dmabuf);
        assert_eq!(
            refused(HeapKind::Udmabuf, &[memfd.as_fd(), sealed.as_fd()]),
            not_dmabuf
        );
        // Longer than the file: refused whatever the kind.
        let (a, b) = UnixStream::pair().unwrap();
        send_export(&a, HeapKind::File.to_wire(), 8193, &[sealed.as_fd()]).unwrap();
        assert!(matches!(
            Buffer::import(&b),
            Err(Error::BadMessage("length larger than the file"))
        ));
        // A memfd labelled as one maps, guarded unless sealed.
        for (fd, guarded) in [(&memfd, true), (&sealed, false)] {
            let (a, b) = UnixStream::pair().unwrap();
            send_export(&a, HeapKind::Memfd.to_wire(), 8192, &[fd.as_fd()]).unwrap();
            let got = Buffer::import(&b).unwrap();
            assert_eq!(
                (got.kind(), got.len(), got.is_guarded()),
                (HeapKind::Memfd, 8192, guarded)
            );
        }
    }
}
