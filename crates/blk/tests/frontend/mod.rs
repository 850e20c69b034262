//! Test-only vhost-user-blk front end: a real `iopath blk serve` process,
//! the `vhost` crate's `Frontend` for the protocol, and a minimal split
//! ring written straight into a memfd shared with the back end.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserInflight, VhostUserProtocolFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::mmap::MmapRegion;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};
use vmm_sys_util::eventfd::EventFd;

mod server;
#[allow(unused_imports)]
pub use server::{iopath_bin, Server};

// Spec facts from where the crates define them (virtio-bindings beneath);
// each test file uses some of them.
#[allow(unused_imports)]
pub use iopath_blk::config::{
    VIRTIO_BLK_F_FLUSH as BLK_F_FLUSH, VIRTIO_BLK_F_MQ as BLK_F_MQ, VIRTIO_BLK_F_RO as BLK_F_RO,
};
#[allow(unused_imports)]
pub use iopath_blk::wire::{
    OutHeader, RangeSegment, HEADER_LEN, SECTOR_SIZE as SECTOR, VIRTIO_BLK_S_IOERR as S_IOERR,
    VIRTIO_BLK_S_OK as S_OK, VIRTIO_BLK_S_UNSUPP as S_UNSUPP, VIRTIO_BLK_T_DISCARD as T_DISCARD,
    VIRTIO_BLK_T_FLUSH as T_FLUSH, VIRTIO_BLK_T_GET_ID as T_GET_ID, VIRTIO_BLK_T_IN as T_IN,
    VIRTIO_BLK_T_OUT as T_OUT, VIRTIO_BLK_T_WRITE_ZEROES as T_WRITE_ZEROES,
};
#[allow(unused_imports)]
pub use iopath_virtio::features::{
    VHOST_USER_F_PROTOCOL_FEATURES as PROTOCOL_FEATURES,
    VIRTIO_F_ACCESS_PLATFORM as ACCESS_PLATFORM, VIRTIO_F_EVENT_IDX as EVENT_IDX,
    VIRTIO_F_INDIRECT_DESC as INDIRECT_DESC, VIRTIO_F_VERSION_1 as VERSION_1,
};
/// Descriptor flags (virtio 1.x, 2.7.5), from virtio-bindings.
pub const F_NEXT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_NEXT as u16;
pub const F_WRITE: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_WRITE as u16;
pub const F_INDIRECT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_INDIRECT as u16;

/// Shared memory size and the (made-up) front-end address it lives at.
pub const MEM_SIZE: u64 = 8 << 20;
pub const UADDR: u64 = 0x7f00_0000_0000;
/// Where the IOMMU tests put their IOVA space.
pub const IOVA: u64 = 0x1_0000_0000;
pub const QUEUE_SIZE: u16 = 64;
/// Guest-physical layout: rings of queue q at q * RING_STRIDE, data above.
pub const RING_STRIDE: u64 = 0x4000;
pub const DATA_BASE: u64 = 0x10_0000;

/// One split virtqueue laid out in the shared memory.
pub struct TestQueue {
    pub index: usize,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    pub avail_idx: u16,
    pub used_seen: u16,
    pub kick: EventFd,
    pub call: EventFd,
}

/// The ring and data addresses the device is told about: guest physical,
/// or IOVA when the IOMMU is on.
#[derive(Clone, Copy)]
pub struct AddrMode {
    pub device_base: u64,
}

/// A connected front end with shared memory and queues.
pub struct Client {
    pub fe: Frontend,
    pub mem: GuestMemoryMmap,
    pub memfd: std::fs::File,
    pub queues: Vec<TestQueue>,
    pub features: u64,
    /// Added to a guest-physical address to get the address the device
    /// sees (0, or IOVA - 0 with the IOMMU).
    pub dev_offset: u64,
    next_data: u64,
}

pub fn memfd(size: u64) -> std::fs::File {
    let m = memfd::MemfdOptions::default()
        .close_on_exec(true)
        .create("iopath-test-guest")
        .unwrap();
    m.as_file().set_len(size).unwrap();
    m.into_file()
}

pub fn connect(path: &Path) -> Frontend {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Frontend::connect(path, 8) {
            Ok(f) => return f,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("connect {}: {e}", path.display()),
        }
    }
}

impl Client {
    /// Negotiates `want` (intersected with what is offered), sets up the
    /// memory table and `nq` queues.
    pub fn new(sock: &Path, want: u64, nq: usize) -> Client {
        let mut c = Self::negotiate(sock, want);
        c.setup_queues(nq);
        c
    }

    /// Negotiation and memory table only.
    pub fn negotiate(sock: &Path, want: u64) -> Client {
        Self::negotiate_with(sock, want, VhostUserProtocolFeatures::empty())
    }

