//! The hostile front end: sends the prelude and each fuzzed message over
//! the socket, with memfds, eventfds and other fds it makes itself.

use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Once;

use iopath_virtio::features;
use iopath_virtio::vhost_wire::{Header, RawIotlb, NEED_REPLY, VERSION};

use crate::input::{Fd, Input, Msg, Prelude, Region};

const PAGE: u64 = 4096;
/// Front-end user addresses of region pages start here.
const UADDR_BASE: u64 = 0x7f00_0000_0000;

pub struct FrontEnd {
    pub sock: UnixStream,
    pub need_reply: bool,
    /// Memfds shared so far (to poke), and kick eventfds per queue.
    pub files: Vec<std::fs::File>,
    pub kicks: Vec<Option<OwnedFd>>,
}

/// Plays `input` as the front end of one connection, served by `serve` on
/// a thread of its own, then closes the socket. The server must end the
/// connection by itself, without panicking (a malformed stream is an error
/// value, not a crash); every reply is drained so that it never blocks.
pub fn drive(input: Input, serve: impl FnOnce(UnixStream) + Send + 'static) {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // As in the iopath binary (Rust's runtime does this for `main`): a
        // write to a closed socket is an error, not a signal.
        // SAFETY: setting a signal's disposition to SIG_IGN at start-up.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    });
    let (ours, theirs) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || serve(theirs));
    let mut drain = ours.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while matches!(drain.read(&mut buf), Ok(n) if n > 0) {}
    });
    let mut fe = FrontEnd {
        sock: ours,
        need_reply: input.reply_ack,
        files: Vec::new(),
        kicks: vec![None, None, None],
    };
    if let Some(p) = &input.prelude {
        fe.prelude(p);
    }
    for m in input.msgs.into_iter().take(48) {
        fe.step(m);
    }
    let _ = rustix::net::shutdown(&fe.sock, rustix::net::Shutdown::Both);
    server.join().expect("the server panicked");
    reader.join().unwrap();
}

fn make_fd(fd: Fd, kicks: Option<&mut Option<OwnedFd>>) -> OwnedFd {
    match fd {
        Fd::Event => {
            let e = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
            if let Some(k) = kicks {
                *k = Some(e.try_clone().unwrap());
            }
            e
        }
        Fd::Memfd { pages } => memfd(u64::from(pages % 8), 0).into(),
        Fd::Socket => {
            let (a, _b) = UnixStream::pair().unwrap();
            a.into()
        }
        Fd::Pipe => rustix::pipe::pipe().unwrap().0,
    }
}

/// `VhostUserInflight`: mmap_size, mmap_offset, num_queues, queue_size
/// (24 bytes with its padding).
fn inflight_payload(size: u64, offset: u64, num_queues: u8, queue_size: u16) -> [u8; 24] {
    let mut p = [0u8; 24];
    p[0..8].copy_from_slice(&size.to_le_bytes());
    p[8..16].copy_from_slice(&offset.to_le_bytes());
    p[16..18].copy_from_slice(&u16::from(num_queues % 4).to_le_bytes());
    p[18..20].copy_from_slice(&(queue_size % 40).to_le_bytes());
    p
}

fn memfd(pages: u64, fill: u8) -> std::fs::File {
    let fd = rustix::fs::memfd_create(
        "fuzz",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )
    .unwrap();
    let mut f = std::fs::File::from(fd);
    f.set_len(pages * PAGE).unwrap();
    if fill != 0 {
        let _ = f.write_all(&vec![fill; (pages * PAGE) as usize]);
    }
    f
}

