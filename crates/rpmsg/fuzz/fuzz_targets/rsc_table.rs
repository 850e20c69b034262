//! Resource tables that lie: start from a valid OpenAMP demo table and
//! overwrite fields (counts, offsets, ring addresses and sizes), plus raw
//! bytes; whatever parses must describe rings inside the shared memory.
#![no_main]

use arbitrary::Arbitrary;
use iopath_rpmsg::rsc_table::{ResourceTable, ShmLayout};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    shm_len: u32,
    /// (byte offset in the table, value) overwrites, as u32 words.
    words: Vec<(u8, u32)>,
    /// Raw bytes appended after the table (config space, junk entries).
    tail: Vec<u8>,
}

fuzz_target!(|i: Input| {
    let mut table = ShmLayout::openamp_demo().table();
    for (at, v) in i.words {
        let at = (usize::from(at) % table.len()) & !3;
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
    }
});
