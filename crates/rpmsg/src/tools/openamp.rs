//! OpenAMP's Linux demo (`rpmsg-echo`, `rpmsg-echo-ping`), as far as iopath
//! speaks to it: the service it announces, its shutdown word, its payload
//! `{u64 num; u64 size; u8 data[size]}` filled with `0xA5`, and the fixed
//! files of its Linux platform (`platform_info.c`).
//!
//! The demo's shared-memory layout is [`crate::ShmLayout::openamp_demo`].

use crate::wire::MAX_PAYLOAD;

/// The service OpenAMP's echo demo announces.
pub const SERVICE: &str = "rpmsg-openamp-demo-channel";

/// The word that stops the echo demo (sent as 4 little-endian bytes).
pub const SHUTDOWN: u32 = 0xEF56_A55A;

/// The shared memory of the demo's Linux platform.
pub const SHM: &str = "/dev/shm/openamp.shm";

/// Its notification socket (the remote binds it; one byte per kick).
pub const EVENT: &str = "/tmp/openamp.event.0";

/// [`EVENT`] as a `--notify` spec (`unix:PATH`).
pub const NOTIFY: &str = "unix:/tmp/openamp.event.0";

/// Bytes of the payload's `{u64 num; u64 size}` header.
pub const HEADER_LEN: usize = 16;

/// Largest `size` of a demo payload: an rpmsg payload minus the header.
pub const MAX_DATA: usize = MAX_PAYLOAD - HEADER_LEN;

/// The byte every demo payload's data is filled with.
pub const FILL: u8 = 0xA5;

/// Writes the demo payload number `num` with `size` data bytes into the
/// start of `out`, returning its length (`HEADER_LEN + size`).
///
/// # Panics
/// If `out` is shorter than `HEADER_LEN + size`.
pub fn write_payload(out: &mut [u8], num: u64, size: usize) -> usize {
    let len = HEADER_LEN + size;
    out[..8].copy_from_slice(&num.to_le_bytes());
    out[8..16].copy_from_slice(&(size as u64).to_le_bytes());
    out[HEADER_LEN..len].fill(FILL);
    len
}

/// Whether `data` is the demo payload number `num` with `size` data bytes.
pub fn is_payload(data: &[u8], num: u64, size: usize) -> bool {
    data.len() == HEADER_LEN + size
        && data[..8] == num.to_le_bytes()
        && data[8..16] == (size as u64).to_le_bytes()
        && data[HEADER_LEN..].iter().all(|&b| b == FILL)
}

/// Whether `data` is the shutdown word.
pub fn is_shutdown(data: &[u8]) -> bool {
    data == SHUTDOWN.to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_names_the_event_socket() {
        assert_eq!(NOTIFY, format!("unix:{EVENT}"));
        assert_eq!(MAX_DATA, 480);
    }

    #[test]
    fn payloads_round_trip_and_mismatch() {
        let mut b = [0u8; MAX_PAYLOAD];
        let n = write_payload(&mut b, 7, 3);
        assert_eq!(&b[..n], b"\x07\0\0\0\0\0\0\0\x03\0\0\0\0\0\0\0\xa5\xa5\xa5");
        assert!(is_payload(&b[..n], 7, 3));
        assert!(!is_payload(&b[..n], 8, 3));
        assert!(!is_payload(&b[..n - 1], 7, 3));
        b[n - 1] = 0;
        assert!(!is_payload(&b[..n], 7, 3));
        assert!(is_shutdown(&[0x5a, 0xa5, 0x56, 0xef]));
        assert!(!is_shutdown(&[0x5a, 0xa5, 0x56]));
    }
}
