//! Buffer-size negotiation: each convention's layout, the host's and the
//! remote's side, refusals, and parsing any bytes.

use super::*;
use proptest::prelude::*;

const NS: u32 = 1;
/// Sizes a host would use under the fixed convention.
const FIXED: BufSizes = BufSizes {
    to_remote: 2048,
    to_host: 1024,
};

#[test]
fn fixed_takes_no_bit_and_reads_no_config() {
    assert_eq!(Convention::Fixed.bit(), None);
    assert!(Convention::Fixed.config(FIXED).is_empty());
    assert_eq!("fixed".parse(), Ok(Convention::Fixed));
    // Whatever the device offers, a fixed host takes no size bit and
    // uses its own sizes.
    let all = NS | BUFSZ_BITS;
    let cfg = Convention::Linux.config(BufSizes::both(4096));
    for d in [
        NS,
        NS | 1 << VIRTIO_RPMSG_F_BUFSZ,
        NS | 1 << NUTTX_RPMSG_F_BUFSZ,
    ] {
        assert_eq!(
            host_negotiate(d, all, Convention::Fixed, &cfg, FIXED),
            Ok((NS, FIXED))
        );
        // A fixed remote uses its own sizes whatever the table says.
        assert_eq!(remote_sizes(d, d, &cfg, Some(FIXED)), Ok(FIXED));
    }
    assert!(matches!(
        host_negotiate(NS, all, Convention::Fixed, &[], BufSizes::both(1002)),
        Err(BufSizeError::Size { size: 1002, .. })
    ));
    assert!(remote_sizes(NS, NS, &[], Some(BufSizes::both(8))).is_err());
}

#[test]
fn linux_layout_is_v5_s() {
    let s = BufSizes {
        to_remote: 0x2000,
        to_host: 0x800,
    };
    let b = Convention::Linux.config(s);
    // Version 1, size 13, align 0, tx (remote → host) 2K, rx 8K.
    assert_eq!(b, [1, 13, 0, 0, 0, 0, 8, 0, 0, 0, 0x20, 0, 0]);
    assert_eq!(Convention::Linux.parse(&b), Ok(s));
    assert_eq!(
        Convention::Linux.config(BufSizes::both(4096)),
        [1, 13, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x10, 0, 0]
    );
    // Bytes past the struct are not read.
    let mut longer = b.clone();
    longer.extend_from_slice(&[0xff; 8]);
    assert_eq!(Convention::Linux.parse(&longer), Ok(s));
    // A power-of-two alignment is taken; it never changes the sizes.
    for align in [1u16, 2, 64, 4096, 32768] {
        let mut a = b.clone();
        a[3..5].copy_from_slice(&align.to_le_bytes());
        assert_eq!(Convention::Linux.parse(&a), Ok(s), "align {align}");
    }
    let n = Convention::Nuttx.config(s);
    assert_eq!(n.len(), 64);
    assert_eq!(&n[..8], &[0, 0x20, 0, 0, 0, 8, 0, 0]);
    assert_eq!(Convention::Nuttx.parse(&n), Ok(s));
}

#[test]
fn negotiation_follows_the_convention() {
    let s = BufSizes::both(4096);
    let all = NS | BUFSZ_BITS;
    // Linux: bit 1 with a Linux config.
    let cfg = Convention::Linux.config(s);
    let d = NS | 1 << VIRTIO_RPMSG_F_BUFSZ;
    assert_eq!(
        host_negotiate(d, all, Convention::Linux, &cfg, FIXED),
        Ok((d, s))
    );
    // A host that does not take the feature: 512, bit not acked.
    assert_eq!(
        host_negotiate(d, NS, Convention::Linux, &cfg, FIXED),
        Ok((NS, BufSizes::DEFAULT))
    );
    // A NuttX host never takes bit 1 (its ACK).
    assert_eq!(
        host_negotiate(d, all, Convention::Nuttx, &cfg, FIXED),
        Ok((NS, BufSizes::DEFAULT))
    );
    // NuttX: bits 1 and 2; a Linux host refuses rather than misread.
    let cfg = Convention::Nuttx.config(s);
    let d = NS | 1 << NUTTX_RPMSG_F_ACK | 1 << NUTTX_RPMSG_F_BUFSZ;
    assert_eq!(
        host_negotiate(d, all, Convention::Linux, &cfg, FIXED),
        Err(BufSizeError::Conflict)
    );
    assert_eq!(
        host_negotiate(d, all, Convention::Nuttx, &cfg, FIXED),
        Ok((NS | 1 << NUTTX_RPMSG_F_BUFSZ, s))
    );
    // The remote reads what the host took.
    assert_eq!(
        remote_sizes(d, NS | 1 << NUTTX_RPMSG_F_BUFSZ, &cfg, None),
        Ok(s)
    );
    assert_eq!(remote_sizes(d, NS, &cfg, None), Ok(BufSizes::DEFAULT));
}

/// A Linux config with `f` applied to its bytes, parsed.
fn linux_with(f: impl FnOnce(&mut Vec<u8>)) -> Result<BufSizes, BufSizeError> {
    let mut b = Convention::Linux.config(BufSizes::both(4096));
    f(&mut b);
    Convention::Linux.parse(&b)
}

