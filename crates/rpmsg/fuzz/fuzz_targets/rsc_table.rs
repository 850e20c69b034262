//! Resource tables that lie: start from a valid OpenAMP demo table (with
//! or without a buffer-size config space, either convention, any sizes)
//! and overwrite fields (counts, offsets, ring addresses and sizes, config
//! words), plus raw bytes; whatever parses must describe rings inside the
//! shared memory, and buffer sizes a host takes must be sizes a buffer can
//! have, their pool inside the shared memory.
#![no_main]

use arbitrary::Arbitrary;
use iopath_rpmsg::bufsz::{host_negotiate, remote_sizes, BufSizes, Convention};
use iopath_rpmsg::rsc_table::{ResourceTable, ShmLayout};
use iopath_rpmsg::HOST_FEATURES;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    shm_len: u32,
    /// Buffer sizes the table offers before it is overwritten: NuttX's
    /// convention (else Linux's), host → remote, remote → host.
    offer: Option<(bool, u32, u32)>,
    /// The host reads NuttX's convention (else Linux's).
    host_nuttx: bool,
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
        if let Ok((features, sizes)) = host_negotiate(
            v.dfeatures,
            HOST_FEATURES,
            conv(i.host_nuttx),
            &v.config,
            BufSizes::DEFAULT,
        ) {
            assert_eq!(features & !v.dfeatures, 0, "a feature not offered taken");
            assert!(sizes.check().is_ok(), "{sizes:?}");
            if let Ok((start, size)) = t.buffer_pool_for(shm_len, sizes) {
                assert!(start + size <= shm_len);
            }
            if let Ok(s) = remote_sizes(v.dfeatures, features, &v.config, None) {
                assert_eq!(s, sizes, "host and remote disagree");
            }
        }
    }
});
