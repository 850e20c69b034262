//! [`IovaAllocator`]: I/O virtual address ranges for the IOMMU ops.

use std::collections::BTreeMap;

/// A first-fit allocator of granule-aligned ranges in `[base, base+size)`,
/// with free neighbours merged. Hand-written: the kernel's `iova.c` is an
/// rbtree of the same shape; no maintained crate offers one.
#[derive(Debug, Clone)]
pub struct IovaAllocator {
    base: u64,
    size: u64,
    granule: u64,
    /// Free ranges: start → length; disjoint, never adjacent (merged).
    free: BTreeMap<u64, u64>,
}

impl IovaAllocator {
    /// An allocator over `[base, base+size)` handing out multiples of
    /// `granule` (a power of two); `base` and `size` are rounded to it.
    pub fn new(base: u64, size: u64, granule: u64) -> Self {
        assert!(granule.is_power_of_two(), "granule must be a power of two");
        let start = base.next_multiple_of(granule);
        let size = (size - (start - base)) & !(granule - 1);
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(start, size);
        }
        IovaAllocator {
            base: start,
            size,
            granule,
            free,
        }
    }

    /// The allocation granule.
    pub fn granule(&self) -> u64 {
        self.granule
    }

    /// The bytes an allocation of `len` takes (rounded up to the granule).
    pub fn rounded(&self, len: u64) -> Option<u64> {
        len.max(1).checked_next_multiple_of(self.granule)
    }

    /// Allocates `len` bytes (rounded up to the granule); `None` when no free
    /// range is large enough.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = self.rounded(len)?;
        let (&start, &flen) = self.free.iter().find(|(_, &flen)| flen >= len)?;
        self.free.remove(&start);
        if flen > len {
            self.free.insert(start + len, flen - len);
        }
        Some(start)
    }

    /// Returns `[iova, iova+len)` (as allocated) to the free space. `false`
    /// (and nothing changes) if the range is outside the space or overlaps
    /// free space, i.e. a double free.
    pub fn free(&mut self, iova: u64, len: u64) -> bool {
        let Some(len) = self.rounded(len) else {
            return false;
        };
        let Some(end) = iova.checked_add(len) else {
            return false;
        };
        if iova < self.base || end > self.base + self.size || iova % self.granule != 0 {
            return false;
        }
        let prev = self.free.range(..=iova).next_back().map(|(&s, &l)| (s, l));
        let next = self.free.range(iova..).next().map(|(&s, &l)| (s, l));
        if prev.is_some_and(|(s, l)| s + l > iova) || next.is_some_and(|(s, _)| s < end) {
            return false;
        }
        let mut start = iova;
        let mut len = len;
        if let Some((s, l)) = prev.filter(|(s, l)| s + l == iova) {
            self.free.remove(&s);
            start = s;
            len += l;
        }
        if let Some((s, l)) = next.filter(|(s, _)| *s == end) {
            self.free.remove(&s);
            len += l;
        }
        self.free.insert(start, len);
        true
    }

    /// Free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    /// Total bytes managed.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Free ranges in address order (for invariant checks).
    pub fn free_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free.iter().map(|(&s, &l)| (s, l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn alloc_free_merge() {
        let mut a = IovaAllocator::new(0x1000, 0x10000, 0x1000);
        let x = a.alloc(1).unwrap();
        let y = a.alloc(0x1001).unwrap();
        assert_eq!((x, y), (0x1000, 0x2000));
        assert!(!a.free(0x20_0000, 1), "outside the space");
        assert!(!a.free(0x8000, 1), "free space");
        assert!(a.free(y, 0x1001));
        assert!(!a.free(y, 0x1001), "double free refused");
        assert!(a.free(x, 1));
        assert_eq!(a.free_ranges().collect::<Vec<_>>(), vec![(0x1000, 0x10000)]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..40_000).prop_map(Op::Alloc),
            any::<usize>().prop_map(Op::Free)
        ]
    }

    proptest! {
        /// Live allocations never overlap each other or free space, are
        /// aligned and inside the space; free ranges stay merged; freeing
        /// everything restores one range.
        #[test]
        fn invariants(ops in proptest::collection::vec(op(), 1..200)) {
            let (base, size, g) = (0x10_0000u64, 0x40_0000u64, 0x1000u64);
            let mut a = IovaAllocator::new(base, size, g);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(len) => {
                        if let Some(iova) = a.alloc(len) {
                            let rl = a.rounded(len).unwrap();
                            prop_assert_eq!(iova % g, 0);
                            prop_assert!(iova >= base && iova + rl <= base + size);
                            for &(s, l) in &live {
                                prop_assert!(iova + rl <= s || s + a.rounded(l).unwrap() <= iova);
                            }
                            live.push((iova, len));
                        } else {
                            // Refused only if no free range is large enough.
                            let rl = a.rounded(len).unwrap();
                            prop_assert!(a.free_ranges().all(|(_, l)| l < rl));
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let (s, l) = live.swap_remove(i % live.len());
                        prop_assert!(a.free(s, l));
                        prop_assert!(!a.free(s, l));
                    }
                    Op::Free(_) => {}
                }
                let used: u64 = live.iter().map(|&(_, l)| a.rounded(l).unwrap()).sum();
                prop_assert_eq!(a.free_bytes() + used, a.size());
                let fr: Vec<_> = a.free_ranges().collect();
                for w in fr.windows(2) {
                    prop_assert!(w[0].0 + w[0].1 < w[1].0, "free ranges merged and sorted");
                }
            }
            for (s, l) in live.drain(..) {
                prop_assert!(a.free(s, l));
            }
            prop_assert_eq!(a.free_ranges().collect::<Vec<_>>(), vec![(base, size)]);
        }
    }
}
