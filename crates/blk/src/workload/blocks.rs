//! [`Blocks`]: the memory of the blocks in flight, one slot per request.

use iopath_heap::{page_size, Buffer, Heap, HugePages, MemfdHeap};

use super::choices::{Op, Pattern};
use super::error::WorkloadError;
use super::spec::Workload;

/// The memory of the blocks in flight: one slot per request.
///
/// When the CPU never writes a block during a pass (zeros, or reads), all
/// slots are ranges of one buffer, so the device needs one memory region for
/// them (vhost-user back ends may accept as few as 8 regions, and the rings
/// take some); one more slot there holds the request a single queue builds
/// while the device works (see [`crate::BlkQueue::limit_in_flight`]).
/// Writing the `seq` pattern needs a buffer per slot, a region each (a
/// buffer with any range mapped for the device refuses CPU writes): no
/// spare slot then.
#[derive(Debug)]
pub struct Blocks {
    /// The buffers, each once.
    pub(super) distinct: Vec<Buffer>,
    /// Per slot: its buffer and the slot's offset in it.
    pub(super) slots: Vec<(Buffer, usize)>,
}

impl Blocks {
    /// Allocates the slots `w` needs from a memfd heap (each buffer rounded
    /// up to whole pages).
    ///
    /// # Errors
    /// [`WorkloadError::Overflow`], [`WorkloadError::Alloc`].
    pub fn new(w: &Workload) -> Result<Self, WorkloadError> {
        let heap = MemfdHeap::new(HugePages::None);
        let alloc = |len: usize| {
            let page = page_size();
            let rounded = len
                .checked_next_multiple_of(page)
                .ok_or(WorkloadError::Overflow {
                    what: "bs x queue_depth",
                    limit: usize::MAX as u64,
                })?;
            heap.alloc(rounded).map_err(|source| WorkloadError::Alloc {
                len: rounded,
                source,
            })
        };
        let per_slot = w.op == Op::Write && w.pattern == Pattern::Seq;
        let n = w.queue_depth + usize::from(!per_slot);
        if per_slot {
            let distinct = (0..n).map(|_| alloc(w.bs)).collect::<Result<Vec<_>, _>>()?;
            let slots = distinct.iter().map(|b| (b.clone(), 0)).collect();
            Ok(Blocks { distinct, slots })
        } else {
            let len = w.bs.checked_mul(n).ok_or(WorkloadError::Overflow {
                what: "bs x queue_depth",
                limit: usize::MAX as u64,
            })?;
            let b = alloc(len)?;
            let slots = (0..n).map(|i| (b.clone(), i * w.bs)).collect();
            Ok(Blocks {
                distinct: vec![b],
                slots,
            })
        }
    }

    /// The distinct buffers (register these with the DMA ops before the
    /// driver shares memory with the device).
    pub fn buffers(&self) -> &[Buffer] {
        &self.distinct
    }
}
