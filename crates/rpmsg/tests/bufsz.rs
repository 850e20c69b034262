//! Buffer sizes beyond 512 bytes: a remote offers them, a host in the same
//! process takes them, and the largest payloads each way cross byte for
//! byte through the Bus API and through an endpoint fd; offers that cannot
//! be honoured are refused with the size; without an offer the table is
//! the one of before.

use std::time::Duration;

use iopath_rpmsg::bufsz::{BufSizeError, BufSizes, Convention};
use iopath_rpmsg::ctrl::proto::EptInfo;
use iopath_rpmsg::ctrl::CtrlClient;
use iopath_rpmsg::rsc_table::ShmLayout;
use iopath_rpmsg::wire::HDR_LEN;
use iopath_rpmsg::{
    Bus, BusError, CtrlServer, EndpointOptions, Event, HostOptions, LinkError, NotifySpec,
    SharedMem, HOST_FEATURES,
};

const T: Duration = Duration::from_secs(20);

fn pattern(size: usize, seed: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i * 7 + seed * 13 + i / 251) as u8)
        .collect()
}

struct Pair {
    host: Bus,
    remote: Bus,
    _dir: tempfile::TempDir,
}

/// A remote offering `offer` (none: today's table) whose "echo" endpoint
/// answers every message with a reply of `reply_len(len)` bytes (a pattern
/// seeded by the length received), and a host taking it over with `opts`.
fn pair(
    offer: Option<(Convention, BufSizes)>,
    opts: HostOptions,
    ring: u32,
) -> Result<Pair, BusError> {
    let fixed = match offer {
        Some((Convention::Fixed, s)) => Some(s),
        _ => None,
    };
    pair_fixed(offer, opts, ring, fixed)
}

/// As [`pair`], the remote using `fixed` sizes whatever its table says.
fn pair_fixed(
    offer: Option<(Convention, BufSizes)>,
    opts: HostOptions,
    ring: u32,
    fixed: Option<BufSizes>,
) -> Result<Pair, BusError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shm");
    let sizes = offer.map_or(BufSizes::DEFAULT, |(_, s)| s);
    let size = ShmLayout::size_for(ring, sizes).unwrap();
    let mut layout = ShmLayout::for_size(size, ring).unwrap();
    if let Some((c, s)) = offer {
        layout = layout.with_buf_sizes(c, s).unwrap();
    }
    let shm = SharedMem::create(&path, &layout).unwrap();
    let spec = NotifySpec::Eventfd(dir.path().join("n"));
    let listener = spec.bind().unwrap();
    let remote = std::thread::spawn(move || {
        let n = listener.accept().unwrap();
        let bus = Bus::remote_with(shm, n, Some(T), fixed)?;
        let max = bus.max_payload();
        let ep = bus
            .create_with_callback(EndpointOptions::new("echo"), move |ep, ev| {
                if let Event::Message(m) = ev {
                    // Answer with the largest payload this side may send,
                    // seeded by what came: both directions at their limit.
                    let reply = pattern(max, m.data.len());
                    ep.send_to(m.src, &reply, Some(T)).unwrap();
                }
            })
            .unwrap();
        std::mem::forget(ep);
        Ok::<_, BusError>(bus)
    });
    let host = Bus::host_with(
        SharedMem::open(&path).unwrap(),
        spec.connect(T).unwrap(),
        &opts,
    );
    let host = match host {
        Ok(h) => h,
        Err(e) => {
            // The remote never sees DRIVER_OK: let its wait end.
            drop(remote);
            return Err(e);
        }
    };
    let remote = remote.join().unwrap()?;
    Ok(Pair {
        host,
        remote,
        _dir: dir,
    })
}

