//! Alignment maths for direct I/O: which part of a transfer can go straight
//! between the file and the buffer, and which part is staged through an
//! aligned buffer.

/// Direct-I/O alignment constraints of one file (`statx(2)` `STATX_DIOALIGN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DioAlign {
    /// Required alignment of user memory addresses (a power of two).
    pub mem: usize,
    /// Required alignment of file offsets and lengths (a power of two).
    pub offset: usize,
}

impl DioAlign {
    /// The conservative default when the kernel does not report alignment:
    /// one page for both.
    pub fn page() -> Self {
        let p = crate::page_size();
        DioAlign { mem: p, offset: p }
    }
}

/// `x` rounded down to a multiple of `align` (a power of two).
pub(crate) fn align_down(x: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    x & !(align - 1)
}

/// `x` rounded up to a multiple of `align` (a power of two); `None` on overflow.
pub(crate) fn align_up(x: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// How a transfer of `len` bytes between file offset `file_off` and memory
/// address `addr` splits into `head` (staged), `middle` (direct, in place)
/// and `tail` (staged). `head + middle + tail == len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Split {
    pub head: usize,
    pub middle: usize,
    pub tail: usize,
}

/// Splits a transfer for direct I/O. The middle is the longest run that
/// starts and ends on `align.offset` boundaries in the file and whose memory
/// address is `align.mem`-aligned. When the memory address and the file offset
/// are not congruent, no run can satisfy both, and everything is staged.
pub(crate) fn direct_split(file_off: u64, addr: usize, len: usize, align: DioAlign) -> Split {
    let oa = align.offset as u64;
    let Some(first) = align_up(file_off, oa) else {
        return Split {
            head: len,
            middle: 0,
            tail: 0,
        };
    };
    let head = usize::try_from(first - file_off).map_or(len, |h| h.min(len));
    let rest = len - head;
    let middle = align_down(rest as u64, oa) as usize;
    let mid_addr = addr.wrapping_add(head);
    if middle == 0 || mid_addr % align.mem != 0 {
        return Split {
            head: len,
            middle: 0,
            tail: 0,
        };
    }
    Split {
        head,
        middle,
        tail: rest - middle,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn aligns() -> impl Strategy<Value = DioAlign> {
        (0u32..13, 0u32..13).prop_map(|(m, o)| DioAlign {
            mem: 1 << m,
            offset: 1 << o,
        })
    }

    proptest! {
        #[test]
        fn split_covers_and_aligns(
            file_off in 0u64..(1 << 40),
            addr in 0usize..(1 << 30),
            len in 0usize..(1 << 24),
            align in aligns(),
        ) {
            let s = direct_split(file_off, addr, len, align);
            prop_assert_eq!(s.head + s.middle + s.tail, len);
            if s.middle > 0 {
                let mid_off = file_off + s.head as u64;
                prop_assert_eq!(mid_off % align.offset as u64, 0);
                prop_assert_eq!(s.middle % align.offset, 0);
                prop_assert_eq!((addr + s.head) % align.mem, 0);
                // Maximal: what is staged is less than one block each side.
                prop_assert!(s.head < align.offset);
                prop_assert!(s.tail < align.offset);
            } else {
                prop_assert_eq!(s.tail, 0);
            }
        }

        #[test]
        fn congruent_requests_go_direct(
            block in 0u64..(1 << 20),
            extra in 0usize..(1 << 20),
            align in aligns(),
        ) {
            // File offset and address both block aligned, at least one block.
            let a = align.offset.max(align.mem);
            let file_off = block * a as u64;
            let addr = (block as usize % 1024) * a;
            let len = align.offset + extra;
            let s = direct_split(file_off, addr, len, align);
            prop_assert_eq!(s.head, 0);
            prop_assert_eq!(s.middle, len - len % align.offset);
        }

        #[test]
        fn rounding(x in 0u64..u64::MAX / 2, shift in 0u32..20) {
            let a = 1u64 << shift;
            let d = align_down(x, a);
            let u = align_up(x, a).unwrap();
            prop_assert!(d <= x && x <= u);
            prop_assert!(x - d < a && u - x < a);
            prop_assert_eq!(d % a, 0);
            prop_assert_eq!(u % a, 0);
        }
    }

    #[test]
    fn examples() {
        let al = DioAlign {
            mem: 512,
            offset: 512,
        };
        assert_eq!(
            direct_split(100, 100, 2000, al),
            Split {
                head: 412,
                middle: 1536,
                tail: 52
            }
        );
        // Not congruent: all staged.
        assert_eq!(
            direct_split(100, 0, 2000, al),
            Split {
                head: 2000,
                middle: 0,
                tail: 0
            }
        );
        assert_eq!(direct_split(u64::MAX - 3, 0, 3, al).head, 3);
    }
}
