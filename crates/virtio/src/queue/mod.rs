//! Driver-side split virtqueue (virtio 1.x §2.7).

mod event;
mod ring;
mod split;

pub use event::{need_event, ring_slot, used_pending};
pub use ring::Layout as RingLayout;
pub use split::{Completion, RingPlacement, Seg, SplitQueue, INDIRECT_MAX};
