//! The remote over vhost-user (`serve_drivers`), driven by a small rpmsg
//! host written on iopath-virtio's own vhost-user front end and split
//! queues, as Linux's `virtio_rpmsg_bus` drives it: receive buffers
//! posted on vq0 (512 bytes, or the size the device offered and the
//! driver acked), messages on vq1, the name service at 53.

use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use iopath_dma::{Direct, DmaOps, Iommu};
use iopath_heap::{Buffer, Heap, HugePages, MemfdHeap};
use iopath_rpmsg::bufsz::VIRTIO_RPMSG_F_BUFSZ;
use iopath_rpmsg::tools::session::{serve_drivers, Cleanup, RemoteEvent, ServeDrivers};
use iopath_rpmsg::tools::RemoteChannels;
use iopath_rpmsg::wire::{self, Endian, Header, NsMsg, NsOp, BUF_SIZE, HDR_LEN, NS_ADDR};
use iopath_rpmsg::{BufSizes, Convention, Stats};
use iopath_virtio::transport::vhost_user::VhostUser;
use iopath_virtio::{driver, features, share_memory, QueueFeatures, Seg, SplitQueue, Transport};

const T: Duration = Duration::from_secs(10);
const RING: u16 = 64;
/// Transmit slots are larger than rpmsg's buffers, to send oversized ones.
const TX_SLOT: usize = 68 * 1024;
const LE: Endian = Endian::Little;
const OUR_ADDR: u32 = 1024;

/// A minimal rpmsg host on a vhost-user front end.
struct Driver {
    dev: VhostUser,
    rx: SplitQueue<dyn DmaOps>,
    tx: SplitQueue<dyn DmaOps>,
    rxbufs: Buffer,
    /// One per transmit slot: a buffer the device may read cannot be written.
    txbufs: Vec<Buffer>,
    next_tx: usize,
    /// The size of each receive buffer (the remote's tx size).
    rx_buf: usize,
    /// The largest message this driver sends (the remote's rx size).
    tx_buf: usize,
}

/// How a test's driver starts the device.
#[derive(Debug, Clone, Copy)]
struct Start {
    event_idx: bool,
    iommu: bool,
    /// Ack the buffer-size bit when offered, and size the buffers by the
    /// config.
    bufsz: bool,
}

impl Start {
    const PLAIN: Start = Start {
        event_idx: false,
        iommu: false,
        bufsz: false,
    };
}

impl Driver {
    fn connect(sock: &Path, event_idx: bool) -> Driver {
        Driver::connect_with(
            sock,
            Start {
                event_idx,
                ..Start::PLAIN
            },
        )
    }

    fn connect_with(sock: &Path, how: Start) -> Driver {
        Driver::start(VhostUser::connect(sock, 7, T).unwrap(), how)
    }

    /// As [`Driver::connect`], with `ACCESS_PLATFORM` and IOMMU ops: every
    /// ring and buffer address is an IOVA mapped through `IOTLB_MSG`s.
    fn connect_iommu(sock: &Path) -> Driver {
        Driver::connect_with(
            sock,
            Start {
                event_idx: true,
                iommu: true,
                bufsz: false,
            },
        )
    }

    /// Resets the device (status 0: the front end stops both queues) on
    /// the same connection and drives it afresh.
    fn restart(self, event_idx: bool) -> Driver {
        let Driver { dev, rx, tx, .. } = self;
        drop((rx, tx));
        Driver::start(
            dev,
            Start {
                event_idx,
                ..Start::PLAIN
            },
        )
    }

