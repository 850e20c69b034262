//! A received buffer as the peer may have filled it: header, payload, and
//! for the name-service address the `{name[32], addr, flags}` record.
#![no_main]

use arbitrary::Arbitrary;
use iopath_rpmsg::wire::{parse_message, Endian, NsMsg, HDR_LEN};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    src: u32,
    dst: u32,
    reserved: u32,
    len: u16,
    flags: u16,
    big_endian: bool,
    body: Vec<u8>,
}

fuzz_target!(|i: Input| {
    let e = if i.big_endian {
        Endian::Big
    } else {
        Endian::Little
    };
    let mut buf = Vec::with_capacity(HDR_LEN + i.body.len());
    let put32 = |v: u32| {
        if i.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let put16 = |v: u16| {
        if i.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    buf.extend_from_slice(&put32(i.src));
    buf.extend_from_slice(&put32(i.dst));
    buf.extend_from_slice(&put32(i.reserved));
    buf.extend_from_slice(&put16(i.len));
    buf.extend_from_slice(&put16(i.flags));
    buf.extend_from_slice(&i.body);
    if let Ok((h, payload)) = parse_message(&buf, e) {
        assert_eq!(usize::from(h.len), payload.len());
        assert!(HDR_LEN + payload.len() <= buf.len());
        if let Ok(ns) = NsMsg::parse(payload, e) {
            // What parses must encode back to the same record.
            let again = ns.encode(e).expect("a parsed name is sendable");
            assert_eq!(NsMsg::parse(&again, e).unwrap(), ns);
        }
    }
});