    /// Connects, negotiates `want` (with what is offered) and the protocol
    /// features (`extra` too); returns the front end and the features.
    fn handshake(sock: &Path, want: u64, extra: VhostUserProtocolFeatures) -> (Frontend, u64) {
        let mut fe = connect(sock);
        fe.set_owner().unwrap();
        let offered = fe.get_features().unwrap();
        let features = offered & (want | PROTOCOL_FEATURES);
        fe.set_features(features).unwrap();
        let pf = fe.get_protocol_features().unwrap();
        let pwant = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
            | extra;
        fe.set_protocol_features(pf & pwant).unwrap();
        (fe, features)
    }

    fn share_memory(fe: &mut Frontend, memfd: &std::fs::File) {
        fe.set_mem_table(&[VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEM_SIZE,
            userspace_addr: UADDR,
            mmap_offset: 0,
            mmap_handle: memfd.as_raw_fd(),
        }])
        .unwrap();
    }

    /// Negotiation asking for `extra` protocol features too.
    pub fn negotiate_with(sock: &Path, want: u64, extra: VhostUserProtocolFeatures) -> Client {
        let (mut fe, features) = Self::handshake(sock, want, extra);
        let memfd = memfd(MEM_SIZE);
        let region = MmapRegion::from_file(
            FileOffset::new(memfd.try_clone().unwrap(), 0),
            MEM_SIZE as usize,
        )
        .unwrap();
        let mem =
            GuestMemoryMmap::from_regions(vec![
                GuestRegionMmap::new(region, GuestAddress(0)).unwrap()
            ])
            .unwrap();
        Self::share_memory(&mut fe, &memfd);
        let dev_offset = if features & ACCESS_PLATFORM != 0 {
            IOVA
        } else {
            0
        };
        Client {
            fe,
            mem,
            memfd,
            queues: Vec::new(),
            features,
            dev_offset,
            next_data: DATA_BASE,
        }
    }

    /// Address of guest-physical `gpa` as the device must be told it.
    pub fn dev(&self, gpa: u64) -> u64 {
        gpa + self.dev_offset
    }

    /// Address in front-end user space of `gpa` (what ring addresses are
    /// given as without an IOMMU).
    pub fn ring_addr(&self, gpa: u64) -> u64 {
        if self.features & ACCESS_PLATFORM != 0 {
            IOVA + gpa
        } else {
            UADDR + gpa
        }
    }

    pub fn status(&self, gpa: u64) -> u8 {
        self.mem.read_obj(GuestAddress(gpa)).unwrap()
    }

    pub fn fill(&self, gpa: u64, len: usize, byte: u8) {
        self.mem
            .write_slice(&vec![byte; len], GuestAddress(gpa))
            .unwrap();
    }

    pub fn bytes(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(gpa)).unwrap();
        v
    }

    /// Connects again, as QEMU does to a back end restarted on the same
    /// socket: the same features asked for, the same memory, `inflight`
    /// (a record from `GET_INFLIGHT_FD`) given back with `SET_INFLIGHT_FD`,
    /// and every queue started again at the used index its ring holds,
    /// with new kick eventfds and the same call eventfds.
    pub fn reconnect(
        &mut self,
        sock: &Path,
        extra: VhostUserProtocolFeatures,
        inflight: Option<(&VhostUserInflight, &std::fs::File)>,
    ) {
        let (mut fe, features) = Self::handshake(sock, self.features, extra);
        assert_eq!(features, self.features, "features after the reconnect");
        if let Some((msg, file)) = inflight {
            fe.set_inflight_fd(msg, file.as_raw_fd()).unwrap();
        }
        Self::share_memory(&mut fe, &self.memfd);
        self.fe = fe;
        for q in 0..self.queues.len() {
            let used: u16 = self
                .mem
                .read_obj(GuestAddress(self.queues[q].used + 2))
                .unwrap();
            self.queues[q].kick = EventFd::new(0).unwrap();
            self.start_queue(q, used);
        }
    }

    /// Tells the back end about queue `q`'s rings and eventfds and enables
    /// it at index `base`.
    fn start_queue(&mut self, q: usize, base: u16) {
        let tq = &self.queues[q];
        self.fe.set_vring_num(q, QUEUE_SIZE).unwrap();
        self.fe
            .set_vring_addr(
                q,
                &VringConfigData {
                    queue_max_size: QUEUE_SIZE,
                    queue_size: QUEUE_SIZE,
                    flags: 0,
                    desc_table_addr: self.ring_addr(tq.desc),
                    used_ring_addr: self.ring_addr(tq.used),
                    avail_ring_addr: self.ring_addr(tq.avail),
                    log_addr: None,
                },
            )
            .unwrap();
        self.fe.set_vring_base(q, base).unwrap();
        self.fe.set_vring_call(q, &tq.call).unwrap();
        self.fe.set_vring_kick(q, &tq.kick).unwrap();
        self.fe.set_vring_enable(q, true).unwrap();
    }

    pub fn setup_queues(&mut self, nq: usize) {
        for q in 0..nq {
            let base = q as u64 * RING_STRIDE;
            let (desc, avail, used) = (base, base + 0x1000, base + 0x2000);
            self.queues.push(TestQueue {
                index: q,
                desc,
                avail,
                used,
                avail_idx: 0,
                used_seen: 0,
                kick: EventFd::new(0).unwrap(),
                call: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            });
            self.start_queue(q, 0);
        }
    }

    pub fn config(&mut self) -> Vec<u8> {
        let (_, buf) = self
            .fe
            .get_config(0, 60, VhostUserConfigFlags::WRITABLE, &[0u8; 60])
            .unwrap();
        buf
    }

    /// Allocates `len` bytes of data area (page-aligned unless `skew`).
    pub fn alloc(&mut self, len: u64, skew: u64) -> u64 {
        let at = self.next_data + skew;
        self.next_data = (at + len + 4095) & !4095;
        assert!(self.next_data <= MEM_SIZE, "test data area exhausted");
        at
    }

    pub fn reset_alloc(&mut self) {
        self.next_data = DATA_BASE;
    }

    /// Writes descriptor `i` of queue `q` (device-visible address `addr`).
    pub fn set_desc(&self, q: usize, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = GuestAddress(self.queues[q].desc + u64::from(i) * 16);
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.mem.write_slice(&d, at).unwrap();
    }

    /// Makes chain `head` available on queue `q` and kicks.
    pub fn submit(&mut self, q: usize, heads: &[u16]) {
        let tq = &mut self.queues[q];
        for &h in heads {
            let slot = tq.avail + 4 + u64::from(tq.avail_idx % QUEUE_SIZE) * 2;
            self.mem.write_obj(h.to_le(), GuestAddress(slot)).unwrap();
            tq.avail_idx = tq.avail_idx.wrapping_add(1);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.mem
            .write_obj(tq.avail_idx.to_le(), GuestAddress(tq.avail + 2))
            .unwrap();
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        tq.kick.write(1).unwrap();
    }

    /// Waits for `n` used entries on queue `q`; returns (id, len) pairs.
    pub fn wait_used(&mut self, q: usize, n: usize) -> Vec<(u32, u32)> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut out = Vec::new();
        while out.len() < n {
            let tq = &self.queues[q];
            let idx: u16 = self.mem.read_obj(GuestAddress(tq.used + 2)).unwrap();
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            let mut seen = tq.used_seen;
            while seen != idx && out.len() < n {
                let e = tq.used + 4 + u64::from(seen % QUEUE_SIZE) * 8;
                let id: u32 = self.mem.read_obj(GuestAddress(e)).unwrap();
                let len: u32 = self.mem.read_obj(GuestAddress(e + 4)).unwrap();
                out.push((id, len));
                seen = seen.wrapping_add(1);
            }
            self.queues[q].used_seen = seen;
            if out.len() < n {
                assert!(
                    Instant::now() < deadline,
                    "timed out waiting for used entries"
                );
                let fd = self.queues[q].call.as_raw_fd();
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the duration of the call.
                unsafe { libc::poll(&mut p, 1, 20) };
                let _ = self.queues[q].call.read();
            }
        }
        out
    }

    /// Runs a chain given with device addresses; `links` overrides the
    /// `next` field of chosen descriptors (index, next, keep F_NEXT).
    /// Returns the used length.
    pub fn run_chain_dev(
        &mut self,
        q: usize,
        descs: &[(u64, u32, u16)],
        links: &[(usize, u16)],
    ) -> u32 {
        for (i, &(addr, len, flags)) in descs.iter().enumerate() {
            let mut next = (i + 1) as u16;
            let mut f = flags | if i + 1 < descs.len() { F_NEXT } else { 0 };
            if let Some(&(_, to)) = links.iter().find(|l| l.0 == i) {
                next = to;
                f |= F_NEXT;
            }
            self.set_desc(q, i as u16, addr, len, f, next);
        }
        self.submit(q, &[0]);
        let used = self.wait_used(q, 1);
        assert_eq!(used[0].0, 0, "used id");
        used[0].1
    }

    pub fn header(&mut self, kind: u32, sector: u64) -> u64 {
        let h = self.alloc(HEADER_LEN as u64, 0);
        self.mem
            .write_obj(OutHeader::new(kind, sector), GuestAddress(h))
            .unwrap();
        h
    }

    pub fn status_slot(&mut self) -> u64 {
        let s = self.alloc(1, 0);
        self.mem.write_obj(0xffu8, GuestAddress(s)).unwrap();
        s
    }

    /// Runs one chain of `(gpa, len, flags)` on queue `q` (descriptors
    /// 0.. in order) and returns the used length.
    pub fn run_chain(&mut self, q: usize, descs: &[(u64, u32, u16)]) -> u32 {
        for (i, &(gpa, len, flags)) in descs.iter().enumerate() {
            let next = if i + 1 < descs.len() { F_NEXT } else { 0 };
            self.set_desc(
                q,
                i as u16,
                self.dev(gpa),
                len,
                flags | next,
                (i + 1) as u16,
            );
        }
        self.submit(q, &[0]);
        let used = self.wait_used(q, 1);
        assert_eq!(used[0].0, 0, "used id");
        used[0].1
    }

    /// A request: header, optional data (written by the driver for OUT,
    /// `in_len` bytes for IN-like), status. Returns (status, data read).
    pub fn request(
        &mut self,
        q: usize,
        kind: u32,
        sector: u64,
        out: Option<&[u8]>,
        in_len: u32,
        skew: u64,
    ) -> (u8, Vec<u8>) {
        self.reset_alloc();
        let h = self.header(kind, sector);
        let mut descs = vec![(h, 16u32, 0u16)];
        let mut data_at = 0;
        if let Some(out) = out {
            data_at = self.alloc(out.len() as u64, skew);
            self.mem.write_slice(out, GuestAddress(data_at)).unwrap();
            descs.push((data_at, out.len() as u32, 0));
        } else if in_len > 0 {
            data_at = self.alloc(u64::from(in_len), skew);
            descs.push((data_at, in_len, F_WRITE));
        }
        let st = self.status_slot();
        descs.push((st, 1, F_WRITE));
        let used = self.run_chain(q, &descs);
        let status: u8 = self.mem.read_obj(GuestAddress(st)).unwrap();
        let mut data = vec![0u8; in_len as usize];
        if out.is_none() && in_len > 0 {
            self.mem
                .read_slice(&mut data, GuestAddress(data_at))
                .unwrap();
            if status == S_OK {
                assert_eq!(used, in_len + 1, "used length of a read");
            }
        }
        (status, data)
    }

    pub fn write(&mut self, q: usize, sector: u64, data: &[u8]) -> u8 {
        self.request(q, T_OUT, sector, Some(data), 0, 0).0
    }

    pub fn read(&mut self, q: usize, sector: u64, len: u32) -> (u8, Vec<u8>) {
        self.request(q, T_IN, sector, None, len, 0)
    }

    pub fn flush(&mut self, q: usize) -> u8 {
        self.request(q, T_FLUSH, 0, None, 0, 0).0
    }
}