    fn start(dev: VhostUser, how: Start) -> Driver {
        let mut want = features::VIRTIO_F_VERSION_1 | 1 << wire::VIRTIO_RPMSG_F_NS;
        if how.event_idx {
            want |= features::VIRTIO_F_EVENT_IDX;
        }
        if how.iommu {
            want |= features::VIRTIO_F_ACCESS_PLATFORM;
        }
        let bufsz = 1u64 << VIRTIO_RPMSG_F_BUFSZ;
        let offered = dev.device_features().unwrap() & bufsz != 0;
        if how.bufsz {
            want |= bufsz & dev.device_features().unwrap();
        }
        let f = driver::negotiate(&dev, want, 0).unwrap();
        assert_eq!(f, want, "the device offers what Linux's bus takes");
        // Linux's virtio_rpmsg_bus: the sizes from the config when the bit
        // is negotiated, 512 otherwise.
        let sizes = if f & bufsz != 0 {
            let sizes = read_linux_config(&dev);
            assert!(offered);
            sizes
        } else {
            BufSizes::DEFAULT
        };
        let (rx_buf, tx_buf) = (sizes.to_host as usize, sizes.to_remote as usize);
        let ops: Arc<dyn DmaOps> = if how.iommu {
            Arc::new(Iommu::new())
        } else {
            Arc::new(Direct::new())
        };
        let qf = QueueFeatures::from_bits(f);
        let mut rx = SplitQueue::new(Arc::clone(&ops), 0, RING, qf).unwrap();
        let tx = SplitQueue::new(Arc::clone(&ops), 1, RING, qf).unwrap();
        dev.setup_queue(0, &rx.config()).unwrap();
        dev.setup_queue(1, &tx.config()).unwrap();
        let heap = MemfdHeap::new(HugePages::None);
        let rxbufs = heap.alloc(usize::from(RING) * rx_buf).unwrap();
        let txbufs: Vec<Buffer> = (0..RING).map(|_| heap.alloc(TX_SLOT).unwrap()).collect();
        ops.register(&rxbufs).unwrap();
        for b in &txbufs {
            ops.register(b).unwrap();
        }
        share_memory(&dev, &*ops).unwrap();
        // Dirty, so that a device that writes nothing is caught.
        rxbufs.write_at(0, &vec![0xa5; rxbufs.len()]).unwrap();
        for i in 0..usize::from(RING) {
            rx.add(&[], &[Seg::buf(&rxbufs, i * rx_buf, rx_buf)], i as u64)
                .unwrap();
        }
        driver::driver_ok(&dev).unwrap();
        if rx.should_notify() {
            dev.notify(0).unwrap();
        }
        Driver {
            dev,
            rx,
            tx,
            rxbufs,
            txbufs,
            next_tx: 0,
            rx_buf,
            tx_buf,
        }
    }

    /// The next message the remote sent: header and payload.
    fn recv(&mut self) -> (Header, Vec<u8>) {
        loop {
            if let Some(c) = self.rx.pop_used().unwrap() {
                let off = c.token as usize * self.rx_buf;
                assert!(c.len as usize <= self.rx_buf, "used length {}", c.len);
                let mut buf = vec![0u8; c.len as usize];
                self.rxbufs.read_at(off, &mut buf).unwrap();
                let (hdr, payload) = wire::parse_message(&buf, LE).unwrap();
                let payload = payload.to_vec();
                self.rx
                    .add(&[], &[Seg::buf(&self.rxbufs, off, self.rx_buf)], c.token)
                    .unwrap();
                if self.rx.should_notify() {
                    self.dev.notify(0).unwrap();
                }
                return (hdr, payload);
            }
            assert!(
                self.dev.wait_interrupt(0, Some(T)).unwrap(),
                "no message from the remote within {T:?}"
            );
        }
    }

    /// Sends `bytes` (header included) in a driver buffer of `buf_len`.
    fn send_bytes(&mut self, bytes: &[u8], buf_len: usize) {
        while self.tx.pop_used().unwrap().is_some() {}
        let slot = self.next_tx % usize::from(RING);
        self.next_tx += 1;
        let buf = &self.txbufs[slot];
        buf.write_at(0, bytes).unwrap();
        self.tx
            .add(&[Seg::buf(buf, 0, buf_len)], &[], slot as u64)
            .unwrap();
        if self.tx.should_notify() {
            self.dev.notify(1).unwrap();
        }
    }

    fn send(&mut self, dst: u32, data: &[u8]) {
        let mut msg = Vec::new();
        wire::encode_message(OUR_ADDR, dst, data, self.tx_buf, LE, &mut msg).unwrap();
        let len = msg.len();
        self.send_bytes(&msg, len);
    }

