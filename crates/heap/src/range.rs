//! [`BufRange`]: a bounds-checked range of a [`Buffer`]'s mapping, the one
//! way anything outside the mapping's owner reaches buffer memory (as
//! vm-memory's `VolatileSlice` is for guest memory).
//!
//! Another process or a device may write buffer memory at any time, so a
//! range never hands out `&[u8]`: bytes are copied in and out, integers are
//! read and written with volatile or atomic accesses, each bounds- and
//! alignment-checked. The range's lifetime borrows the buffer, so the
//! mapping outlives every access.
//!
//! ```text
//!  Buffer::range(off, len) ─────┐
//!  Buffer::coherent_range(..) ──┼─► BufRange ── copy_to / copy_from / fill
//!  DevicePin::range(off, len) ──┘      │        read_u16.. / write_u16.. / load_u16
//!                                      └─ sub(off, len) ──► BufRange
//! ```

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU16, Ordering};

use crate::{Buffer, Error, Result};

/// A bounds-checked range of a [`Buffer`]'s mapping, borrowed for `'a`.
///
/// Made by [`Buffer::range`] (a CPU range: writes fail with
/// [`Error::Busy`] while the buffer is mapped for a device), by
/// [`crate::DevicePin::range`] (the device side's range: writes are allowed
/// while the buffer is pinned) or by [`Buffer::coherent_range`] (memory
/// shared at all times, such as virtqueue rings). Invariant:
/// `off + len <= buf.len()`.
#[derive(Debug, Clone, Copy)]
pub struct BufRange<'a> {
    buf: &'a Buffer,
    off: usize,
    len: usize,
    /// Made by the device side or for coherent memory: writes skip the busy
    /// check.
    device: bool,
}

/// The integers a range reads and writes whole (volatile, native endian).
macro_rules! scalar_access {
    ($($read:ident $write:ident $t:ty),*) => {$(
        #[doc = concat!("Reads the `", stringify!($t), "` at `off` with one volatile load.")]
        ///
        /// # Errors
        /// [`Error::OutOfRange`] unless it lies inside the range,
        /// [`Error::Misaligned`] unless its address is a multiple of its size.
        #[inline]
        pub fn $read(&self, off: usize) -> Result<$t> {
            let p = self.scalar_ptr(off, std::mem::size_of::<$t>())?.cast::<$t>();
            // SAFETY: in bounds of the live mapping and aligned (checked by
            // `scalar_ptr`); a volatile load creates no reference.
            Ok(unsafe { std::ptr::read_volatile(p) })
        }

        #[doc = concat!("Writes the `", stringify!($t), "` at `off` with one volatile store.")]
        ///
        /// # Errors
        /// As the read, and [`Error::Busy`] for a CPU range of a buffer
        /// mapped for a device.
        #[inline]
        pub fn $write(&self, off: usize, v: $t) -> Result<()> {
            self.check_writable()?;
            let p = self.scalar_ptr(off, std::mem::size_of::<$t>())?.cast::<$t>();
            // SAFETY: as in the read; a volatile store of plain bytes.
            unsafe { std::ptr::write_volatile(p, v) };
            Ok(())
        }
    )*};
}

impl<'a> BufRange<'a> {
    /// `buf[off..off + len]`, a CPU range (`device`: false) or the device
    /// side's / coherent memory's.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] unless the range is inside the buffer.
    #[inline]
    pub(crate) fn new(buf: &'a Buffer, off: usize, len: usize, device: bool) -> Result<Self> {
        buf.check_range(off, len)?;
        Ok(BufRange {
            buf,
            off,
            len,
            device,
        })
    }