fn bus_round_trips(p: &Pair, want: BufSizes) {
    let (tx, rx) = (
        want.to_remote as usize - HDR_LEN,
        want.to_host as usize - HDR_LEN,
    );
    assert_eq!(p.host.max_payload(), tx);
    assert_eq!(p.host.max_rx_payload(), rx);
    assert_eq!(p.remote.max_payload(), rx);
    assert_eq!(p.remote.max_rx_payload(), tx);
    let ch = p.host.wait_channel("echo", T).unwrap();
    let ep = p
        .host
        .create(EndpointOptions::new("echo").dst(ch.addr))
        .unwrap();
    for (i, len) in [tx, 1, tx - 1, 497.min(tx), tx].into_iter().enumerate() {
        let data = pattern(len, i);
        ep.send(&data).unwrap();
        let m = ep.recv(Some(T)).unwrap();
        assert_eq!(m.data, pattern(rx, len), "reply to {len} bytes");
    }
    assert!(matches!(
        ep.send(&vec![0; tx + 1]),
        Err(BusError::TooLarge { len, max }) if len == tx + 1 && max == tx
    ));
    // More messages than the ring has buffers, each at the limit.
    let h = ep.handle();
    let n = 300;
    let sender = std::thread::spawn(move || {
        for i in 0..n {
            h.send(&pattern(tx, i)).unwrap();
        }
    });
    for _ in 0..n {
        assert_eq!(ep.recv(Some(T)).unwrap().data, pattern(rx, tx));
    }
    sender.join().unwrap();
    let s = p.host.stats();
    assert_eq!(s.rx_malformed + s.rx_refused + s.rx_unknown_dst, 0);
}

fn fd_round_trips(p: &Pair, want: BufSizes) {
    let (tx, rx) = (
        want.to_remote as usize - HDR_LEN,
        want.to_host as usize - HDR_LEN,
    );
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ctrl");
    let server = CtrlServer::start(p.host.clone(), &sock).unwrap();
    let c = CtrlClient::connect(&sock).unwrap();
    let st = c.stats().unwrap();
    assert_eq!((st.tx_payload as usize, st.rx_payload as usize), (tx, rx));
    let ep = c
        .create_ept_fd(&EptInfo::new("echo"), libc::O_RDWR as u32)
        .unwrap();
    assert_eq!(ep.max_payload(), tx);
    let mut back = vec![0u8; rx + 1];
    for (i, len) in [tx, 1, tx].into_iter().enumerate() {
        ep.send(&pattern(len, i)).unwrap();
        let n = ep.recv_timeout(&mut back, T).unwrap().expect("a reply");
        assert_eq!(&back[..n], &pattern(rx, len)[..], "reply to {len} bytes");
    }
    let e = ep.send(&vec![0; tx + 1]).unwrap_err();
    assert!(
        matches!(&e, iopath_rpmsg::ctrl::CtrlError::Io { source, .. }
            if source.raw_os_error() == Some(libc::EMSGSIZE)),
        "{e:?}"
    );
    // The kernel itself takes a raw write of the largest payload.
    rustix::net::send(ep.fd(), &pattern(tx, 9), rustix::net::SendFlags::empty()).unwrap();
    let n = ep.recv_timeout(&mut back, T).unwrap().expect("a reply");
    assert_eq!(&back[..n], &pattern(rx, tx)[..]);
    drop(ep);
    server.shutdown();
}

fn negotiate(c: Convention, sizes: BufSizes) {
    let opts = HostOptions {
        convention: c,
        ..HostOptions::default()
    };
    let p = pair(Some((c, sizes)), opts, 64).unwrap();
    let bit = 1 << c.bit().unwrap();
    assert_eq!(p.host.features() & bit, bit);
    bus_round_trips(&p, sizes);
    fd_round_trips(&p, sizes);
    p.host.shutdown();
    p.remote.shutdown();
}

#[test]
fn linux_4k() {
    negotiate(Convention::Linux, BufSizes::both(4096));
}

#[test]
fn linux_64k() {
    negotiate(Convention::Linux, BufSizes::both(64 * 1024));
}

#[test]
fn nuttx_per_direction() {
    negotiate(
        Convention::Nuttx,
        BufSizes {
            to_remote: 4096,
            to_host: 64 * 1024,
        },
    );
}

#[test]
fn linux_per_direction() {
    negotiate(
        Convention::Linux,
        BufSizes {
            to_remote: 64 * 1024,
            to_host: 2048,
        },
    );
}