impl FrontEnd {
    pub fn prelude(&mut self, p: &Prelude) {
        const REGION_PAGES: u64 = 4;
        self.send(3, &[], &[]);
        self.send(1, &[], &[]);
        // MQ, REPLY_ACK, BACKEND_REQ, CONFIG, CONFIGURE_MEM_SLOTS.
        let mut protocol: u64 = 1 | (1 << 3) | (1 << 5) | (1 << 9) | (1 << 15);
        if p.inflight.is_some() {
            protocol |= 1 << 12;
        }
        self.send(16, &protocol.to_le_bytes(), &[]);
        if let Some(bytes) = &p.inflight {
            // Two queues of 8 (the ring below): 2 x 192 bytes.
            self.step(Msg::GetInflight {
                num_queues: 2,
                queue_size: 8,
            });
            self.step(Msg::SetInflight {
                mmap_size: 384,
                offset_page: 0,
                num_queues: 2,
                queue_size: 8,
                pages: 1,
                bytes: bytes.clone(),
                fd: None,
            });
        }
        let mut f = features::VIRTIO_F_VERSION_1 | features::VHOST_USER_F_PROTOCOL_FEATURES;
        if p.iommu {
            f |= features::VIRTIO_F_ACCESS_PLATFORM;
        }
        if p.event_idx {
            f |= features::VIRTIO_F_EVENT_IDX;
        }
        self.send(2, &f.to_le_bytes(), &[]);
        let file = memfd(REGION_PAGES, p.fill);
        // A request: a 64-byte readable descriptor chained to a 64-byte
        // writable one, posted in the available ring.
        let mut desc = [0u8; 32];
        desc[0..8].copy_from_slice(&0x3000u64.to_le_bytes());
        desc[8..12].copy_from_slice(&64u32.to_le_bytes());
        desc[12..14].copy_from_slice(&1u16.to_le_bytes());
        desc[14..16].copy_from_slice(&1u16.to_le_bytes());
        desc[16..24].copy_from_slice(&0x3100u64.to_le_bytes());
        desc[24..28].copy_from_slice(&64u32.to_le_bytes());
        desc[28..30].copy_from_slice(&2u16.to_le_bytes());
        let _ = rustix::io::pwrite(&file, &desc, 0);
        let _ = rustix::io::pwrite(&file, &[0, 0, 1, 0, 0, 0], 0x1000);
        let _ = rustix::io::pwrite(&file, &[0u8; 8], 0x2000);
        let fd = OwnedFd::from(file.try_clone().unwrap());
        self.files.push(file);
        let mut table = vec![0u8; 8 + 32];
        table[0..4].copy_from_slice(&1u32.to_le_bytes());
        table[16..24].copy_from_slice(&(REGION_PAGES * PAGE).to_le_bytes());
        table[24..32].copy_from_slice(&UADDR_BASE.to_le_bytes());
        self.send(5, &table, &[fd]);
        if p.iommu {
            let map = RawIotlb {
                iova: 0,
                size: REGION_PAGES * PAGE,
                uaddr: UADDR_BASE,
                perm: 3,
                kind: 2,
            };
            self.send(22, &map.encode(), &[]);
        }
        self.vring_state(8, 0, 8);
        let ring = |off: u64| if p.iommu { off } else { UADDR_BASE + off };
        let mut addr = [0u8; 40];
        addr[8..16].copy_from_slice(&ring(0).to_le_bytes());
        addr[16..24].copy_from_slice(&ring(0x2000).to_le_bytes());
        addr[24..32].copy_from_slice(&ring(0x1000).to_le_bytes());
        self.send(9, &addr, &[]);
        self.vring_state(10, 0, 0);
        self.vring_fd(12, 0, Some(Fd::Event));
        self.vring_fd(13, 0, Some(Fd::Event));
        self.vring_state(18, 0, 1);
        self.step(Msg::Kick { idx: 0 });
    }

    fn send(&mut self, request: u32, payload: &[u8], fds: &[OwnedFd]) {
        let hdr = Header::request(request, payload.len(), self.need_reply);
        self.send_raw(&hdr.to_bytes(), payload, fds);
    }

