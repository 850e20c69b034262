//! The bus's receive path as a hostile peer drives it: buffers with any
//! rpmsg header (lengths that lie, any source and destination, either byte
//! order's worth of garbage) and name-service records (CREATE, DESTROY,
//! junk flags, unterminated names), handed to a real `Bus` by a link that
//! replays them. Every buffer must come back to the peer, every one be
//! counted once, and the endpoints get exactly the messages an independent
//! reading of the same bytes says they should (source, destination, bytes).
//! The buffers are as large as a buffer-size config space (either
//! convention, any bytes) negotiates, or as the fixed convention's sizes
//! (any values) say: 512 when they are refused or absent.
#![no_main]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use iopath_heap::{Heap, HugePages, MemfdHeap};
use iopath_rpmsg::bufsz::{host_negotiate, BufSizes, Convention};
use iopath_rpmsg::notify::{Notifier, NotifyError, Wake};
use iopath_rpmsg::wire::{HDR_LEN, NAME_SIZE, NS_ADDR};
use iopath_rpmsg::{
    Bus, EndpointOptions, Event, Held, Link, LinkError, LinkMemory, Role, SharedMem, Slot,
    HOST_FEATURES,
};
use libfuzzer_sys::fuzz_target;

/// Buffers in the replayed ring, at most.
const SLOTS: usize = 64;
/// Bytes of buffers at most (64 of 64 KiB would be slow to map per run).
const POOL: usize = 1 << 20;

/// What an endpoint got: source, destination, payload.
type Delivered = (u32, u32, Vec<u8>);

#[derive(Debug, Arbitrary)]
enum Body {
    /// Raw payload bytes.
    Raw(Vec<u8>),
    /// A name-service record (well-formed up to what the fields say).
    Ns {
        name: Vec<u8>,
        addr: u32,
        flags: u32,
        terminate: bool,
    },
}

#[derive(Debug, Arbitrary)]
struct Buf {
    /// Destination: an endpoint (0..4 → 1024..1027), the name service, or
    /// any address.
    dst: DstPick,
    src: u32,
    reserved: u32,
    /// The header's length field: the payload's, or a lie.
    len_lie: Option<u16>,
    flags: u16,
    body: Body,
    /// The used length the ring reports: the message's, or a lie.
    used_lie: Option<u16>,
}

#[derive(Debug, Arbitrary)]
enum DstPick {
    Ept(u8),
    Ns,
    Any(u32),
}

#[derive(Debug, Arbitrary)]
struct Input {
    ns: bool,
    /// The device's offered feature bits 1 and 2, the convention the host
    /// reads (Linux's, NuttX's or fixed, by the value modulo 3), the
    /// config space, and the sizes the fixed convention uses (host →
    /// remote, remote → host).
    bufsz_bits: u8,
    mode: u8,
    config: Vec<u8>,
    fixed: (u32, u32),
    bufs: Vec<Buf>,
}

/// A link that replays the fuzzer's buffers and counts what comes back.
#[derive(Debug)]
struct Replay {
    shm: Arc<dyn LinkMemory>,
    /// Filled once the endpoints exist.
    pending: Arc<Mutex<VecDeque<Held>>>,
    released: Arc<AtomicUsize>,
    features: u32,
    sizes: BufSizes,
}