    /// Bytes in the range.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range has no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer the range is in.
    pub(crate) fn buffer(&self) -> &'a Buffer {
        self.buf
    }

    /// Offset of the range in its buffer.
    pub fn offset(&self) -> usize {
        self.off
    }

    /// This process's address of the first byte, as a number: for
    /// alignment maths and for address translation records (an IOTLB entry's
    /// user address). Not a way to reach the memory.
    #[inline]
    pub fn addr(&self) -> usize {
        self.buf.addr() + self.off
    }

    /// The first byte, for a syscall wrapper of this crate to hand to the
    /// kernel together with [`BufRange::len`].
    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.buf.mapping_ptr().wrapping_add(self.off)
    }

    /// `self[off..off + len]`, made the same way as `self`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] unless the sub-range is inside this range.
    pub fn sub(&self, off: usize, len: usize) -> Result<BufRange<'a>> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(BufRange {
                off: self.off + off,
                len,
                ..*self
            }),
            _ => Err(Error::OutOfRange {
                offset: off,
                len,
                buf_len: self.len,
            }),
        }
    }

    /// `self[off..]`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `off > len`.
    pub fn skip(&self, off: usize) -> Result<BufRange<'a>> {
        self.sub(off, self.len.saturating_sub(off))
    }

    /// Copies the range out into `dst` (which must be as long).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if the lengths differ.
    #[inline]
    pub fn copy_to(&self, dst: &mut [u8]) -> Result<()> {
        self.same_len(dst.len())?;
        // SAFETY: the range is inside the live mapping (invariant; `'a`
        // borrows the buffer that owns it), `dst` is a distinct Rust slice of
        // the same length, and the copy only reads the shared memory, never
        // references it.
        // (`dst.len()`, equal: a caller's fixed-size copy stays inline.)
        unsafe { std::ptr::copy_nonoverlapping(self.as_ptr(), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` (which must be as long) into the range.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if the lengths differ; [`Error::Busy`] for a
    /// CPU range of a buffer mapped for a device.
    #[inline]
    pub fn copy_from(&self, src: &[u8]) -> Result<()> {
        self.check_writable()?;
        self.same_len(src.len())?;
        // SAFETY: as in `copy_to`, in the other direction; writing plain
        // bytes into shared memory creates no Rust references.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr(), src.len()) };
        Ok(())
    }

    /// Copies this range into `dst` (which must be as long; the two may
    /// overlap, in one buffer or two).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if the lengths differ; [`Error::Busy`] if `dst`
    /// is a CPU range of a buffer mapped for a device.
    pub fn copy_to_range(&self, dst: &BufRange<'_>) -> Result<()> {
        dst.check_writable()?;
        self.same_len(dst.len)?;
        // SAFETY: both ranges lie inside live mappings (invariant; their
        // lifetimes borrow the buffers); `copy` tolerates overlap; only plain
        // bytes are moved and no Rust reference to shared memory is made.
        unsafe { std::ptr::copy(self.as_ptr(), dst.as_ptr(), self.len) };
        Ok(())
    }

    /// Sets every byte of the range to `byte`.
    ///
    /// # Errors
    /// [`Error::Busy`] for a CPU range of a buffer mapped for a device.
    pub fn fill(&self, byte: u8) -> Result<()> {
        self.check_writable()?;
        // SAFETY: the range is inside the live mapping (invariant); writing
        // plain bytes creates no Rust references.
        unsafe { std::ptr::write_bytes(self.as_ptr(), byte, self.len) };
        Ok(())
    }

    scalar_access!(read_u8 write_u8 u8, read_u16 write_u16 u16, read_u32 write_u32 u32,
        read_u64 write_u64 u64);

    /// Loads the `u16` at `off` atomically with `order` (a ring index that
    /// orders the memory around it).
    ///
    /// # Errors
    /// [`Error::OutOfRange`], [`Error::Misaligned`] (as
    /// [`BufRange::read_u16`]).
    #[inline]
    pub fn load_u16(&self, off: usize, order: Ordering) -> Result<u16> {
        Ok(self.atomic_u16(off)?.load(order))
    }

    /// Stores `v` at `off` atomically with `order`.
    ///
    /// # Errors
    /// As [`BufRange::write_u16`].
    #[inline]
    pub fn store_u16(&self, off: usize, v: u16, order: Ordering) -> Result<()> {
        self.check_writable()?;
        self.atomic_u16(off)?.store(v, order);
        Ok(())
    }

    /// The raw memory of the range, for code that can only take a pointer
    /// (a `vm-memory` region built over it, Python's buffer protocol). As
    /// vm-memory's `VolatileSlice::ptr_guard`, the guard borrows the buffer,
    /// so the mapping outlives it; what is done through the pointer (no
    /// references to memory others write; no writes while the buffer is
    /// busy) is up to the caller.
    pub fn ptr_guard(&self) -> PtrGuard<'a> {
        PtrGuard {
            ptr: self.as_ptr(),
            len: self.len,
            _buf: PhantomData,
        }
    }

    fn atomic_u16(&self, off: usize) -> Result<&'a AtomicU16> {
        let p = self.scalar_ptr(off, 2)?.cast::<u16>();
        // SAFETY: `p` is in bounds, 2-aligned and valid for `'a` (the range
        // borrows the buffer that owns the mapping); this process touches the
        // word with atomic or volatile accesses only, and the other side of a
        // shared ring with aligned 16-bit accesses.
        Ok(unsafe { AtomicU16::from_ptr(p) })
    }

    /// The address of `size` bytes at `off`, checked to lie in the range and
    /// to be aligned to `size`.
    #[inline]
    fn scalar_ptr(&self, off: usize, size: usize) -> Result<*mut u8> {
        match off.checked_add(size) {
            Some(end) if end <= self.len => {}
            _ => {
                return Err(Error::OutOfRange {
                    offset: off,
                    len: size,
                    buf_len: self.len,
                })
            }
        }
        let p = self.as_ptr().wrapping_add(off);
        if (p as usize) % size != 0 {
            return Err(Error::Misaligned {
                offset: self.off + off,
                align: size,
            });
        }
        Ok(p)
    }

    #[inline]
    /// Copies `self.len()` bytes from `src` into the range.
    ///
    /// # Errors
    /// [`Error::Busy`] for a CPU range of a buffer mapped for a device.
    ///
    /// # Safety
    /// `src..src + self.len()` must be readable memory that stays mapped
    /// for the call and does not overlap the range.
    pub(crate) unsafe fn copy_from_ptr(&self, src: *const u8) -> Result<()> {
        self.check_writable()?;
        // SAFETY: the range is inside the live mapping (invariant); the
        // caller vouches for `src`; only plain bytes move and no Rust
        // reference to either side is made.
        unsafe { std::ptr::copy_nonoverlapping(src, self.as_ptr(), self.len) };
        Ok(())
    }

    #[inline]
    fn check_writable(&self) -> Result<()> {
        if self.device {
            Ok(())
        } else {
            self.buf.check_not_busy()
        }
    }

    #[inline]
    fn same_len(&self, other: usize) -> Result<()> {
        if other == self.len {
            Ok(())
        } else {
            Err(Error::OutOfRange {
                offset: self.off,
                len: other,
                buf_len: self.len,
            })
        }
    }
}

/// The raw memory of a [`BufRange`] (see [`BufRange::ptr_guard`]); the
/// pointer is valid while the guard lives.
#[derive(Debug)]
pub struct PtrGuard<'a> {
    ptr: *mut u8,
    len: usize,
    _buf: PhantomData<&'a Buffer>,
}