/// Deterministic test data: every 8-byte word holds its byte offset on the
/// device xor a seed.
pub fn pattern(offset: u64, len: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut at = offset;
    while v.len() < len {
        v.extend_from_slice(&((at & !7) ^ seed).to_le_bytes());
        at += 8;
    }
    v.truncate(len);
    v
}

/// Sends raw bytes on a fresh connection and reports whether the server
/// closed it (read returns EOF) within a few seconds.
pub fn closed_after(sock: &Path, bytes: &[u8]) -> bool {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(bytes).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// A vhost-user message: header {request, flags (version 1 | extra), size}.
pub fn message(request: u32, flags: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&request.to_le_bytes());
    m.extend_from_slice(&(1 | flags).to_le_bytes());
    m.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    m.extend_from_slice(payload);
    m
}

/// Sends an IOTLB_MSG on the front end's socket and returns the ack value.
pub fn send_iotlb(fe: &Frontend, msg: &iopath_virtio::device::IotlbMsg) -> u64 {
    // SAFETY: borrow the front end's socket without taking ownership; the
    // ManuallyDrop keeps it from being closed here.
    let sock = std::mem::ManuallyDrop::new(unsafe { UnixStream::from_raw_fd(fe.as_raw_fd()) });
    let mut s: &UnixStream = &sock;
    s.write_all(&message(22, 0x8, &msg.to_wire())).unwrap();
    let mut reply = [0u8; 20];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(u32::from_le_bytes(reply[0..4].try_into().unwrap()), 22);
    u64::from_le_bytes(reply[12..20].try_into().unwrap())
}

pub fn arc<T>(t: T) -> Arc<T> {
    Arc::new(t)
}

/// A normal front end still gets correct data from the server.
pub fn still_serves(srv: &mut Server) {
    assert!(srv.alive(), "server died");
    let mut c = Client::new(&srv.socket, VERSION_1 | BLK_F_FLUSH, 1);
    let data = pattern(8 * SECTOR, 4096, 77);
    assert_eq!(c.write(0, 8, &data), S_OK);
    assert_eq!(c.flush(0), S_OK);
    let (st, back) = c.read(0, 8, 4096);
    assert_eq!(st, S_OK);
    assert!(back == data);
    assert!(srv.image_bytes(8 * SECTOR, 4096) == data);
}