impl Link for Replay {
    fn role(&self) -> Role {
        Role::Host
    }
    fn memory(&self) -> &Arc<dyn LinkMemory> {
        &self.shm
    }
    fn hold_rx(&mut self) -> Result<Option<Result<Held, String>>, LinkError> {
        Ok(self.pending.lock().unwrap().pop_front().map(Ok))
    }
    fn release_rx(&mut self, _held: Held) -> Result<(), LinkError> {
        self.released.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn get_tx(&mut self) -> Result<Option<Slot>, LinkError> {
        Ok(None)
    }
    fn put_tx(&mut self, _slot: Slot, _len: usize) -> Result<(), LinkError> {
        Err(LinkError::Broken("replay link does not send".into()))
    }
    fn drop_tx(&mut self, _slot: Slot) {}
    fn buf_size(&self) -> usize {
        self.sizes.to_remote as usize
    }
    fn rx_buf_size(&self) -> usize {
        self.sizes.to_host as usize
    }
    fn take_kick(&mut self) -> bool {
        false
    }
    fn arm(&mut self) -> Result<bool, LinkError> {
        Ok(!self.pending.lock().unwrap().is_empty())
    }
    fn check(&mut self) -> Result<(), LinkError> {
        Ok(())
    }
    fn features(&self) -> u32 {
        self.features
    }
}

#[derive(Debug)]
struct Quiet;

impl Notifier for Quiet {
    fn kick(&self) -> Result<(), NotifyError> {
        Ok(())
    }
    fn wait(&self, timeout: Duration) -> Result<Wake, NotifyError> {
        std::thread::sleep(timeout.min(Duration::from_micros(200)));
        Ok(Wake::Timeout)
    }
    fn kind(&self) -> &'static str {
        "replay"
    }
}

