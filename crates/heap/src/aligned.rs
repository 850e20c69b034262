//! The one owning type for private, aligned direct-I/O memory.

use crate::{Error, Result};

/// A zeroed allocation of `len` bytes whose start is aligned for `O_DIRECT`,
/// freed on drop.
///
/// Private to this process, so handing out slices is sound: it is a `Vec`
/// over-allocated by the alignment, used from its first aligned byte (a
/// `Vec`'s heap memory does not move when the `Vec` does), so it needs no
/// `unsafe`.
#[derive(Debug)]
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` bytes (at least one) aligned to `align` (a power of two).
    ///
    /// # Errors
    /// [`Error::BadSize`] if `align` is not a power of two or the size
    /// overflows; [`Error::Sys`] (out of memory) if the allocation fails.
    pub fn new(len: usize, align: usize) -> Result<Self> {
        let align = align.max(1);
        let len = len.max(1);
        let bad = Error::BadSize {
            size: len,
            page: align,
        };
        if !align.is_power_of_two() {
            return Err(bad);
        }
        let total = len.checked_add(align - 1).ok_or(bad)?;
        let mut storage = Vec::new();
        storage.try_reserve_exact(total).map_err(|_| {
            Error::sys(
                "allocate aligned buffer",
                std::io::Error::from(std::io::ErrorKind::OutOfMemory),
            )
        })?;
        storage.resize(total, 0);
        let addr = storage.as_ptr() as usize;
        let start = addr.next_multiple_of(align) - addr;
        Ok(AlignedBuf {
            storage,
            start,
            len,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never: it holds at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first (aligned) byte, e.g. for an iovec handed to the kernel.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_slice().as_mut_ptr()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_sized() {
        for align in [1, 512, 4096, 1 << 16] {
            for len in [0, 1, 4095, 1 << 20] {
                let mut b = AlignedBuf::new(len, align).unwrap();
                assert_eq!(b.len(), len.max(1));
                assert_eq!(b.as_mut_ptr() as usize % align, 0);
                assert!(b.as_slice().iter().all(|&x| x == 0));
                b.as_mut_slice().fill(7);
                assert!(b.as_slice().iter().all(|&x| x == 7));
            }
        }
        assert!(matches!(
            AlignedBuf::new(10, 3),
            Err(Error::BadSize { size: 10, page: 3 })
        ));
    }
}
