//! Resource tables that lie: start from a valid OpenAMP demo table (with
//! or without a buffer-size config space, either convention, any sizes)
//! and overwrite fields (counts, offsets, ring addresses and sizes, config
//! words), plus raw bytes; whatever parses must describe rings inside the
//! shared memory, and buffer sizes a host takes must be sizes a buffer can
//! have, their pool inside the shared memory. The host reads Linux's
//! convention, NuttX's, or none (fixed sizes, upstream OpenAMP's way: any
//! sizes given, no bit taken, the table's config never read).
#![no_main]

use arbitrary::Arbitrary;
use iopath_rpmsg::bufsz::{host_negotiate, remote_sizes, BufSizes, Convention, BUFSZ_BITS};
use iopath_rpmsg::rsc_table::{ResourceTable, ShmLayout};
use iopath_rpmsg::HOST_FEATURES;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    shm_len: u32,
    /// Buffer sizes the table offers before it is overwritten: NuttX's
    /// convention (else Linux's), host → remote, remote → host.
    offer: Option<(bool, u32, u32)>,
    /// The host's convention: Linux's, NuttX's or fixed (by the value
    /// modulo 3).
    host_mode: u8,
    /// Both sides' sizes under the fixed convention, host → remote and
    /// remote → host (any values: refused ones must be refused).
    fixed: (u32, u32),
    /// (byte offset in the table, value) overwrites, as u32 words.
    words: Vec<(u8, u32)>,
    /// Raw bytes appended after the table (config space, junk entries).
    tail: Vec<u8>,
}

fuzz_target!(|i: Input| {
    let conv = |nuttx| {
        if nuttx {
            Convention::Nuttx
        } else {
            Convention::Linux
        }
    };
    let host_conv =
        [Convention::Linux, Convention::Nuttx, Convention::Fixed][usize::from(i.host_mode % 3)];
    let fixed = BufSizes {
        to_remote: i.fixed.0,
        to_host: i.fixed.1,
    };
    let mut layout = ShmLayout::openamp_demo();
    layout.buf_sizes = i
        .offer
        .map(|(nuttx, to_remote, to_host)| (conv(nuttx), BufSizes { to_remote, to_host }));
    let mut table = layout.table();
    for (at, v) in i.words {
        // A whole word inside the table (a config space can leave a
        // tail that is not one).
        let at = usize::from(at) % (table.len() / 4) * 4;
        table[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    table.extend_from_slice(&i.tail);
    let shm_len = u64::from(i.shm_len);
    if let Ok(t) = ResourceTable::parse(&table, 0, shm_len) {
        assert!(t.extent <= table.len());
        for r in &t.vdev.vrings {
            let l = r.layout().expect("validated ring has a layout");
            assert!(l.end() <= shm_len);
            assert!(l.desc >= t.extent as u64, "ring over the table");
        }
        if let Ok((start, size)) = t.buffer_pool(shm_len) {
            assert!(start + size <= shm_len);
        }
        let v = &t.vdev;
        assert_eq!(v.config.len(), v.config_len as usize);
        let negotiated = host_negotiate(v.dfeatures, HOST_FEATURES, host_conv, &v.config, fixed);
        if host_conv == Convention::Fixed {
            // Nothing offered matters: the sizes given, or a refusal.
            assert_eq!(negotiated.is_ok(), fixed.check().is_ok(), "{fixed:?}");
        }
        if let Ok((features, sizes)) = negotiated {
            assert_eq!(features & !v.dfeatures, 0, "a feature not offered taken");
            assert!(sizes.check().is_ok(), "{sizes:?}");
            if let Ok((start, size)) = t.buffer_pool_for(shm_len, sizes) {
                assert!(start + size <= shm_len);
            }
            let remote_fixed = (host_conv == Convention::Fixed).then_some(fixed);
            if host_conv == Convention::Fixed {
                assert_eq!(features & BUFSZ_BITS, 0, "a size bit taken when fixed");
                assert_eq!(sizes, fixed);
            }
            if let Ok(s) = remote_sizes(v.dfeatures, features, &v.config, remote_fixed) {
                assert_eq!(s, sizes, "host and remote disagree");
            }
        }
    }
});
