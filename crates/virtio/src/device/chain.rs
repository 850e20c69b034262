//! The descriptor chain at a given head, for the heads an inflight region
//! says were in flight: `virtio-queue` makes chains only out of the
//! available ring (its `DescriptorChain::new` is crate-private), and a
//! resubmitted head may no longer be there (the driver reuses available
//! slots). This walker follows the same rules as `virtio-queue`'s chain:
//! at most queue-size descriptors (a loop ends there), one level of
//! indirection with a table of whole descriptors, at most 2^32 bytes in
//! all (virtio 1.2, 2.7.5.2 and 2.7.5.3).

use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, Bytes, GuestAddress};

use super::DeviceMemory;

/// Bytes of a split-ring descriptor.
const DESC_BYTES: u64 = std::mem::size_of::<Descriptor>() as u64;

/// The descriptors of the chain that starts at one head, read through
/// [`DeviceMemory`] (so with an IOMMU every table read is translated).
#[derive(Debug)]
pub struct HeadChain<'m> {
    mem: &'m DeviceMemory,
    head: u16,
    table: GuestAddress,
    table_len: u16,
    next: u16,
    ttl: u16,
    indirect: bool,
    bytes: u32,
}

impl<'m> HeadChain<'m> {
    /// The chain at `head` of the descriptor table at `table` holding
    /// `queue_size` descriptors.
    pub fn new(mem: &'m DeviceMemory, table: GuestAddress, queue_size: u16, head: u16) -> Self {
        Self {
            mem,
            head,
            table,
            table_len: queue_size,
            next: head,
            ttl: queue_size,
            indirect: false,
            bytes: 0,
        }
    }

    /// The head index.
    pub fn head_index(&self) -> u16 {
        self.head
    }

    fn end(&mut self) -> Option<Descriptor> {
        self.ttl = 0;
        None
    }
}

