//! The data patterns: filling a block with `seq` and checking a block
//! read back against a pattern.

use super::choices::Pattern;

/// Fills `out` with the `seq` pattern for device byte offset `dev_off`.
/// `dev_off` and `out.len()` are multiples of 8.
pub fn fill_seq(out: &mut [u8], dev_off: u64) {
    for (i, w) in out.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&(dev_off + 8 * i as u64).to_le_bytes());
    }
}

/// First mismatch of `got` against `pattern` at device offset `dev_off`.
pub fn check_pattern(got: &[u8], pattern: Pattern, dev_off: u64) -> Option<u64> {
    match pattern {
        // Word-granular like `Seq`: the offset of the first 8-byte word that
        // is not zero.
        Pattern::Zero => got
            .iter()
            .position(|&b| b != 0)
            .map(|i| dev_off + (i as u64 & !7)),
        Pattern::Seq => got.chunks_exact(8).enumerate().find_map(|(i, w)| {
            let want = dev_off + 8 * i as u64;
            (w != want.to_le_bytes()).then_some(want)
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_pattern_round_trips_and_finds_the_first_bad_word() {
        let mut b = vec![0u8; 4096];
        fill_seq(&mut b, 1 << 20);
        assert_eq!(
            u64::from_le_bytes(b[8..16].try_into().unwrap()),
            (1 << 20) + 8
        );
        assert_eq!(check_pattern(&b, Pattern::Seq, 1 << 20), None);
        b[100] ^= 1;
        assert_eq!(
            check_pattern(&b, Pattern::Seq, 1 << 20),
            Some((1 << 20) + 96)
        );
        // Word 0 holds 1 MiB, not zero.
        assert_eq!(check_pattern(&b, Pattern::Zero, 0), Some(0));
        assert_eq!(check_pattern(&b[..16], Pattern::Zero, 64), Some(64));
    }
}