    /// Waits for the remote's announcement of `name`; its address.
    fn channel(&mut self, name: &str) -> u32 {
        let (hdr, payload) = self.recv();
        assert_eq!(hdr.dst, NS_ADDR);
        let ns = NsMsg::parse(&payload, LE).unwrap();
        assert_eq!((ns.name.as_str(), ns.op), (name, NsOp::Create));
        assert_eq!(hdr.src, ns.addr);
        ns.addr
    }

    fn echo(&mut self, ch: u32, data: &[u8]) {
        self.send(ch, data);
        let (hdr, back) = self.recv();
        assert_eq!((hdr.src, hdr.dst), (ch, OUR_ADDR));
        assert_eq!(back, data, "echo of {} bytes", data.len());
    }
}

/// Reads Linux's config as `virtio_uml` does, one field at a time
/// (`GET_CONFIG` from offset 0 to the field's end: 1, 3, 5, 9, 13 bytes,
/// each reply checked to be exactly that long by the front end), checks
/// it as `rpmsg_probe` does and returns the sizes.
fn read_linux_config(dev: &VhostUser) -> BufSizes {
    let field = |offset: u32, len: usize| {
        let mut b = vec![0u8; len];
        dev.read_config(offset, &mut b).unwrap();
        b
    };
    assert_eq!(field(0, 1), [1], "version");
    assert_eq!(field(1, 2), 13u16.to_le_bytes(), "size");
    let align = u16::from_le_bytes(field(3, 2).try_into().unwrap());
    assert!(align == 0 || align.is_power_of_two(), "align {align}");
    let u32_at = |offset| u32::from_le_bytes(field(offset, 4).try_into().unwrap());
    BufSizes {
        to_host: u32_at(5),
        to_remote: u32_at(9),
    }
}

#[derive(Debug)]
enum Ev {
    Stats(Stats),
    Gone,
}

/// Starts the remote (echo service "echo") on a socket in `dir`.
fn remote(dir: &Path) -> (std::path::PathBuf, mpsc::Receiver<Ev>) {
    remote_offering(dir, None)
}

/// As [`remote`], offering `buf_sizes`.
fn remote_offering(
    dir: &Path,
    buf_sizes: Option<(Convention, BufSizes)>,
) -> (std::path::PathBuf, mpsc::Receiver<Ev>) {
    let sock = dir.join("rpmsg.sock");
    let listener = iopath_rpmsg::vhost_user::bind(&sock).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let channels = RemoteChannels {
            echo: vec!["echo".into()],
            ..RemoteChannels::default()
        };
        let cfg = ServeDrivers {
            listener,
            ready_timeout: None,
            channels: &channels,
            once: false,
            access_platform: true,
            buf_sizes,
        };
        let tx = std::sync::Mutex::new(tx);
        let r = serve_drivers(cfg, &Cleanup::new(), move |ev| {
            let ev = match ev {
                RemoteEvent::Stats { stats, .. } => Ev::Stats(*stats),
                RemoteEvent::HostGone { .. } => Ev::Gone,
                _ => return,
            };
            let _ = tx.lock().unwrap().send(ev);
        });
        panic!("serve_drivers returned: {r:?}");
    });
    (sock, rx)
}

fn pattern(size: usize, seed: usize) -> Vec<u8> {
    (0..size).map(|i| (i * 7 + seed * 13) as u8).collect()
}

#[test]
fn socket_is_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let _l = iopath_rpmsg::vhost_user::bind(&sock).unwrap();
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // A second server on a live socket is refused; a file is not replaced.
    let e = iopath_rpmsg::vhost_user::bind(&sock).unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");
    let file = dir.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let e = iopath_rpmsg::vhost_user::bind(&file).unwrap_err();
    assert!(e.to_string().contains("not a socket"), "{e}");
}