/// A host that does not take the feature runs at 512 bytes, with the
/// feature bit left out of its acknowledgement.
#[test]
fn declined_offer_is_512() {
    let opts = HostOptions {
        features: HOST_FEATURES & !(1 << iopath_rpmsg::bufsz::VIRTIO_RPMSG_F_BUFSZ),
        ..HostOptions::default()
    };
    let p = pair(Some((Convention::Linux, BufSizes::both(4096))), opts, 64).unwrap();
    assert_eq!(p.host.features() & 0b110, 0);
    bus_round_trips(&p, BufSizes::DEFAULT);
    p.host.shutdown();
    p.remote.shutdown();
}

/// NuttX's bits read by a host of Linux's convention: refused, not
/// misread.
#[test]
fn conflicting_bits_are_refused() {
    // iopath's NuttX layout offers bit 2 only; NuttX adds its ACK at bit 1.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shm");
    let sizes = BufSizes::both(4096);
    let mut layout = ShmLayout::for_size(ShmLayout::size_for(64, sizes).unwrap(), 64)
        .unwrap()
        .with_buf_sizes(Convention::Nuttx, sizes)
        .unwrap();
    layout.dfeatures |= 1 << iopath_rpmsg::bufsz::NUTTX_RPMSG_F_ACK;
    let _shm = SharedMem::create(&path, &layout).unwrap();
    let e =
        iopath_rpmsg::HostLink::start(SharedMem::open(&path).unwrap(), HOST_FEATURES).unwrap_err();
    assert!(
        matches!(e, LinkError::BufSize(BufSizeError::Conflict)),
        "{e:?}"
    );
}

/// Offers a host refuses: each named with its size, the device marked
/// FAILED.
#[test]
fn bad_offers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shm");
    let good = BufSizes::both(4096);
    let layout = ShmLayout::for_size(ShmLayout::size_for(64, good).unwrap(), 64)
        .unwrap()
        .with_buf_sizes(Convention::Linux, good)
        .unwrap();
    let shm = SharedMem::create(&path, &layout).unwrap();
    let t = shm.table(0).unwrap();
    let cfg = t.vdev.offset as u64 + 28 + 2 * 20;
    // Linux's 13-byte config: version, size, align, tx, rx.
    let le = |v: u32| v.to_le_bytes();
    let config = |version: u8, size: u16, align: u16, tx: u32, rx: u32| {
        let mut b = vec![version];
        b.extend_from_slice(&size.to_le_bytes());
        b.extend_from_slice(&align.to_le_bytes());
        b.extend_from_slice(&le(tx));
        b.extend_from_slice(&le(rx));
        b
    };
    for (bytes, want) in [
        (config(0, 13, 0, 4096, 4096), "version 0 is not 1"),
        (config(1, 66, 0, 4096, 4096), "size field 66 is not 13"),
        (
            config(1, 13, 48, 4096, 4096),
            "rpmsg_buf_align 48 is not 0 or a power of two",
        ),
        (
            config(1, 13, 0, 256, 4096),
            "txbuf_size 256 (remote → host) is below 512, iopath's own bound",
        ),
        (
            config(1, 13, 0, 4096, 65540),
            "rxbuf_size 65540 (host → remote) is above 65536",
        ),
        (
            config(1, 13, 0, 1002, 4096),
            "txbuf_size 1002 (remote → host) is not a multiple of 4",
        ),
        // Valid, but more than the shared memory holds.
        (config(1, 13, 0, 65536, 4096), "65536"),
    ] {
        shm.write(cfg, &bytes).unwrap();
        let e = iopath_rpmsg::HostLink::start(SharedMem::open(&path).unwrap(), HOST_FEATURES)
            .unwrap_err();
        let LinkError::BufSize(e) = e else {
            panic!("{bytes:?}: {e:?}")
        };
        assert!(e.to_string().contains(want), "{bytes:?}: {e}");
        let st = shm.load_u8(t.vdev.status_offset() as u64).unwrap();
        assert_ne!(st & iopath_rpmsg::rsc_table::status::FAILED, 0);
    }
}

