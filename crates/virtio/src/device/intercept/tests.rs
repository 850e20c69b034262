//! Linux's own vhost-user front end, `virtio_uml` (User-Mode Linux 6.1 and
//! 6.12, `arch/um/drivers/virtio_uml.c`), replayed byte for byte against
//! [`serve_connection_with`]: the messages it sends to probe a virtio-blk
//! device, as recorded from a real UML guest, with the replies it expects.
//!
//! What it assumes of a back end: `SET_OWNER` before `GET_FEATURES`;
//! `REPLY_ACK` on every message without a reply of its own once that
//! protocol feature is set (`SET_PROTOCOL_FEATURES` itself included);
//! `SET_BACKEND_REQ_FD` with one end of a socketpair; `GET_CONFIG` from
//! offset 0; one memory region in a `SET_MEM_TABLE` payload with room for
//! two (72 bytes), whose `mmap_offset` equals its guest address (UML's
//! physical memory file); per queue `SET_VRING_NUM`, `SET_VRING_BASE`,
//! `SET_VRING_ADDR` (log address all ones), `SET_VRING_CALL`, then, once
//! every queue is set up, `SET_VRING_KICK` and `SET_VRING_ENABLE`; ring
//! addresses are guest physical addresses, equal to its user addresses.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::Duration;

use vm_memory::Bytes;

use super::*;
use crate::device::{serve_connection_with, QueueContext, ServerOptions};
use crate::vhost_wire::{u64_reply, U64_REPLY_SIZE};

/// The device's offer as the UML guest saw it: VERSION_1,
/// ACCESS_PLATFORM, EVENT_IDX, INDIRECT_DESC and virtio-blk's SIZE_MAX,
/// SEG_MAX, BLK_SIZE, FLUSH, MQ, DISCARD, WRITE_ZEROES (the server adds
/// PROTOCOL_FEATURES).
const DEVICE_FEATURES: u64 = 0x3_3000_7246;
/// `VIRTIO_F_ACCESS_PLATFORM`.
const ACCESS_PLATFORM: u64 = 1 << 33;
/// UML's physical memory region: guest address, size and file offset are
/// those of the recorded boot (`mem=256M`).
const REGION_GPA: u64 = 0x30fa_6000;
const REGION_SIZE: u64 = 0x0f57_9000;
/// Where the test puts the ring and one buffer, inside the region.
const DESC: u64 = REGION_GPA + 0x1_0000;
const AVAIL: u64 = DESC + 0x1000;
const USED: u64 = DESC + 0x2000;
const BUF: u64 = DESC + 0x3000;
const QSIZE: u32 = 256;
const WAIT: Duration = Duration::from_secs(10);

/// A device that reports the bytes of the first buffer of every chain it
/// pops, and puts the chain on the used ring.
struct Reader {
    seen: Mutex<Sender<(usize, Vec<u8>)>>,
}

impl VirtioDevice for Reader {
    fn features(&self) -> u64 {
        DEVICE_FEATURES
    }
    fn num_queues(&self) -> usize {
        1
    }
    fn max_queue_size(&self) -> u16 {
        256
    }
    fn read_config(&self, offset: u32, len: u32) -> Vec<u8> {
        (offset..offset + len).map(|i| i as u8).collect()
    }
    fn run_queue(&self, mut ctx: QueueContext) -> virtio_queue::Queue {
        while let Ok(w) = ctx.wait(None) {
            if w.stop {
                break;
            }
            let mem = ctx.memory();
            while let Some(chain) = ctx.pop_chain(&mem) {
                let head = chain.head_index();
                let first = chain.clone().next();
                let mut bytes = Vec::new();
                if let Some(d) = first {
                    bytes = vec![0u8; d.len() as usize];
                    let _ = mem.read_slice(&mut bytes, d.addr());
                }
                let _ = ctx.add_used(&mem, head, 0);
                let _ = lock(&self.seen).send((ctx.index(), bytes));
            }
            ctx.notify(&mem);
        }
        ctx.into_queue()
    }
}

/// The front end's side of the connection.
struct Uml {
    sock: UnixStream,
    served: Option<Served>,
}

