//! Program headers as an untrusted executable may lay them out: an ELF
//! header with any class, byte order, table offset, entry size and count,
//! program header types, then a cut anywhere. `linkage` answers or errs,
//! never panics, and finds an interpreter a well-formed table names.
#![no_main]

use arbitrary::Arbitrary;
use iopath_rpmsg::tools::elf::{linkage, Linkage};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    class: u8,
    big_endian: bool,
    phoff: u16,
    phentsize: u16,
    types: Vec<u32>,
    cut: Option<u16>,
}

fuzz_target!(|i: Input| {
    let elf64 = i.class % 3 == 2;
    let class = i.class % 3;
    let mut b = vec![0u8; 64];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = class;
    b[5] = if i.big_endian { 2 } else { 1 };
    let put = |b: &mut Vec<u8>, at: usize, v: u64, n: usize| {
        let bytes = v.to_le_bytes();
        for k in 0..n {
            let x = if i.big_endian { bytes[n - 1 - k] } else { bytes[k] };
            b[at + k] = x;
        }
    };
    let phnum = i.types.len().min(64) as u64;
    let (phoff_at, ent_at, num_at, off_len) = if elf64 { (32, 54, 56, 8) } else { (28, 42, 44, 4) };
    put(&mut b, phoff_at, u64::from(i.phoff), off_len);
    put(&mut b, ent_at, u64::from(i.phentsize), 2);
    put(&mut b, num_at, phnum, 2);
    for (k, t) in i.types.iter().take(64).enumerate() {
        let at = usize::from(i.phoff) + k * usize::from(i.phentsize);
        if b.len() < at + 4 {
            b.resize(at + 4, 0);
        }
        put(&mut b, at, u64::from(*t), 4);
    }
    let whole = linkage(&b);
    if class != 0 && i.phentsize >= 4 && i.phoff >= 64 {
        // Every entry lies in the buffer, none over the header or another:
        // the answer is exact.
        let first_interp = i.types.iter().take(64).any(|&t| t == 3);
        let want = if first_interp { Linkage::Dynamic } else { Linkage::Static };
        assert_eq!(whole, Ok(want), "{i:?}");
    }
    if let Some(c) = i.cut {
        let _ = linkage(&b[..usize::from(c).min(b.len())]);
    }
});