/// Without an offer nothing on the wire changes: the table is byte for
/// byte what it was, and 512-byte buffers are what the host posts.
#[test]
fn no_offer_is_today_s_table() {
    let l = ShmLayout::openamp_demo();
    let t = l.table();
    assert_eq!(t.len(), 88);
    // dfeatures = NS only, config_len 0, no config bytes.
    assert_eq!(&t[32..36], &1u32.to_le_bytes());
    assert_eq!(&t[40..44], &0u32.to_le_bytes());
    let p = pair(None, HostOptions::default(), 256).unwrap();
    assert_eq!(p.host.features() & 0b110, 0);
    bus_round_trips(&p, BufSizes::DEFAULT);
    p.host.shutdown();
    p.remote.shutdown();
}

/// Upstream OpenAMP's way: nothing negotiated, both sides given 2 KiB.
/// The table offers no bit and no config, and 2032-byte payloads cross
/// byte for byte both ways.
#[test]
fn fixed_2k_both_sides() {
    let sizes = BufSizes::both(2048);
    let opts = HostOptions {
        convention: Convention::Fixed,
        fixed: sizes,
        ..HostOptions::default()
    };
    let p = pair(Some((Convention::Fixed, sizes)), opts, 64).unwrap();
    assert_eq!(p.host.features() & iopath_rpmsg::bufsz::BUFSZ_BITS, 0);
    bus_round_trips(&p, sizes);
    fd_round_trips(&p, sizes);
    p.host.shutdown();
    p.remote.shutdown();
}

/// A fixed host of 2 KiB against a remote left at 512: the remote reads
/// what the host wrote (up to 64 KiB), its replies are its own 496 bytes;
/// nothing breaks.
#[test]
fn fixed_mismatch_is_read_as_written() {
    let opts = HostOptions {
        convention: Convention::Fixed,
        fixed: BufSizes::both(2048),
        ..HostOptions::default()
    };
    // The memory is laid out for 2 KiB (the table is the same as for 512
    // under the fixed convention); the remote is given no sizes.
    let p = pair_fixed(
        Some((Convention::Fixed, BufSizes::both(2048))),
        opts,
        64,
        None,
    )
    .unwrap();
    assert_eq!((p.host.max_payload(), p.remote.max_payload()), (2032, 496));
    let ch = p.host.wait_channel("echo", T).unwrap();
    let ep = p
        .host
        .create(EndpointOptions::new("echo").dst(ch.addr))
        .unwrap();
    ep.send(&pattern(2032, 1)).unwrap();
    assert_eq!(ep.recv(Some(T)).unwrap().data, pattern(496, 2032));
    p.host.shutdown();
    p.remote.shutdown();
}

/// A remote fixed at 2 KiB against a host left at 512: a message larger
/// than the host's buffer is refused to its sender with the size that
/// fits, the buffer is kept, and the link goes on.
#[test]
fn fixed_mismatch_refuses_what_does_not_fit() {
    let opts = HostOptions {
        convention: Convention::Fixed,
        ..HostOptions::default()
    };
    let p = pair_fixed(
        Some((Convention::Fixed, BufSizes::both(2048))),
        opts,
        64,
        Some(BufSizes::both(2048)),
    )
    .unwrap();
    assert_eq!((p.host.max_payload(), p.remote.max_payload()), (496, 2032));
    let ch = p.host.wait_channel("echo", T).unwrap();
    let hep = p
        .host
        .create(EndpointOptions::new("echo").dst(ch.addr))
        .unwrap();
    let rep = p
        .remote
        .create(EndpointOptions::new("probe").announce(false))
        .unwrap();
    for _ in 0..100 {
        assert!(matches!(
            rep.send_to(hep.addr(), &pattern(2032, 0), Some(T)),
            Err(BusError::TooLarge {
                len: 2032,
                max: 496
            })
        ));
    }
    rep.send_to(hep.addr(), &pattern(496, 1), Some(T)).unwrap();
    let m = hep.recv(Some(T)).unwrap();
    assert_eq!((m.src, m.data), (rep.addr(), pattern(496, 1)));
    // Each refusal counted once, the message that fit not.
    let s = p.remote.stats();
    assert_eq!((s.tx_too_large, s.tx_msgs >= 1), (100, true), "{s:?}");
    assert_eq!(p.host.stats().tx_too_large, 0);
    assert!(p.remote.down_reason().is_none() && p.host.down_reason().is_none());
    p.host.shutdown();
    p.remote.shutdown();
}