impl Iterator for HeadChain<'_> {
    type Item = Descriptor;

    fn next(&mut self) -> Option<Descriptor> {
        loop {
            if self.ttl == 0 || self.next >= self.table_len {
                return None;
            }
            let Some(at) = self.table.checked_add(u64::from(self.next) * DESC_BYTES) else {
                return self.end();
            };
            let Ok(desc) = self.mem.read_obj::<Descriptor>(at) else {
                return self.end();
            };
            if desc.refers_to_indirect_table() {
                let len = desc.len();
                let entries = u64::from(len) / DESC_BYTES;
                if self.indirect
                    || u64::from(len) % DESC_BYTES != 0
                    || entries == 0
                    || entries > u64::from(u16::MAX)
                {
                    return self.end();
                }
                self.indirect = true;
                self.table = desc.addr();
                self.table_len = entries as u16;
                self.next = 0;
                self.ttl = self.table_len;
                continue;
            }
            let Some(bytes) = self.bytes.checked_add(desc.len()) else {
                return self.end();
            };
            self.bytes = bytes;
            if desc.has_next() {
                self.next = desc.next();
                self.ttl -= 1;
            } else {
                self.ttl = 0;
            }
            return Some(desc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::VhostIommu;
    use proptest::prelude::*;
    use virtio_queue::{Queue, QueueT};
    use vm_memory::{GuestMemoryMmap, IommuMemory};

    const SIZE: u16 = 8;
    const TABLE: u64 = 0x1000;
    const AVAIL: u64 = 0x2000;
    const USED: u64 = 0x3000;
    /// Where indirect tables may point.
    const INDIRECT: u64 = 0x4000;

    fn memory() -> DeviceMemory {
        let phys = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        IommuMemory::new(phys, VhostIommu::new(), false, ())
    }

    fn write_desc(mem: &DeviceMemory, at: u64, d: (u64, u32, u16, u16)) {
        mem.write_obj(Descriptor::new(d.0, d.1, d.2, d.3), GuestAddress(at))
            .unwrap();
    }

    /// The chain virtio-queue pops for `head` (placed in the available
    /// ring), as (addr, len, flags, next).
    fn popped(mem: &DeviceMemory, head: u16) -> Vec<(u64, u32, u16, u16)> {
        mem.write_obj(0u16, GuestAddress(AVAIL)).unwrap();
        mem.write_obj(1u16, GuestAddress(AVAIL + 2)).unwrap();
        mem.write_obj(head, GuestAddress(AVAIL + 4)).unwrap();
        let mut q = Queue::new(SIZE).unwrap();
        q.try_set_desc_table_address(GuestAddress(TABLE)).unwrap();
        q.try_set_avail_ring_address(GuestAddress(AVAIL)).unwrap();
        q.try_set_used_ring_address(GuestAddress(USED)).unwrap();
        q.set_ready(true);
        let chain = q.pop_descriptor_chain(mem).expect("a chain");
        chain
            .map(|d| (d.addr().0, d.len(), d.flags(), d.next()))
            .collect()
    }

    fn walked(mem: &DeviceMemory, head: u16) -> Vec<(u64, u32, u16, u16)> {
        HeadChain::new(mem, GuestAddress(TABLE), SIZE, head)
            .map(|d| (d.addr().0, d.len(), d.flags(), d.next()))
            .collect()
    }

    #[test]
    fn walks_plain_indirect_looping_and_broken_chains() {
        const NEXT: u16 = 1;
        const WRITE: u16 = 2;
        const IND: u16 = 4;
        let mem = memory();
        // 2 -> 5 -> 1; 3 is an indirect table of three; 4 <-> 6 loops;
        // 7 points past the table; 0 is a nested indirect.
        let table = [
            (INDIRECT + 0x100, 16, IND, 0),
            (0x8000, 1, WRITE, 0),
            (0x8100, 16, NEXT, 5),
            (INDIRECT, 48, IND, 0),
            (0x8200, 4, NEXT, 6),
            (0x8300, 512, NEXT | WRITE, 1),
            (0x8400, 4, NEXT, 4),
            (0x8500, 8, NEXT, 9),
        ];
        for (i, d) in table.iter().enumerate() {
            write_desc(&mem, TABLE + 16 * i as u64, *d);
        }
        for (i, d) in [
            (0x9000, 16, NEXT, 1),
            (0x9100, 512, NEXT, 2),
            (0x9200, 1, WRITE, 0),
        ]
        .iter()
        .enumerate()
        {
            write_desc(&mem, INDIRECT + 16 * i as u64, *d);
        }
        write_desc(&mem, INDIRECT + 0x100, (INDIRECT, 48, IND, 0));
        let heads = |c: &[(u64, u32, u16, u16)]| c.iter().map(|d| d.0).collect::<Vec<_>>();
        assert_eq!(heads(&walked(&mem, 2)), [0x8100, 0x8300, 0x8000]);
        assert_eq!(heads(&walked(&mem, 3)), [0x9000, 0x9100, 0x9200]);
        // A loop ends after queue-size descriptors.
        assert_eq!(walked(&mem, 4).len(), usize::from(SIZE));
        assert_eq!(heads(&walked(&mem, 7)), [0x8500]);
        assert!(walked(&mem, 0).is_empty(), "nested indirect table");
        assert!(walked(&mem, SIZE).is_empty(), "head past the table");
        for head in 0..SIZE {
            assert_eq!(walked(&mem, head), popped(&mem, head), "head {head}");
        }
    }

    proptest! {
        /// Any descriptor table, any head: the same descriptors as the
        /// chain virtio-queue pops for that head.
        #[test]
        fn walks_as_virtio_queue_does(
            descs in proptest::collection::vec(
                (0u64..0x5000, prop_oneof![Just(0u32), Just(16), Just(48), 0u32..4096, Just(u32::MAX)],
                 0u16..8, 0u16..12),
                16),
            head in 0u16..SIZE,
        ) {
            let mem = memory();
            for (i, &(addr, len, flags, next)) in descs.iter().enumerate() {
                // The first 8 are the ring's table, the rest an indirect
                // table at INDIRECT (only INDIRECT-relative addresses
                // matter for those).
                let at = if i < 8 { TABLE + 16 * i as u64 } else { INDIRECT + 16 * (i as u64 - 8) };
                let addr = if flags & 4 != 0 { INDIRECT + addr % 0x80 * 16 } else { addr };
                write_desc(&mem, at, (addr, len, flags, next));
            }
            prop_assert_eq!(walked(&mem, head), popped(&mem, head));
        }
    }
}
