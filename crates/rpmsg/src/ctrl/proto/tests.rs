//! Round trips and refusals of the wire protocol.

use super::*;

#[test]
fn an_answer_whose_addresses_come_later_parses_as_one_made_whole() {
    let asked = EptInfo::new("bench");
    let flags = (libc::O_RDWR | libc::O_CLOEXEC) as u32;
    let mut b = create_ept_fd_reply(0, &asked, flags);
    set_ept_fd_reply_addrs(&mut b, 1031, 0x400);
    let made = EptInfo {
        src: 1031,
        dst: 0x400,
        ..asked
    };
    assert_eq!(b, create_ept_fd_reply(0, &made, flags));
    let (st, body) = parse_reply(&b, OP_CREATE_EPT_FD, CREATE_EPT_FD_REPLY_LEN).unwrap();
    assert_eq!(st, 0);
    assert_eq!(parse_create_ept_fd_body(body), Ok(made.clone()));
    // The endpoint's largest payload rides along; none named is 496.
    assert_eq!(parse_max_payload(body), crate::wire::MAX_PAYLOAD);
    set_reply_max_payload(&mut b, 4080);
    let (_, body) = parse_reply(&b, OP_CREATE_EPT_FD, CREATE_EPT_FD_REPLY_LEN).unwrap();
    assert_eq!(parse_max_payload(body), 4080);
    assert_eq!(parse_create_ept_fd_body(body), Ok(made));
}

#[test]
fn requests_round_trip() {
    let info = EptInfo {
        name: "echo".into(),
        src: 1030,
        dst: ADDR_ANY,
    };
    for r in [
        Request::CreateEpt(info.clone()),
        Request::CreateEptFd(info.clone(), (libc::O_RDWR | libc::O_CLOEXEC) as u32),
        Request::Stats,
    ] {
        let b = r.encode().unwrap();
        assert_eq!(Request::parse(&b), Ok(r));
    }
    assert_eq!(
        Request::CreateEpt(info.clone()).encode().unwrap().len(),
        8 + 40
    );
    assert_eq!(
        Request::CreateEptFd(info.clone(), 0)
            .encode()
            .unwrap()
            .len(),
        8 + 48
    );
}

#[test]
fn a_create_ept_fd_request_is_the_uapi_struct_little_endian() {
    let info = EptInfo {
        name: "echo".into(),
        src: 1030,
        dst: ADDR_ANY,
    };
    let b = Request::CreateEptFd(info, 2).encode().unwrap();
    let mut want = header(OP_CREATE_EPT_FD).to_vec();
    want.extend_from_slice(b"echo");
    want.extend_from_slice(&[0; 28]);
    for v in [1030u32, ADDR_ANY, 2, u32::MAX] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    assert_eq!(b, want);
}

#[test]
fn refusals() {
    let info = EptInfo::new("x");
    // A flag outside O_ACCMODE | O_NONBLOCK | O_CLOEXEC.
    let b = Request::CreateEptFd(info.clone(), libc::O_APPEND as u32)
        .encode()
        .unwrap();
    assert_eq!(
        Request::parse(&b).unwrap_err(),
        Refusal {
            errno: libc::EINVAL,
            garbage: false
        }
    );
    // 32 name bytes: no room for the NUL.
    let long = EptInfo::new(&"n".repeat(32));
    let b = Request::CreateEpt(long).encode().unwrap();
    assert_eq!(
        Request::parse(&b).unwrap_err(),
        Refusal {
            errno: libc::EINVAL,
            garbage: false
        }
    );
    assert!(Request::CreateEpt(EptInfo::new(&"n".repeat(33)))
        .encode()
        .is_none());
    // Wrong length, unknown op, garbage.
    let b = Request::CreateEpt(info).encode().unwrap();
    let g = |errno| Refusal {
        errno,
        garbage: true,
    };
    assert_eq!(Request::parse(&b[..20]).unwrap_err(), g(libc::EINVAL));
    let mut v = b.clone();
    v[6] = 77;
    assert_eq!(Request::parse(&v).unwrap_err(), g(libc::EOPNOTSUPP));
    assert_eq!(
        Request::parse(b"garbage!garbage").unwrap_err(),
        g(libc::EPROTO)
    );
}