impl PtrGuard<'_> {
    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes from it.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use crate::{Heap, HugePages, MemfdHeap};

    use super::*;

    #[test]
    fn scalars_are_checked_for_bounds_alignment_and_busy() {
        let buf = MemfdHeap::new(HugePages::None).alloc(4096).unwrap();
        let r = buf.range(8, 64).unwrap();
        r.write_u64(0, 0x0102_0304_0506_0708).unwrap();
        r.write_u16(8, 0xbeef).unwrap();
        r.store_u16(10, 7, Ordering::Release).unwrap();
        assert_eq!(r.read_u32(0).unwrap(), 0x0506_0708);
        assert_eq!(r.read_u16(8).unwrap(), 0xbeef);
        assert_eq!(r.load_u16(10, Ordering::Acquire).unwrap(), 7);
        let mut b = [0u8; 2];
        buf.read_at(16, &mut b).unwrap();
        assert_eq!(u16::from_ne_bytes(b), 0xbeef);
        assert!(matches!(
            r.read_u32(62),
            Err(Error::OutOfRange { offset: 62, .. })
        ));
        assert!(matches!(
            r.read_u32(2),
            Err(Error::Misaligned {
                offset: 10,
                align: 4
            })
        ));
        let pin = buf.pin_for_device();
        assert!(matches!(r.write_u16(8, 1), Err(Error::Busy { maps: 1 })));
        assert!(matches!(r.fill(0), Err(Error::Busy { .. })));
        let dev = pin.range(8, 64).unwrap();
        dev.write_u16(8, 1).unwrap();
        assert_eq!(r.read_u16(8).unwrap(), 1);
        drop(pin);
        r.fill(0).unwrap();
        assert_eq!(r.read_u64(0).unwrap(), 0);
    }

    #[test]
    fn ranges_copy_between_buffers_and_within_one() {
        let heap = MemfdHeap::new(HugePages::None);
        let (a, b) = (heap.alloc(4096).unwrap(), heap.alloc(4096).unwrap());
        a.write_at(0, b"abcdefgh").unwrap();
        let src = a.range(0, 8).unwrap();
        src.copy_to_range(&b.range(100, 8).unwrap()).unwrap();
        let mut got = [0u8; 8];
        b.read_at(100, &mut got).unwrap();
        assert_eq!(&got, b"abcdefgh");
        src.copy_to_range(&a.range(2, 8).unwrap()).unwrap();
        a.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"ababcdef");
        assert!(src.copy_to_range(&b.range(0, 7).unwrap()).is_err());
        assert_eq!(src.sub(4, 4).unwrap().addr(), a.addr() + 4);
        assert!(src.sub(4, 5).is_err());
    }
}