fuzz_target!(|i: Input| {
    let dfeatures = 1 | (u32::from(i.bufsz_bits) & 0b110);
    let convention =
        [Convention::Linux, Convention::Nuttx, Convention::Fixed][usize::from(i.mode % 3)];
    let fixed = BufSizes {
        to_remote: i.fixed.0,
        to_host: i.fixed.1,
    };
    let sizes = match host_negotiate(dfeatures, HOST_FEATURES, convention, &i.config, fixed) {
        Ok((_, s)) => {
            assert!(s.check().is_ok(), "{s:?}");
            s
        }
        Err(_) => BufSizes::DEFAULT,
    };
    // The host's rx buffers: the remote → host size.
    let buf_size = sizes.to_host as usize;
    let slots = SLOTS.min(POOL / buf_size).max(1);
    let bufs = &i.bufs[..i.bufs.len().min(slots)];
    let mem = MemfdHeap::new(HugePages::None)
        .alloc((slots * buf_size).next_multiple_of(4096))
        .expect("memfd");
    let shm = SharedMem::from_buffer(mem).expect("shared memory");
    let mut held = VecDeque::new();
    // The oracle's copy of the shared memory, and what it expects delivered.
    let mut mirror = vec![0u8; (slots * buf_size).next_multiple_of(4096)];
    let mut expect: Vec<Delivered> = Vec::new();
    let mut heads = Vec::new();
    for (slot, b) in bufs.iter().enumerate() {
        let payload = match &b.body {
            Body::Raw(v) => v.clone(),
            Body::Ns {
                name,
                addr,
                flags,
                terminate,
            } => {
                let mut r = vec![0u8; NAME_SIZE + 8];
                let n = name.len().min(NAME_SIZE);
                r[..n].copy_from_slice(&name[..n]);
                if *terminate && n == NAME_SIZE {
                    r[NAME_SIZE - 1] = 0;
                }
                r[NAME_SIZE..NAME_SIZE + 4].copy_from_slice(&addr.to_le_bytes());
                r[NAME_SIZE + 4..].copy_from_slice(&flags.to_le_bytes());
                r
            }
        };
        let payload = &payload[..payload.len().min(buf_size - HDR_LEN)];
        let dst = match b.dst {
            DstPick::Ept(e) => 1024 + u32::from(e % 4),
            DstPick::Ns => NS_ADDR,
            DstPick::Any(a) => a,
        };
        let len = b.len_lie.unwrap_or(payload.len() as u16);
        let mut m = Vec::with_capacity(HDR_LEN + payload.len());
        m.extend_from_slice(&b.src.to_le_bytes());
        m.extend_from_slice(&dst.to_le_bytes());
        m.extend_from_slice(&b.reserved.to_le_bytes());
        m.extend_from_slice(&len.to_le_bytes());
        m.extend_from_slice(&b.flags.to_le_bytes());
        m.extend_from_slice(payload);
        let addr = (slot * buf_size) as u64;
        shm.write(addr, &m).expect("inside the shared memory");
        mirror[addr as usize..addr as usize + m.len()].copy_from_slice(&m);
        let used = b.used_lie.map_or(m.len(), usize::from);
        held.push_back(Held::new(slot as u64, addr, used));
        heads.push((addr as usize, used, b.src, dst, len));
    }
    // Once every buffer is written (a payload may run into the next one): a
    // header inside the used length, a payload inside both the used length
    // and the shared memory, for one of the endpoints (the name service
    // takes address 53 when negotiated): delivered, those bytes.
    for (addr, used, src, dst, len) in heads {
        let start = addr + HDR_LEN;
        let end = start + usize::from(len);
        let for_ns = dst == NS_ADDR && i.ns;
        if used >= HDR_LEN
            && usize::from(len) <= used - HDR_LEN
            && (1024..1028).contains(&dst)
            && !for_ns
            && end <= mirror.len()
        {
            expect.push((src, dst, mirror[start..end].to_vec()));
        }
    }
    let released = Arc::new(AtomicUsize::new(0));
    let pending: Arc<Mutex<VecDeque<Held>>> = Arc::default();
    let link = Replay {
        shm: Arc::new(shm),
        pending: Arc::clone(&pending),
        released: Arc::clone(&released),
        features: u32::from(i.ns),
        sizes,
    };
    let bus = Bus::start(Box::new(link), Box::new(Quiet));
    let got: Arc<Mutex<Vec<Delivered>>> = Arc::default();
    let mut eps = Vec::new();
    for a in 1024..1028u32 {
        let got = Arc::clone(&got);
        let ep = bus
            .create_with_callback(
                EndpointOptions::new("fuzz").src(a).announce(false),
                move |ep, ev| {
                    if let Event::Message(m) = ev {
                        assert_eq!(ep.addr(), m.dst, "delivered to the wrong endpoint");
                        got.lock().unwrap().push((m.src, m.dst, m.data));
                    }
                },
            )
            .expect("endpoint");
        eps.push(ep);
    }
    // The peer's buffers arrive once every endpoint is there.
    *pending.lock().unwrap() = held;
    let start = Instant::now();
    while released.load(Ordering::SeqCst) < bufs.len() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "buffers not given back: {} of {}",
            released.load(Ordering::SeqCst),
            bufs.len()
        );
        std::thread::sleep(Duration::from_micros(100));
    }
    // Every buffer back exactly once, and counted once.
    assert_eq!(released.load(Ordering::SeqCst), bufs.len());
    let s = bus.stats();
    let ns_good = s.ns_create + s.ns_destroy;
    assert_eq!(
        s.rx_msgs + s.rx_malformed + s.rx_unknown_dst + ns_good,
        bufs.len() as u64,
        "{s:?}"
    );
    // Delivery happens outside the bus lock, after the buffer went back:
    // wait for the callbacks to catch up.
    while got.lock().unwrap().len() < expect.len() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_micros(100));
    }
    let got = got.lock().unwrap();
    assert_eq!(got.len(), expect.len(), "messages delivered");
    for (n, (g, e)) in got.iter().zip(&expect).enumerate() {
        assert_eq!((g.0, g.1, g.2.len()), (e.0, e.1, e.2.len()), "message {n}");
        assert!(g.2 == e.2, "message {n}: payload differs");
    }
    // What the peer announced is a well-formed name.
    for c in bus.channels() {
        assert!(!c.name.is_empty() && c.name.len() < NAME_SIZE, "{c:?}");
        assert!(!c.name.as_bytes().contains(&0), "{c:?}");
    }
    drop(eps);
    bus.shutdown();
});
