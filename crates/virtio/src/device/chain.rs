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
