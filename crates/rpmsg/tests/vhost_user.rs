//! The remote over vhost-user (`serve_drivers`), driven by a small rpmsg
//! host written on iopath-virtio's own vhost-user front end and split
//! queues, as Linux's `virtio_rpmsg_bus` drives it: 512-byte receive
//! buffers posted on vq0, messages on vq1, the name service at 53.

use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use iopath_dma::{Direct, DmaOps, Iommu};
use iopath_heap::{Buffer, Heap, HugePages, MemfdHeap};
use iopath_rpmsg::tools::session::{serve_drivers, Cleanup, RemoteEvent, ServeDrivers};
use iopath_rpmsg::tools::RemoteChannels;
use iopath_rpmsg::wire::{self, Endian, Header, NsMsg, NsOp, BUF_SIZE, HDR_LEN, NS_ADDR};
use iopath_rpmsg::Stats;
use iopath_virtio::transport::vhost_user::VhostUser;
use iopath_virtio::{driver, features, share_memory, QueueFeatures, Seg, SplitQueue, Transport};

const T: Duration = Duration::from_secs(10);
const RING: u16 = 64;
/// Transmit slots are larger than rpmsg's buffers, to send oversized ones.
const TX_SLOT: usize = 4096;
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
}

impl Driver {
    fn connect(sock: &Path, event_idx: bool) -> Driver {
        Driver::start(VhostUser::connect(sock, 7, T).unwrap(), event_idx, false)
    }

    /// As [`Driver::connect`], with `ACCESS_PLATFORM` and IOMMU ops: every
    /// ring and buffer address is an IOVA mapped through `IOTLB_MSG`s.
    fn connect_iommu(sock: &Path) -> Driver {
        Driver::start(VhostUser::connect(sock, 7, T).unwrap(), true, true)
    }

    /// Resets the device (status 0: the front end stops both queues) on
    /// the same connection and drives it afresh.
    fn restart(self, event_idx: bool) -> Driver {
        let Driver { dev, rx, tx, .. } = self;
        drop((rx, tx));
        Driver::start(dev, event_idx, false)
    }

    fn start(dev: VhostUser, event_idx: bool, iommu: bool) -> Driver {
        let mut want = features::VIRTIO_F_VERSION_1 | 1 << wire::VIRTIO_RPMSG_F_NS;
        if event_idx {
            want |= features::VIRTIO_F_EVENT_IDX;
        }
        if iommu {
            want |= features::VIRTIO_F_ACCESS_PLATFORM;
        }
        let f = driver::negotiate(&dev, want, 0).unwrap();
        assert_eq!(f, want, "the device offers what Linux's bus takes");
        let ops: Arc<dyn DmaOps> = if iommu {
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
        let rxbufs = heap.alloc(usize::from(RING) * BUF_SIZE).unwrap();
        let txbufs: Vec<Buffer> = (0..RING).map(|_| heap.alloc(TX_SLOT).unwrap()).collect();
        ops.register(&rxbufs).unwrap();
        for b in &txbufs {
            ops.register(b).unwrap();
        }
        share_memory(&dev, &*ops).unwrap();
        // Dirty, so that a device that writes nothing is caught.
        rxbufs.write_at(0, &vec![0xa5; rxbufs.len()]).unwrap();
        for i in 0..usize::from(RING) {
            rx.add(&[], &[Seg::buf(&rxbufs, i * BUF_SIZE, BUF_SIZE)], i as u64)
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
        }
    }

    /// The next message the remote sent: header and payload.
    fn recv(&mut self) -> (Header, Vec<u8>) {
        loop {
            if let Some(c) = self.rx.pop_used().unwrap() {
                let off = c.token as usize * BUF_SIZE;
                let mut buf = vec![0u8; c.len as usize];
                self.rxbufs.read_at(off, &mut buf).unwrap();
                let (hdr, payload) = wire::parse_message(&buf, LE).unwrap();
                let payload = payload.to_vec();
                self.rx
                    .add(&[], &[Seg::buf(&self.rxbufs, off, BUF_SIZE)], c.token)
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
        wire::encode_message(OUR_ADDR, dst, data, BUF_SIZE, LE, &mut msg).unwrap();
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

#[derive(Debug)]
enum Ev {
    Stats(Stats),
    Gone,
}

/// Starts the remote (echo service "echo") on a socket in `dir`.
fn remote(dir: &Path) -> (std::path::PathBuf, mpsc::Receiver<Ev>) {
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