    fn send_raw(&mut self, hdr: &[u8], payload: &[u8], fds: &[OwnedFd]) {
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        let mut space =
            vec![std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(32))];
        let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
        if !borrowed.is_empty() {
            control.push(rustix::net::SendAncillaryMessage::ScmRights(
                &borrowed[..borrowed.len().min(32)],
            ));
        }
        let _ = rustix::net::sendmsg(
            &self.sock,
            &[IoSlice::new(hdr), IoSlice::new(payload)],
            &mut control,
            rustix::net::SendFlags::NOSIGNAL,
        );
    }

    fn region_payload(&mut self, r: &Region) -> ([u8; 32], OwnedFd) {
        let pages = u64::from(r.pages % 4) + 1;
        let file = memfd(u64::from(r.file_pages % 6), r.fill);
        let fd = OwnedFd::from(file.try_clone().unwrap());
        self.files.push(file);
        let mut p = [0u8; 32];
        p[0..8].copy_from_slice(&(u64::from(r.gpa_page) * PAGE).to_le_bytes());
        p[8..16].copy_from_slice(&(pages * PAGE).to_le_bytes());
        p[16..24].copy_from_slice(&(UADDR_BASE + u64::from(r.uaddr_page) * PAGE).to_le_bytes());
        p[24..32].copy_from_slice(&(u64::from(r.offset_page % 4) * PAGE).to_le_bytes());
        (p, fd)
    }

    fn vring_state(&mut self, request: u32, idx: u8, num: u32) {
        let mut p = [0u8; 8];
        p[0..4].copy_from_slice(&u32::from(idx % 3).to_le_bytes());
        p[4..8].copy_from_slice(&num.to_le_bytes());
        self.send(request, &p, &[]);
    }

    fn vring_fd(&mut self, request: u32, idx: u8, fd: Option<Fd>) {
        let i = usize::from(idx % 3);
        let mut fds = Vec::new();
        let mut value = i as u64;
        match fd {
            Some(f) => {
                let slot = if request == 12 {
                    self.kicks.get_mut(i)
                } else {
                    None
                };
                fds.push(make_fd(f, slot));
            }
            None => value |= 0x100,
        }
        self.send(request, &value.to_le_bytes(), &fds);
    }

    pub fn step(&mut self, m: Msg) {
        match m {
            Msg::GetFeatures => self.send(1, &[], &[]),
            Msg::SetFeatures { bits } => {
                let mut f = 0u64;
                for (i, bit) in [32u64, 33, 28, 29, 30, 0, 63].iter().enumerate() {
                    if bits & (1 << i) != 0 {
                        f |= 1 << bit;
                    }
                }
                self.send(2, &f.to_le_bytes(), &[]);
            }
            Msg::GetProtocolFeatures => self.send(15, &[], &[]),
            Msg::SetProtocolFeatures { bits } => self.send(16, &bits.to_le_bytes(), &[]),
            Msg::SetOwner => self.send(3, &[], &[]),
            Msg::ResetOwner => self.send(4, &[], &[]),
            Msg::GetQueueNum => self.send(17, &[], &[]),
            Msg::MemTable {
                regions,
                missing_fds,
            } => {
                let regions: Vec<_> = regions.into_iter().take(8).collect();
                let mut p = Vec::with_capacity(8 + 32 * regions.len());
                p.extend_from_slice(&(regions.len() as u32).to_le_bytes());
                p.extend_from_slice(&0u32.to_le_bytes());
                let mut fds = Vec::new();
                for r in &regions {
                    let (rp, fd) = self.region_payload(r);
                    p.extend_from_slice(&rp);
                    fds.push(fd);
                }
                fds.truncate(fds.len().saturating_sub(usize::from(missing_fds % 2)));
                self.send(5, &p, &fds);
            }
            Msg::AddRegion(r) | Msg::RemoveRegion(r) => {
                let add = matches!(m, Msg::AddRegion(_));
                let (rp, fd) = self.region_payload(&r);
                let mut p = vec![0u8; 8];
                p.extend_from_slice(&rp);
                if add {
                    self.send(37, &p, &[fd]);
                } else {
                    self.send(38, &p, &[]);
                }
            }
            Msg::VringNum { idx, num } => self.vring_state(8, idx, u32::from(num)),
            Msg::VringAddr {
                idx,
                desc,
                used,
                avail,
                iova,
            } => {
                let addr = |a: u16| {
                    let off = u64::from(a) * 16;
                    if iova {
                        off
                    } else {
                        UADDR_BASE + off
                    }
                };
                let mut p = [0u8; 40];
                p[0..4].copy_from_slice(&u32::from(idx % 3).to_le_bytes());
                p[8..16].copy_from_slice(&addr(desc).to_le_bytes());
                p[16..24].copy_from_slice(&addr(used).to_le_bytes());
                p[24..32].copy_from_slice(&addr(avail).to_le_bytes());
                self.send(9, &p, &[]);
            }
            Msg::VringBase { idx, base, get } => {
                self.vring_state(if get { 11 } else { 10 }, idx, u32::from(base))
            }
            Msg::VringKick { idx, fd } => self.vring_fd(12, idx, fd),
            Msg::VringCall { idx, fd } => self.vring_fd(13, idx, fd),
            Msg::VringEnable { idx, on } => self.vring_state(18, idx, u32::from(on)),
            Msg::Kick { idx } => {
                if let Some(Some(k)) = self.kicks.get(usize::from(idx % 3)) {
                    let _ = rustix::io::write(k, &1u64.to_ne_bytes());
                }
            }
            Msg::Iotlb {
                iova,
                size,
                uaddr_page,
                perm,
                kind,
                len,
            } => {
                let raw = RawIotlb {
                    iova: u64::from(iova) * 16,
                    size: u64::from(size) * 16,
                    uaddr: UADDR_BASE + u64::from(uaddr_page) * PAGE,
                    perm,
                    kind,
                };
                let w = raw.encode();
                let n = if len % 4 == 0 {
                    usize::from(len) % 40
                } else {
                    w.len()
                };
                let mut payload = w.to_vec();
                payload.resize(n, 0);
                self.send(22, &payload, &[]);
            }
            Msg::BackendReqFd { fd, len } => {
                let fds: Vec<_> = fd.map(|f| make_fd(f, None)).into_iter().collect();
                self.send(21, &vec![0u8; usize::from(len % 16)], &fds);
            }
            Msg::Config { offset, size } => {
                let size = u32::from(size % 300);
                let mut p = Vec::new();
                p.extend_from_slice(&u32::from(offset).to_le_bytes());
                p.extend_from_slice(&size.to_le_bytes());
                p.extend_from_slice(&0u32.to_le_bytes());
                p.resize(12 + size as usize, 0);
                self.send(24, &p, &[]);
            }
            Msg::GetInflight {
                num_queues,
                queue_size,
            } => {
                self.send(31, &inflight_payload(0, 0, num_queues, queue_size), &[]);
            }
            Msg::SetInflight {
                mmap_size,
                offset_page,
                num_queues,
                queue_size,
                pages,
                bytes,
                fd,
            } => {
                let fd = match fd {
                    Some(f) => make_fd(f, None),
                    None => {
                        let file = memfd(u64::from(pages % 4), 0);
                        let _ = rustix::io::pwrite(&file, &bytes[..bytes.len().min(4096)], 0);
                        let fd = OwnedFd::from(file.try_clone().unwrap());
                        self.files.push(file);
                        fd
                    }
                };
                let p = inflight_payload(
                    u64::from(mmap_size),
                    u64::from(offset_page % 3) * PAGE,
                    num_queues,
                    queue_size,
                );
                self.send(32, &p, &[fd]);
            }
            Msg::Poke { region, at, bytes } => {
                if self.files.is_empty() {
                    return;
                }
                let f = &self.files[usize::from(region) % self.files.len()];
                let _ = rustix::io::pwrite(f, &bytes[..bytes.len().min(256)], u64::from(at));
            }
            Msg::Raw {
                request,
                flags,
                payload,
                fds,
            } => {
                let request = u32::from(request % 48);
                let flags = match flags % 4 {
                    0 => VERSION,
                    1 => VERSION | NEED_REPLY,
                    _ => u32::from(flags),
                };
                let payload = &payload[..payload.len().min(512)];
                let hdr = Header {
                    request,
                    flags,
                    size: payload.len() as u32,
                };
                let fds: Vec<_> = fds.into_iter().take(4).map(|f| make_fd(f, None)).collect();
                self.send_raw(&hdr.to_bytes(), payload, &fds);
            }
        }
    }
}
