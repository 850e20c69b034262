//! The order of a pass: which device block the `k`th block of a pass is,
//! sequential or a seeded permutation.

use super::choices::Access;
use super::spec::Workload;

/// The order of a pass: block `k` of the pass is device block `block(k)`
/// of the range.
///
/// `Rand` is a bijection on `0..count` without a table: a 4-round Feistel
/// network on the smallest even number of bits covering `count`, walked
/// again from its output while that falls past `count` (cycle walking).
#[derive(Debug, Clone, Copy)]
pub(super) struct Order {
    count: u64,
    /// Half the Feistel width in bits; 0 for sequential.
    half: u32,
    keys: [u64; 4],
}

impl Order {
    pub(super) fn new(w: &Workload) -> Self {
        let mut half = 0;
        let mut keys = [0; 4];
        if w.access == Access::Rand && w.count > 1 {
            let bits = 64 - (w.count - 1).leading_zeros();
            half = bits.div_ceil(2).max(1);
            let mut s = w.seed;
            for k in &mut keys {
                *k = splitmix64(&mut s);
            }
        }
        Order {
            count: w.count,
            half,
            keys,
        }
    }

    pub(super) fn block(&self, k: u64) -> u64 {
        if self.half == 0 {
            return k;
        }
        let mut x = self.feistel(k);
        while x >= self.count {
            x = self.feistel(x);
        }
        x
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half) - 1;
        let (mut l, mut r) = (x >> self.half, x & mask);
        for key in self.keys {
            let mut s = r ^ key;
            let f = splitmix64(&mut s) & mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half) | r
    }
}

/// One step of splitmix64 (Steele, Lea, Flood 2014): advances `state`
/// and returns a well-mixed 64-bit value.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sequential_order_is_the_identity() {
        let o = Order::new(&Workload {
            count: 10,
            ..Workload::default()
        });
        assert!((0..10).all(|k| o.block(k) == k));
    }

    #[test]
    fn random_order_depends_on_the_seed_and_repeats_with_it() {
        let w = |seed| Workload {
            access: Access::Rand,
            count: 1000,
            seed,
            ..Workload::default()
        };
        let list = |seed| {
            let o = Order::new(&w(seed));
            (0..1000).map(|k| o.block(k)).collect::<Vec<_>>()
        };
        assert_eq!(list(7), list(7));
        assert_ne!(list(7), list(8));
        assert_ne!(list(7), (0..1000).collect::<Vec<_>>());
    }

    proptest! {
        #[test]
        fn random_order_visits_every_block_once(count in 1u64..5000, seed: u64) {
            let o = Order::new(&Workload {
                access: Access::Rand,
                count,
                seed,
                ..Workload::default()
            });
            let mut seen = vec![false; count as usize];
            for k in 0..count {
                let b = o.block(k);
                prop_assert!(b < count);
                prop_assert!(!seen[b as usize], "block {} twice", b);
                seen[b as usize] = true;
            }
        }
    }
}