proptest::proptest! {
    /// Any packet a client may send parses to a request or a refusal,
    /// never a panic; what parses encodes back to the same bytes.
    #[test]
    fn any_packet(b in proptest::collection::vec(proptest::num::u8::ANY, 0..80)) {
        if let Ok(r) = Request::parse(&b) {
            let again = r.encode().unwrap();
            proptest::prop_assert_eq!(Request::parse(&again), Ok(r));
        }
    }

    /// Well-formed headers with arbitrary bodies: same, and only the
    /// three ops are accepted.
    #[test]
    fn any_body(op in 0u16..8, body in proptest::collection::vec(proptest::num::u8::ANY, 0..60)) {
        let mut b = header(op).to_vec();
        b.extend_from_slice(&body);
        match Request::parse(&b) {
            Ok(r) => {
                proptest::prop_assert!([OP_CREATE_EPT, OP_CREATE_EPT_FD, OP_STATS].contains(&op));
                proptest::prop_assert_eq!(Request::parse(&r.encode().unwrap()), Ok(r));
            }
            Err(e) => proptest::prop_assert!(e.errno > 0),
        }
    }

    /// Answers: any bytes are an error or a status with a body, never
    /// a panic; so is any body given to the body parsers.
    #[test]
    fn any_answer(b in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
        let _ = parse_create_ept_body(&b);
        let _ = parse_create_ept_fd_body(&b);
        let _ = ServiceStats::parse(&b);
        for (op, len) in [
            (OP_CREATE_EPT, CREATE_EPT_REPLY_LEN),
            (OP_CREATE_EPT_FD, CREATE_EPT_FD_REPLY_LEN),
            (OP_STATS, STATS_REPLY_LEN),
        ] {
            if let Ok((0, body)) = parse_reply(&b, op, len) {
                let _ = parse_create_ept_body(body);
                let _ = parse_create_ept_fd_body(body);
                if op == OP_STATS {
                    let _ = ServiceStats::parse(body);
                }
            }
        }
    }
}

#[test]
fn stats_round_trip() {
    let s = ServiceStats {
        fd_endpoints: 1,
        legacy_endpoints: 2,
        open_nodes: 3,
        clients: 4,
        created: 5,
        destroyed: 6,
        bad_clients: 7,
        oversize: 8,
        dropped: 9,
        msgs: 10,
        tx_payload: 4080,
        rx_payload: 65520,
        too_large: 11,
    };
    let b = s.encode();
    let (st, body) = parse_reply(&b, OP_STATS, STATS_REPLY_LEN).unwrap();
    assert_eq!(st, 0);
    assert_eq!(ServiceStats::parse(body), Some(s));
    assert_eq!(ServiceStats::parse(&body[..10]), None);
}

#[test]
fn attach_request_round_trip_and_refusals() {
    let r = AttachRequest {
        name: "echo".into(),
        src: ADDR_ANY,
        dst: 1024,
        timeout_ms: 500,
    };
    let b = r.encode().unwrap();
    assert_eq!(AttachRequest::parse(&b), Ok(r));
    assert_eq!(AttachRequest::parse(b"junk"), Err(libc::EPROTO));
    let mut v = b;
    v[6] = 9;
    assert_eq!(AttachRequest::parse(&v), Err(libc::EOPNOTSUPP));
    let mut v = b;
    v[4] = 2;
    assert_eq!(AttachRequest::parse(&v), Err(libc::EPROTONOSUPPORT));
    let mut v = b;
    v[8..40].fill(b'x');
    assert_eq!(AttachRequest::parse(&v), Err(libc::EINVAL));
    assert_eq!(AttachRequest::parse(&b[..20]), Err(libc::EINVAL));
}

#[test]
fn addresses_as_people_write_them() {
    assert_eq!(parse_addr("any"), Some(ADDR_ANY));
    assert_eq!(parse_addr("ANY"), Some(ADDR_ANY));
    assert_eq!(parse_addr("1024"), Some(1024));
    assert_eq!(parse_addr("0x400"), Some(0x400));
    for bad in ["", "0x", "-1", "4294967296", "0X400", "one"] {
        assert_eq!(parse_addr(bad), None, "{bad:?}");
    }
}