#[test]
fn echo_bad_buffers_counted_and_next_driver() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, events) = remote(dir.path());
    for event_idx in [false, true] {
        let mut d = Driver::connect(&sock, event_idx);
        let ch = d.channel("echo");
        for size in [1, 2, 16, 255, 495, 496] {
            d.echo(ch, &pattern(size, size));
        }
        // A 600-byte driver buffer: refused, not read.
        let mut big = Vec::new();
        wire::encode_message(OUR_ADDR, ch, b"too big", BUF_SIZE, LE, &mut big).unwrap();
        big.resize(600, 0);
        d.send_bytes(&big, 600);
        // A header whose len runs past its 32-byte buffer: dropped.
        let lie = Header {
            src: OUR_ADDR,
            dst: ch,
            reserved: 0,
            len: 100,
            flags: 0,
        }
        .encode(LE);
        let mut short = lie.to_vec();
        short.extend_from_slice(&[0; 16]);
        d.send_bytes(&short, HDR_LEN + 16);
        // The remote stays up, and nothing of either came back.
        d.echo(ch, b"still here");
        drop(d);
        let stats = match events.recv_timeout(T).unwrap() {
            Ev::Stats(s) => s,
            e => panic!("expected the session's counters, got {e:?}"),
        };
        assert_eq!(stats.rx_refused, 1, "{stats:?}");
        assert_eq!(stats.rx_malformed, 1, "{stats:?}");
        assert_eq!(stats.rx_msgs, 7, "{stats:?}");
        assert!(matches!(events.recv_timeout(T).unwrap(), Ev::Gone));
    }
}

#[test]
fn echo_through_the_iotlb() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, events) = remote(dir.path());
    let mut d = Driver::connect_iommu(&sock);
    let ch = d.channel("echo");
    for size in [1, 100, 496] {
        d.echo(ch, &pattern(size, size));
    }
    drop(d);
    match events.recv_timeout(T).unwrap() {
        Ev::Stats(s) => assert_eq!(
            (s.rx_msgs, s.rx_refused, s.rx_malformed),
            (3, 0, 0),
            "{s:?}"
        ),
        e => panic!("expected the session's counters, got {e:?}"),
    }
}

#[test]
fn reset_mid_stream_then_the_next_driver_on_the_same_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, events) = remote(dir.path());
    let mut d = Driver::connect(&sock, true);
    let ch = d.channel("echo");
    d.echo(ch, &pattern(100, 1));
    // A message in flight when the driver resets the device.
    d.send(ch, &pattern(200, 2));
    let mut d = d.restart(true);
    match events.recv_timeout(T).unwrap() {
        Ev::Stats(s) => assert_eq!(s.ns_create + s.rx_refused + s.rx_malformed, 0, "{s:?}"),
        e => panic!("expected the session's counters, got {e:?}"),
    }
    assert!(matches!(events.recv_timeout(T).unwrap(), Ev::Gone));
    // The remote announces again to the driver that started afresh.
    let ch = d.channel("echo");
    for size in [1, 496] {
        d.echo(ch, &pattern(size, 3));
    }
}

/// Sizes offered under Linux's convention reach a driver that acks the
/// bit: it reads them field by field as `virtio_uml` does, posts buffers
/// of the remote's tx size, and messages cross at every size each way
/// allows; one byte past the remote's rx size is refused, not read.
#[test]
fn offered_sizes_reach_a_driver_that_acks_them() {
    for sizes in [
        BufSizes::both(4096),
        BufSizes {
            to_host: 2048,
            to_remote: 8192,
        },
        BufSizes::both(64 * 1024),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (sock, events) = remote_offering(dir.path(), Some((Convention::Linux, sizes)));
        let mut d = Driver::connect_with(
            &sock,
            Start {
                event_idx: true,
                iommu: false,
                bufsz: true,
            },
        );
        let (to_host, to_remote) = (sizes.to_host as usize, sizes.to_remote as usize);
        assert_eq!((d.rx_buf, d.tx_buf), (to_host, to_remote));
        let ch = d.channel("echo");
        let both = to_host.min(to_remote) - HDR_LEN;
        for size in [1, 496, 497, both - 1, both] {
            d.echo(ch, &pattern(size, size));
        }
        // One byte past the remote's rx size: refused.
        let mut big = Vec::new();
        let over = pattern(to_remote - HDR_LEN + 1, 9);
        wire::encode_message(OUR_ADDR, ch, &over, to_remote + 1, LE, &mut big).unwrap();
        let len = big.len();
        d.send_bytes(&big, len);
        d.echo(ch, b"still here");
        drop(d);
        let stats = match events.recv_timeout(T).unwrap() {
            Ev::Stats(s) => s,
            e => panic!("expected the session's counters, got {e:?}"),
        };
        assert_eq!(
            (stats.rx_msgs, stats.rx_refused, stats.rx_malformed),
            (6, 1, 0),
            "{sizes:?}: {stats:?}"
        );
    }
}