#[test]
fn bad_linux_configs_are_refused_naming_the_field() {
    let e = linux_with(|b| b[0] = 0).unwrap_err();
    assert_eq!(e, BufSizeError::Version { version: 0 });
    assert!(e.to_string().contains("version 0 is not 1"), "{e}");
    for size in [0u16, 11, 16, 66] {
        let e = linux_with(|b| b[1..3].copy_from_slice(&size.to_le_bytes())).unwrap_err();
        assert_eq!(e, BufSizeError::ConfigSize { size });
        assert!(
            e.to_string()
                .contains(&format!("size field {size} is not 13")),
            "{e}"
        );
    }
    for align in [3u16, 6, 1000, 65535] {
        let e = linux_with(|b| b[3..5].copy_from_slice(&align.to_le_bytes())).unwrap_err();
        assert_eq!(e, BufSizeError::Align { align });
        assert!(
            e.to_string().contains(&format!(
                "rpmsg_buf_align {align} is not 0 or a power of two"
            )),
            "{e}"
        );
    }
    // Sizes: the field, its value and whose bound.
    for (at, field, size, why) in [
        (5, "txbuf_size", 16, "below 512, iopath's own bound"),
        (5, "txbuf_size", 508, "below 512"),
        (9, "rxbuf_size", 0, "below 512"),
        (
            9,
            "rxbuf_size",
            65540,
            "above 65536 (64K), iopath's own bound",
        ),
        (5, "txbuf_size", 1002, "not a multiple of 4"),
    ] {
        let e = linux_with(|b| b[at..at + 4].copy_from_slice(&u32::to_le_bytes(size))).unwrap_err();
        let BufSizeError::Field {
            field: f,
            size: got,
            ..
        } = e
        else {
            panic!("{e:?}")
        };
        assert_eq!((f, got), (field, size));
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("rpmsg config {field} {size} (")),
            "{msg}"
        );
        assert!(msg.contains(why), "{msg}");
    }
    assert_eq!(
        linux_with(|b| b[5..9].copy_from_slice(&65536u32.to_le_bytes())),
        Ok(BufSizes {
            to_host: 65536,
            to_remote: 4096
        })
    );
    // The checks run in Linux's order: version first.
    assert!(matches!(
        linux_with(|b| *b = vec![2, 16, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        Err(BufSizeError::Version { version: 2 })
    ));
    // The 66-byte layout of the proposal's v2 is not read as this one.
    let v2 = [0u8, 0, 0, 0x10, 0, 0, 0, 0x10, 0, 0];
    assert!(Convention::Linux.parse(&v2).is_err());
    assert!(matches!(
        Convention::Linux.parse(&Convention::Linux.config(BufSizes::both(4096))[..12]),
        Err(BufSizeError::ConfigShort {
            len: 12,
            need: 13,
            ..
        })
    ));
}

#[test]
fn bad_nuttx_offers_are_refused_with_the_size() {
    let n = |to_remote, to_host| {
        Convention::Nuttx.parse(&Convention::Nuttx.config(BufSizes { to_remote, to_host }))
    };
    for (size, why) in [
        (0, "zero"),
        (16, "header"),
        (1001, "multiple of 4"),
        (65540, "65536"),
    ] {
        let e = n(4096, size).unwrap_err();
        assert!(e.to_string().contains(&size.to_string()), "{e}");
        assert!(e.to_string().contains(why), "{e}");
        assert!(e.to_string().contains("remote → host"), "{e}");
    }
    assert!(n(65536, 20).is_ok());
    assert!(matches!(
        Convention::Nuttx.parse(&[0; 4]),
        Err(BufSizeError::ConfigShort {
            len: 4,
            need: 8,
            ..
        })
    ));
    assert!(BufSizes::both(256).check_offer().is_err());
    assert!(BufSizes::both(512).check_offer().is_ok());
}

proptest! {
    #[test]
    fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..80), linux: bool) {
        let c = if linux { Convention::Linux } else { Convention::Nuttx };
        prop_assert_eq!(Convention::Fixed.parse(&b), Ok(BufSizes::DEFAULT));
        if let Ok(s) = c.parse(&b) {
            prop_assert!(s.check().is_ok());
        }
    }

    /// What the fuzz targets check per input, over any offer: a fixed host
    /// takes no size bit whatever is offered and uses its own sizes, or
    /// refuses them exactly when no buffer can have them; the remote,
    /// given the same sizes, agrees. The other conventions agree too.
    #[test]
    fn every_mode_agrees_with_the_remote(
        bits in 0u32..8,
        config in proptest::collection::vec(any::<u8>(), 0..40),
        mode in 0usize..3,
        fixed in (any::<u32>(), any::<u32>()),
    ) {
        let conv = [Convention::Linux, Convention::Nuttx, Convention::Fixed][mode];
        let fixed = BufSizes { to_remote: fixed.0 % 70_000, to_host: fixed.1 % 70_000 };
        let d = NS | (bits << 1) & BUFSZ_BITS;
        let r = host_negotiate(d, NS | BUFSZ_BITS, conv, &config, fixed);
        if conv == Convention::Fixed {
            prop_assert_eq!(r.is_ok(), fixed.check().is_ok());
        }
        if let Ok((f, sizes)) = r {
            prop_assert_eq!(f & !d, 0);
            prop_assert!(sizes.check().is_ok());
            let remote_fixed = (conv == Convention::Fixed).then_some(fixed);
            if remote_fixed.is_some() {
                prop_assert_eq!((f & BUFSZ_BITS, sizes), (0, fixed));
            }
            prop_assert_eq!(remote_sizes(d, f, &config, remote_fixed), Ok(sizes));
        }
    }
}