impl Uml {
    /// Sends `request` with `flags` (1: version; 9: version and
    /// NEED_REPLY) and `payload`, with `fds` attached.
    fn send(&self, request: u32, flags: u32, payload: &[u8], fds: &[BorrowedFd<'_>]) {
        use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let mut msg = Vec::new();
        for w in [request, flags, payload.len() as u32] {
            msg.extend_from_slice(&w.to_le_bytes());
        }
        msg.extend_from_slice(payload);
        let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
        }
        let n = sendmsg(
            &self.sock,
            &[io::IoSlice::new(&msg)],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .unwrap();
        assert_eq!(n, msg.len());
    }

    fn reply(&mut self, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        if let Err(e) = self.sock.read_exact(&mut buf) {
            let served = self.served.take().map(|s| s.join());
            panic!("no reply: {e}; the server returned {served:?}");
        }
        buf
    }

    /// Sends a message that asks for a `REPLY_ACK` and returns the reply.
    fn acked(&mut self, request: u32, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Vec<u8> {
        self.send(request, 9, payload, fds);
        self.reply(U64_REPLY_SIZE)
    }

    /// Closes the connection and returns how the server ended.
    fn hang_up(mut self) -> Result<(), ServerError> {
        let served = self.served.take().unwrap();
        drop(self);
        served.join().unwrap()
    }

    fn get_u64(&mut self, request: u32) -> u64 {
        self.send(request, 1, &[], &[]);
        let r = self.reply(U64_REPLY_SIZE);
        assert_eq!(r[..12], [request, 5, 8].map(u32::to_le_bytes).concat()[..]);
        u64::from_le_bytes(r[12..].try_into().unwrap())
    }
}

fn u64s(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn vring_state(index: u32, num: u32) -> Vec<u8> {
    [index.to_le_bytes(), num.to_le_bytes()].concat()
}

fn ok(request: u32) -> Vec<u8> {
    u64_reply(request, 0).to_vec()
}

/// UML's physical memory: a sparse memfd as long as the region's end.
fn physmem() -> File {
    let fd = rustix::fs::memfd_create("uml-physmem", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let f = File::from(fd);
    f.set_len(REGION_GPA + REGION_SIZE).unwrap();
    f
}

/// The recorded `SET_MEM_TABLE` payload: one region in room for two.
fn uml_mem_table() -> Vec<u8> {
    let mut p = u64s(&[1, REGION_GPA, REGION_SIZE, REGION_GPA, REGION_GPA]);
    p.resize(72, 0);
    p
}

type Served = std::thread::JoinHandle<Result<(), ServerError>>;

fn start(options: ServerOptions) -> (Uml, std::sync::mpsc::Receiver<(usize, Vec<u8>)>) {
    let (fe, be) = UnixStream::pair().unwrap();
    let (tx, rx) = channel();
    let device = Arc::new(Reader {
        seen: Mutex::new(tx),
    });
    let served = std::thread::spawn(move || serve_connection_with(be, device, options));
    let uml = Uml {
        sock: fe,
        served: Some(served),
    };
    (uml, rx)
}

/// `vhost_user_init` and the config reads of `virtblk_probe`, up to the
/// memory table; returns the features the device offered.
fn probe(uml: &mut Uml, backend_req: &UnixStream) -> u64 {
    uml.send(3, 1, &[], &[]); // SET_OWNER
    let features = uml.get_u64(1);
    let protocol = uml.get_u64(15);
    // REPLY_ACK, BACKEND_REQ and CONFIG are what virtio_uml keeps of them.
    assert_eq!(protocol & 0x228, 0x228, "{protocol:#x}");
    assert_eq!(uml.acked(16, &u64s(&[0x228]), &[]), ok(16));
    assert_eq!(uml.acked(21, &[], &[backend_req.as_fd()]), ok(21));
    // virtio_uml's finalize_features acks everything offered.
    assert_eq!(uml.acked(2, &u64s(&[features]), &[]), ok(2));
    for size in [16u32, 36] {
        let mut get = [0u32.to_le_bytes(), size.to_le_bytes(), 0u32.to_le_bytes()].concat();
        get.resize(12 + size as usize, 0);
        uml.send(24, 1, &get, &[]);
        let r = uml.reply(12 + get.len());
        assert_eq!(
            r[..12],
            [24u32, 5, get.len() as u32].map(u32::to_le_bytes).concat()[..]
        );
        assert_eq!(r[12..24], get[..12]);
        let want: Vec<u8> = (0..size).map(|i| i as u8).collect();
        assert_eq!(r[24..], want[..]);
    }
    features
}

/// The exact sequence that failed before the memory table was decoded
/// here: the `vhost` crate refused the 72-byte table (answering 1, then
/// closing the connection: "invalid message"), and the guest printed
/// "slave reports error: 1". It is acknowledged with 0 and the connection
/// stays up.
#[test]
fn virtio_uml_memory_table_with_room_for_two_regions_is_acknowledged() {
    let (mut uml, _seen) = start(ServerOptions::default());
    let (req, _req_peer) = UnixStream::pair().unwrap();
    assert_eq!(probe(&mut uml, &req), DEVICE_FEATURES | 1 << 30);
    let mem = physmem();
    assert_eq!(uml.acked(5, &uml_mem_table(), &[mem.as_fd()]), ok(5));
    assert_eq!(uml.get_u64(1), DEVICE_FEATURES | 1 << 30);
    uml.hang_up().unwrap();
}

/// The whole probe with `ACCESS_PLATFORM` withheld (what `virtio_uml`
/// needs): the queue starts on the guest physical ring addresses, and the
/// device reads the buffer the guest posted at its guest physical address,
/// which is the same offset in the memory file.
#[test]
fn virtio_uml_probe_starts_the_queue_and_the_device_reads_guest_memory() {
    let options = ServerOptions {
        access_platform: false,
        ..ServerOptions::default()
    };
    let (mut uml, seen) = start(options);
    let (req, _req_peer) = UnixStream::pair().unwrap();
    let features = probe(&mut uml, &req);
    assert_eq!(features, (DEVICE_FEATURES | 1 << 30) & !ACCESS_PLATFORM);
    let mem = physmem();
    assert_eq!(uml.acked(5, &uml_mem_table(), &[mem.as_fd()]), ok(5));

    // The guest's ring: one chain, one 16-byte buffer, made available.
    let pattern: Vec<u8> = (0..16u8).map(|i| 0xa0 ^ i).collect();
    mem.write_all_at(&pattern, BUF).unwrap();
    let desc = [u64s(&[BUF]), 16u32.to_le_bytes().to_vec(), vec![0; 4]].concat();
    mem.write_all_at(&desc, DESC).unwrap();
    mem.write_all_at(&[0, 0, 1, 0, 0, 0], AVAIL).unwrap();

    // vu_setup_vq, then (for every queue) kick and enable.
    let call = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let kick = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    assert_eq!(uml.acked(13, &u64s(&[0]), &[call.as_fd()]), ok(13));
    assert_eq!(uml.acked(8, &vring_state(0, QSIZE), &[]), ok(8));
    assert_eq!(uml.acked(10, &vring_state(0, 0), &[]), ok(10));
    let addr = [
        0u32.to_le_bytes().to_vec(),
        vec![0; 4],
        u64s(&[DESC, USED, AVAIL, u64::MAX]),
    ]
    .concat();
    assert_eq!(uml.acked(9, &addr, &[]), ok(9));
    assert_eq!(uml.acked(12, &u64s(&[0]), &[kick.as_fd()]), ok(12));
    assert_eq!(uml.acked(18, &vring_state(0, 1), &[]), ok(18));
    rustix::io::write(&kick, &1u64.to_ne_bytes()).unwrap();

    assert_eq!(seen.recv_timeout(WAIT).unwrap(), (0, pattern));
    // The chain is on the used ring, where the guest looks for it.
    let used_idx = {
        let mut b = [0u8; 2];
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            mem.read_exact_at(&mut b, USED + 2).unwrap();
            if b != [0, 0] || std::time::Instant::now() > deadline {
                break u16::from_le_bytes(b);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    assert_eq!(used_idx, 1);

    // vu_del_vqs: disable, then GET_FEATURES to be sure it was processed.
    assert_eq!(uml.acked(18, &vring_state(0, 0), &[]), ok(18));
    assert_eq!(uml.get_u64(1), features);
    uml.hang_up().unwrap();
}

/// A table that cannot hold the regions it announces, or whose fds do not
/// match them, closes the connection with the exact error.
#[test]
fn malformed_memory_tables_close_the_connection() {
    let (mut uml, _seen) = start(ServerOptions::default());
    let (req, _req_peer) = UnixStream::pair().unwrap();
    probe(&mut uml, &req);
    let mem = physmem();
    let mut two = uml_mem_table();
    two[0] = 2;
    uml.send(5, 9, &two[..40], &[mem.as_fd()]);
    match uml.hang_up() {
        Err(ServerError::Wire(vhost_wire::VhostUserWireError::BadMemTable {
            size: 40,
            regions: 2,
            ..
        })) => {}
        other => panic!("{other:?}"),
    }

    let (mut uml, _seen) = start(ServerOptions::default());
    probe(&mut uml, &req);
    uml.send(5, 9, &two, &[mem.as_fd()]);
    match uml.hang_up() {
        Err(ServerError::MalformedMessage {
            request: 5,
            len: 72,
        }) => {}
        other => panic!("{other:?}"),
    }
}