/// A driver that does not ack the bit (Linux without the series) gets
/// 512-byte buffers whatever the config says: 496 bytes cross, 497 are
/// refused.
#[test]
fn offer_not_acked_is_512() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, events) =
        remote_offering(dir.path(), Some((Convention::Linux, BufSizes::both(4096))));
    let mut d = Driver::connect(&sock, true);
    assert_eq!((d.rx_buf, d.tx_buf), (BUF_SIZE, BUF_SIZE));
    let ch = d.channel("echo");
    d.echo(ch, &pattern(496, 1));
    let mut big = Vec::new();
    wire::encode_message(OUR_ADDR, ch, &pattern(497, 2), 4096, LE, &mut big).unwrap();
    let len = big.len();
    d.send_bytes(&big, len);
    d.echo(ch, b"still here");
    drop(d);
    match events.recv_timeout(T).unwrap() {
        Ev::Stats(s) => assert_eq!((s.rx_msgs, s.rx_refused), (2, 1), "{s:?}"),
        e => panic!("expected the session's counters, got {e:?}"),
    }
}

/// Without an offer the device is the one of before: no size bit, a
/// config space of zeros.
#[test]
fn no_offer_no_bit_no_config() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, _events) = remote(dir.path());
    let dev = VhostUser::connect(&sock, 7, T).unwrap();
    let f = dev.device_features().unwrap();
    assert_eq!(
        f & (1 << VIRTIO_RPMSG_F_BUFSZ | 1 << iopath_rpmsg::bufsz::NUTTX_RPMSG_F_BUFSZ),
        0,
        "{f:#x}"
    );
    let mut b = [0xa5u8; 13];
    dev.read_config(0, &mut b).unwrap();
    assert_eq!(b, [0; 13]);
}

/// A front end that sends half a message header and waits is dropped
/// after the server's message timeout, and the next front end is served
/// (the server serves one at a time); one that stays connected and idle
/// between messages is not.
#[test]
fn half_a_header_does_not_keep_the_next_front_end_out() {
    use std::io::Write;
    use std::time::Instant;
    let dir = tempfile::tempdir().unwrap();
    let (sock, _events) = remote(dir.path());
    // Idle for longer than the timeout, then a real driver on it: served.
    let idle = Driver::connect(&sock, true);
    std::thread::sleep(iopath_virtio::device::MESSAGE_TIMEOUT + Duration::from_secs(1));
    let mut idle = idle;
    let ch = idle.channel("echo");
    idle.echo(ch, &pattern(50, 5));
    drop(idle);
    let mut stalled = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    // GET_FEATURES (1), flags 1: 6 of the header's 12 bytes.
    stalled.write_all(&[1, 0, 0, 0, 1, 0]).unwrap();
    let t0 = Instant::now();
    let mut d = Driver::connect(&sock, true);
    let waited = t0.elapsed();
    assert!(
        waited >= iopath_virtio::device::MESSAGE_TIMEOUT - Duration::from_millis(500)
            && waited < iopath_virtio::device::MESSAGE_TIMEOUT + Duration::from_secs(3),
        "served after {waited:?}"
    );
    let ch = d.channel("echo");
    d.echo(ch, &pattern(100, 4));
    // The stalled connection was closed by the server (reset: its half
    // header was never read).
    stalled
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut b = [0u8; 1];
    match std::io::Read::read(&mut stalled, &mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        r => panic!("the stalled connection is still open: {r:?}"),
    }
}
