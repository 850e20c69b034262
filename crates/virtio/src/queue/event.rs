//! Ring index arithmetic (virtio 1.x §2.7): free-running 16-bit indices,
//! ring slots, and the `EVENT_IDX` test. Pure functions, property-tested.

/// Ring slot of free-running index `idx` in a queue of `size` (a power of
/// two): `idx mod size` (§2.7.6, §2.7.8).
pub fn ring_slot(idx: u16, size: u16) -> u16 {
    debug_assert!(size.is_power_of_two());
    idx & (size - 1)
}

/// `vring_need_event` (§2.7.10, include/uapi/linux/virtio_ring.h): after
/// moving an index from `old` to `new`, whether the other side asked to be
/// notified when it passes `event` — i.e. whether `event` lies in
/// `[old, new)` modulo 2^16.
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// How many used elements the device has published beyond `last_used`, or
/// `None` if `used_idx` ran more than `size` ahead (a device bug: it cannot
/// have used more buffers than the ring holds).
pub fn used_pending(used_idx: u16, last_used: u16, size: u16) -> Option<u16> {
    let n = used_idx.wrapping_sub(last_used);
    (n <= size).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn need_event_examples() {
        // The device asked to be told when avail idx passes 5.
        assert!(need_event(5, 6, 5));
        assert!(need_event(5, 10, 0));
        assert!(!need_event(5, 5, 0)); // 5 not yet published
        assert!(!need_event(5, 12, 6)); // already told earlier
                                        // Wrap-around: old 65534, new 2 covers 65534, 65535, 0, 1.
        assert!(need_event(65535, 2, 65534));
        assert!(need_event(1, 2, 65534));
        assert!(!need_event(2, 2, 65534));
    }

    proptest! {
        /// need_event(e, new, old) holds exactly when e is one of the indices
        /// old, old+1, ..., new-1 (mod 2^16), for any distance below 2^16.
        #[test]
        fn need_event_is_interval_membership(old: u16, dist in 0u16..u16::MAX, off: u16) {
            let new = old.wrapping_add(dist);
            let event = old.wrapping_add(off);
            let inside = off < dist;
            prop_assert_eq!(need_event(event, new, old), inside);
        }

        /// Slots cycle through 0..size as the free-running index wraps past
        /// 2^16, because size divides 2^16.
        #[test]
        fn ring_slot_wraps_consistently(idx: u16, shift in 0u32..16, steps in 0u32..70000) {
            let size = 1u16 << shift;
            let later = idx.wrapping_add(steps as u16);
            let expect = ((idx as u32 + steps) % size as u32) as u16;
            prop_assert_eq!(ring_slot(later, size), expect);
            prop_assert!(ring_slot(idx, size) < size);
        }

        /// used_pending accepts exactly distances 0..=size, across the wrap.
        #[test]
        fn used_pending_bounds(last: u16, shift in 0u32..16, dist: u16) {
            let size = 1u16 << shift;
            let got = used_pending(last.wrapping_add(dist), last, size);
            if dist <= size {
                prop_assert_eq!(got, Some(dist));
            } else {
                prop_assert_eq!(got, None);
            }
        }
    }
}
