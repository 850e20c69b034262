//! A back end restarted under a running driver, through the request
//! handler (what `serve_connection` calls for each message) on real memfds
//! and eventfds: a first back end pops what the driver posted, finishes
//! part of it and dies without signalling; a second one, given the same
//! inflight record (`SET_INFLIGHT_FD`), must resubmit exactly the heads
//! left in flight, oldest first and from each queue's own region, and
//! signal the driver's call eventfd.
//!
//! Guest memory, per queue `q` at `q * QUEUE_SPAN`: the descriptor table,
//! the available ring at `AVAIL`, the used ring at `USED`, and per head a
//! data area at `DATA + head * 0x100` (8 readable bytes, then 16 writable
//! ones at `+0x80`). Chain `h` is descriptor `h` (readable) then `h + 4`
//! (writable), so heads are 0..4.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::time::Duration;

use vhost::vhost_user::message::{
    VhostUserInflight, VhostUserMemoryRegion, VhostUserVringAddrFlags,
};
use vhost::vhost_user::VhostUserBackendReqHandlerMut;
use virtio_queue::desc::split::Descriptor;
use vm_memory::Bytes;

use super::super::inflight::queue_region_size;
use super::*;
use crate::features::VIRTIO_F_VERSION_1;

const QSIZE: u16 = 8;
const QUEUE_SPAN: u64 = 0x4000;
const AVAIL: u64 = 0x200;
const USED: u64 = 0x400;
const DATA: u64 = 0x1000;
const MEM_SIZE: u64 = 2 * QUEUE_SPAN;
/// The front end's user address of guest physical address 0.
const UADDR: u64 = 0x7f00_0000_0000;
/// Bytes the device writes per request: the 8 it read, then its tag.
const REPLY_LEN: u32 = 16;
/// Longest a test waits for a queue thread.
const WAIT: Duration = Duration::from_secs(10);

const FEATURES: u64 = VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX | VHOST_USER_F_PROTOCOL_FEATURES;

/// What a queue thread of [`Tagger`] reports.
#[derive(Debug, PartialEq, Eq)]
enum Report {
    /// First life: the heads popped (in order) before it died.
    Popped(usize, Vec<u16>),
    /// Second life: the heads the record gave back, before running any.
    Resubmits(usize, Vec<u16>),
    /// Second life: the resubmitted heads are on the used ring and
    /// `notify` has run.
    Done(usize),
}

/// How long a [`Tagger`] back end lives.
#[derive(Clone, Debug)]
enum Life {
    /// After the first kick: pop every available chain, put those whose
    /// head is in `finish[queue]` (without a notification) and stop, as if
    /// killed between the used-ring update and its interrupt.
    First { finish: [Vec<u16>; 2] },
    /// Run the resubmitted heads once told to (one message on the queue's
    /// `go` channel), notify, then serve until stopped.
    Second,
}

/// A device whose every request copies its 8 readable bytes into its
/// writable buffer followed by a tag `[generation, queue, head, 0xa5, 0..]`,
/// so the driver can tell which back end ran which head on which queue.
struct Tagger {
    generation: u8,
    life: Life,
    reports: Mutex<Sender<Report>>,
    go: Vec<Mutex<Option<Receiver<()>>>>,
}

impl Tagger {
    fn new(generation: u8, life: Life) -> (Self, Receiver<Report>, Vec<Sender<()>>) {
        let (tx, rx) = channel();
        let (go_tx, go_rx): (Vec<_>, Vec<_>) = (0..2).map(|_| channel()).unzip();
        let device = Self {
            generation,
            life,
            reports: Mutex::new(tx),
            go: go_rx.into_iter().map(|r| Mutex::new(Some(r))).collect(),
        };
        (device, rx, go_tx)
    }

    fn report(&self, r: Report) {
        let _ = self.reports.lock().unwrap().send(r);
    }

    /// Runs one request: returns the bytes written.
    fn serve(
        &self,
        mem: &DeviceMemory,
        queue: usize,
        head: u16,
        descs: impl Iterator<Item = Descriptor>,
    ) -> u32 {
        let mut read = [0u8; 8];
        let mut written = 0;
        for d in descs {
            if d.is_write_only() {
                let mut reply = [0u8; REPLY_LEN as usize];
                reply[..8].copy_from_slice(&read);
                reply[8..12].copy_from_slice(&[self.generation, queue as u8, head as u8, 0xa5]);
                mem.write_slice(&reply, d.addr()).unwrap();
                written += REPLY_LEN;
            } else {
                mem.read_slice(&mut read, d.addr()).unwrap();
            }
        }
        written
    }
}

impl VirtioDevice for Tagger {
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX
    }
    fn num_queues(&self) -> usize {
        2
    }
    fn max_queue_size(&self) -> u16 {
        QSIZE
    }
    fn read_config(&self, _offset: u32, len: u32) -> Vec<u8> {
        vec![0; len as usize]
    }
    fn run_queue(&self, mut ctx: QueueContext) -> Queue {
        let q = ctx.index();
        match &self.life {
            Life::First { finish } => {
                loop {
                    match ctx.wait(None) {
                        Ok(w) if w.stop => return ctx.into_queue(),
                        Ok(w) if w.kick => break,
                        Ok(_) => {}
                        Err(e) => panic!("wait: {e}"),
                    }
                }
                let mem = ctx.memory();
                let mut popped = Vec::new();
                while let Some(chain) = ctx.pop_chain(&mem) {
                    let head = chain.head_index();
                    popped.push(head);
                    if finish[q].contains(&head) {
                        let n = self.serve(&mem, q, head, chain);
                        ctx.add_used(&mem, head, n).unwrap();
                    }
                }
                self.report(Report::Popped(q, popped));
                // Killed here: no notification, the rest still in flight.
                ctx.into_queue()
            }
            Life::Second => {
                let heads = ctx.take_resubmits();
                self.report(Report::Resubmits(q, heads.clone()));
                let go = self.go[q].lock().unwrap().take().unwrap();
                go.recv_timeout(WAIT).expect("the test never said go");
                let mem = ctx.memory();
                for head in heads {
                    let n = self.serve(&mem, q, head, ctx.chain_at(&mem, head));
                    ctx.add_used(&mem, head, n).unwrap();
                }
                ctx.notify(&mem);
                self.report(Report::Done(q));
                while !ctx.wait(None).is_ok_and(|w| w.stop) {}
                ctx.into_queue()
            }
        }
    }
}

/// The driver's side of the shared memory and the eventfds.
struct Driver {
    mem: File,
    calls: [File; 2],
}

fn eventfd() -> File {
    use rustix::event::EventfdFlags;
    File::from(rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap())
}

fn memfd(len: u64) -> File {
    use rustix::fs::{memfd_create, MemfdFlags};
    let f = File::from(
        memfd_create("test-mem", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap(),
    );
    f.set_len(len).unwrap();
    f
}

impl Driver {
    fn new() -> Self {
        let drv = Self {
            mem: memfd(MEM_SIZE),
            calls: [eventfd(), eventfd()],
        };
        // Every reply buffer dirty, so that a request never run (or never
        // posted) reads as such.
        for q in 0..2 {
            for h in 0..4 {
                drv.put(
                    q * QUEUE_SPAN + DATA + h * 0x100 + 0x80,
                    [0xeeu8; REPLY_LEN as usize],
                );
            }
        }
        drv
    }

    fn put<const N: usize>(&self, at: u64, bytes: [u8; N]) {
        self.mem.write_all_at(&bytes, at).unwrap();
    }

    fn get<const N: usize>(&self, at: u64) -> [u8; N] {
        let mut b = [0u8; N];
        self.mem.read_exact_at(&mut b, at).unwrap();
        b
    }

    fn u16_at(&self, at: u64) -> u16 {
        u16::from_le_bytes(self.get(at))
    }

    /// The 8 bytes the driver sends with `head` of `queue`.
    fn payload(queue: usize, head: u16) -> [u8; 8] {
        0x1000_0000_0000_0000u64
            .wrapping_mul(queue as u64 + 1)
            .wrapping_add(0x0101_0101 * u64::from(head) + 0x5a)
            .to_le_bytes()
    }

    /// Writes the chains of `heads` and makes them available in this order;
    /// `used_event` (EVENT_IDX) is 0: "interrupt me after the first used
    /// entry", which the first back end leaves behind.
    fn post(&self, queue: usize, heads: &[u16]) {
        let base = queue as u64 * QUEUE_SPAN;
        for &h in heads {
            let data = base + DATA + u64::from(h) * 0x100;
            let desc = |i: u16, addr: u64, len: u32, flags: u16, next: u16| {
                let mut d = [0u8; 16];
                d[0..8].copy_from_slice(&addr.to_le_bytes());
                d[8..12].copy_from_slice(&len.to_le_bytes());
                d[12..14].copy_from_slice(&flags.to_le_bytes());
                d[14..16].copy_from_slice(&next.to_le_bytes());
                self.put(base + u64::from(i) * 16, d);
            };
            desc(h, data, 8, 1, h + 4);
            desc(h + 4, data + 0x80, REPLY_LEN, 2, 0);
            self.put(data, Self::payload(queue, h));
        }
        for (i, &h) in heads.iter().enumerate() {
            self.put(base + AVAIL + 4 + 2 * i as u64, h.to_le_bytes());
        }
        self.put(base + AVAIL + 4 + 2 * u64::from(QSIZE), 0u16.to_le_bytes());
        self.put(base + AVAIL + 2, (heads.len() as u16).to_le_bytes());
    }

    fn used_idx(&self, queue: usize) -> u16 {
        self.u16_at(queue as u64 * QUEUE_SPAN + USED + 2)
    }

    /// The used ring's entries `0..n` as (head, len).
    fn used(&self, queue: usize, n: u16) -> Vec<(u32, u32)> {
        (0..u64::from(n))
            .map(|i| {
                let e: [u8; 8] = self.get(queue as u64 * QUEUE_SPAN + USED + 4 + 8 * i);
                (
                    u32::from_le_bytes(e[0..4].try_into().unwrap()),
                    u32::from_le_bytes(e[4..8].try_into().unwrap()),
                )
            })
            .collect()
    }

    /// What the device wrote for `head`: `Some(generation)` when it holds
    /// the request's bytes and a tag for this queue and head, `None` while
    /// the buffer is as the driver left it.
    fn reply(&self, queue: usize, head: u16) -> Option<u8> {
        let at = queue as u64 * QUEUE_SPAN + DATA + u64::from(head) * 0x100 + 0x80;
        let r: [u8; REPLY_LEN as usize] = self.get(at);
        if r == [0xee; REPLY_LEN as usize] {
            return None;
        }
        assert_eq!(
            r[..8],
            Self::payload(queue, head),
            "queue {queue} head {head}"
        );
        assert_eq!(
            r[9..12],
            [queue as u8, head as u8, 0xa5],
            "queue {queue} head {head}"
        );
        assert_eq!(r[12..], [0; 4]);
        Some(r[8])
    }

    /// Signals on `queue`'s call eventfd since the last look.
    fn signals(&self, queue: usize) -> u64 {
        let mut b = [0u8; 8];
        match rustix::io::read(&self.calls[queue], &mut b) {
            Ok(8) => u64::from_ne_bytes(b),
            Err(rustix::io::Errno::AGAIN) => 0,
            other => panic!("call eventfd read: {other:?}"),
        }
    }
}

/// A back end `device` set up as QEMU sets one up (again after a restart):
/// features, protocol features, the inflight record (a new one, or
/// `record` given back), the memory table, and `queues` started at
/// `base`. Returns the handler, the record and its description, and the
/// kick eventfds.
fn connect<D: VirtioDevice>(
    device: D,
    drv: &Driver,
    record: Option<(&VhostUserInflight, &File)>,
    queues: usize,
    base: [u16; 2],
) -> (Handler<D>, VhostUserInflight, File, Vec<File>) {
    let mut h = Handler::new(Arc::new(device), ServerOptions::default());
    h.set_owner().unwrap();
    h.set_features(FEATURES).unwrap();
    h.set_protocol_features(VhostUserProtocolFeatures::INFLIGHT_SHMFD.bits())
        .unwrap();
    let (msg, file) = match record {
        None => h
            .get_inflight_fd(&VhostUserInflight::new(0, 0, 2, QSIZE))
            .unwrap(),
        Some((msg, file)) => {
            h.set_inflight_fd(msg, file.try_clone().unwrap()).unwrap();
            (*msg, file.try_clone().unwrap())
        }
    };
    let region = VhostUserMemoryRegion::new(0, MEM_SIZE, UADDR, 0);
    h.set_mem_table(&[region], vec![drv.mem.try_clone().unwrap()], None)
        .unwrap();
    let mut kicks = Vec::new();
    for (q, &base) in base.iter().enumerate().take(queues) {
        let ring = UADDR + q as u64 * QUEUE_SPAN;
        let i = q as u8;
        h.set_vring_num(q as u32, u32::from(QSIZE)).unwrap();
        h.set_vring_base(q as u32, u32::from(base)).unwrap();
        h.set_vring_addr(
            q as u32,
            VhostUserVringAddrFlags::empty(),
            ring,
            ring + USED,
            ring + AVAIL,
            0,
        )
        .unwrap();
        let kick = eventfd();
        h.set_vring_kick(i, Some(kick.try_clone().unwrap()))
            .unwrap();
        h.set_vring_call(i, Some(drv.calls[q].try_clone().unwrap()))
            .unwrap();
        h.set_vring_enable(q as u32, true).unwrap();
        kicks.push(kick);
    }
    (h, msg, file, kicks)
}

fn kick(fd: &File) {
    rustix::io::write(fd, &1u64.to_ne_bytes()).unwrap();
}

fn next(reports: &Receiver<Report>) -> Report {
    reports
        .recv_timeout(WAIT)
        .expect("no report from a queue thread")
}

/// The `inflight` byte of descriptor `head`'s state in queue `queue`'s
/// region of the record (the spec's `QueueRegionSplit`: a 16-byte header,
/// then 16 bytes per descriptor).
fn record_byte(record: &File, queue: usize, head: u16) -> u8 {
    let at = queue as u64 * queue_region_size(QSIZE) + 16 + 16 * u64::from(head);
    let mut b = [0u8];
    record.read_exact_at(&mut b, at).unwrap();
    b[0]
}

/// The recorded used index of queue `queue`'s region.
fn record_used_idx(record: &File, queue: usize) -> u16 {
    let mut b = [0u8; 2];
    record
        .read_exact_at(&mut b, queue as u64 * queue_region_size(QSIZE) + 14)
        .unwrap();
    u16::from_le_bytes(b)
}

#[test]
fn a_queue_restarted_from_a_record_signals_the_driver() {
    let drv = Driver::new();
    // Heads 0 and 1 posted; the first back end finishes 0 and dies before
    // its interrupt; the driver's used_event (0) is left behind.
    drv.post(0, &[0, 1]);
    let (first, reports, _) = Tagger::new(
        1,
        Life::First {
            finish: [vec![0], vec![]],
        },
    );
    let (h, msg, record, kicks) = connect(first, &drv, None, 1, [0, 0]);
    kick(&kicks[0]);
    assert_eq!(next(&reports), Report::Popped(0, vec![0, 1]));
    drop(h);
    assert_eq!(drv.used_idx(0), 1);
    assert_eq!(drv.used(0, 1), [(0, REPLY_LEN)]);
    assert_eq!((drv.reply(0, 0), drv.reply(0, 1)), (Some(1), None));
    assert_eq!(
        drv.signals(0),
        0,
        "the first back end died before signalling"
    );
    assert_eq!(
        (record_byte(&record, 0, 0), record_byte(&record, 0, 1)),
        (0, 1)
    );

    // The restart: QEMU gives the record back and restarts the queue at
    // the used index.
    let (second, reports, go) = Tagger::new(2, Life::Second);
    let (h, _, _, _kicks) = connect(second, &drv, Some((&msg, &record)), 1, [1, 0]);
    assert_eq!(next(&reports), Report::Resubmits(0, vec![1]));
    // At once: the driver may be waiting for head 0's interrupt.
    assert_eq!(drv.signals(0), 1, "no signal when the queue restarted");
    go[0].send(()).unwrap();
    assert_eq!(next(&reports), Report::Done(0));
    // Head 1 is on the used ring, and the driver was told although its
    // used_event (0) asks for no interrupt at used index 2.
    assert_eq!(drv.used_idx(0), 2);
    assert_eq!(drv.used(0, 2), [(0, REPLY_LEN), (1, REPLY_LEN)]);
    assert_eq!((drv.reply(0, 0), drv.reply(0, 1)), (Some(1), Some(2)));
    assert_eq!(
        drv.signals(0),
        1,
        "no signal for the resubmitted head (used_event behind the used index)"
    );
    assert_eq!(record_byte(&record, 0, 1), 0);
    assert_eq!(record_used_idx(&record, 0), 2);
    drop(h);
}

#[test]
fn two_queues_restart_each_from_its_own_region() {
    let drv = Driver::new();
    // The same head numbers on both queues, in flight on one and done on
    // the other, so a region read for the wrong queue shows.
    drv.post(0, &[2, 0, 3, 1]);
    drv.post(1, &[1, 3, 0]);
    let (first, reports, _) = Tagger::new(
        1,
        Life::First {
            finish: [vec![0], vec![3]],
        },
    );
    let (h, msg, record, kicks) = connect(first, &drv, None, 2, [0, 0]);
    assert_eq!(msg.num_queues, 2);
    assert_eq!(msg.mmap_size, 2 * queue_region_size(QSIZE));
    kick(&kicks[0]);
    kick(&kicks[1]);
    let mut popped = [next(&reports), next(&reports)];
    popped.sort_by_key(|r| matches!(r, Report::Popped(1, _)));
    assert_eq!(
        popped,
        [
            Report::Popped(0, vec![2, 0, 3, 1]),
            Report::Popped(1, vec![1, 3, 0])
        ]
    );
    drop(h);
    // Each queue's heads in its own QueueRegionSplit.
    let flags = |q| {
        (0..4)
            .map(|h| record_byte(&record, q, h))
            .collect::<Vec<_>>()
    };
    assert_eq!(flags(0), [0, 1, 1, 1]);
    assert_eq!(flags(1), [1, 1, 0, 0]);
    assert_eq!(
        (record_used_idx(&record, 0), record_used_idx(&record, 1)),
        (1, 1)
    );
    assert_eq!((drv.signals(0), drv.signals(1)), (0, 0));

    let (second, reports, go) = Tagger::new(2, Life::Second);
    let (h, _, _, _kicks) = connect(second, &drv, Some((&msg, &record)), 2, [1, 1]);
    let mut resubmits = [next(&reports), next(&reports)];
    resubmits.sort_by_key(|r| matches!(r, Report::Resubmits(1, _)));
    // Oldest first: the pop order of each queue, less what it finished.
    assert_eq!(
        resubmits,
        [
            Report::Resubmits(0, vec![2, 3, 1]),
            Report::Resubmits(1, vec![1, 0])
        ]
    );
    assert_eq!((drv.signals(0), drv.signals(1)), (1, 1));
    for g in &go {
        g.send(()).unwrap();
    }
    let mut done = [next(&reports), next(&reports)];
    done.sort_by_key(|r| matches!(r, Report::Done(1)));
    assert_eq!(done, [Report::Done(0), Report::Done(1)]);
    assert_eq!((drv.used_idx(0), drv.used_idx(1)), (4, 3));
    let l = REPLY_LEN;
    assert_eq!(drv.used(0, 4), [(0, l), (2, l), (3, l), (1, l)]);
    assert_eq!(drv.used(1, 3), [(3, l), (1, l), (0, l)]);
    // Every head ran once, each from its own queue's descriptors (the
    // reply holds that queue's payload for the head).
    let replies = |q| (0..4).map(|h| drv.reply(q, h)).collect::<Vec<_>>();
    assert_eq!(replies(0), [Some(1), Some(2), Some(2), Some(2)]);
    assert_eq!(replies(1), [Some(2), Some(2), None, Some(1)]);
    assert_eq!((drv.signals(0), drv.signals(1)), (1, 1));
    assert_eq!(flags(0), [0; 4]);
    assert_eq!(flags(1), [0; 4]);
    assert_eq!(
        (record_used_idx(&record, 0), record_used_idx(&record, 1)),
        (4, 3)
    );
    drop(h);
}

#[test]
fn a_record_too_small_for_two_queues_is_refused() {
    let needed = 2 * queue_region_size(QSIZE);
    let (device, _, _) = Tagger::new(1, Life::Second);
    let mut h = Handler::new(Arc::new(device), ServerOptions::default());
    h.set_features(FEATURES).unwrap();
    h.set_protocol_features(VhostUserProtocolFeatures::INFLIGHT_SHMFD.bits())
        .unwrap();
    // (file length, mmap_size, mmap_offset) of a two-queue record: one
    // byte short in the file, in the size, or past the end by the offset.
    for (len, size, offset) in [
        (needed - 1, needed, 0),
        (needed, needed - 1, 0),
        (4096 + needed - 1, needed, 4096),
        (needed, needed, u64::MAX - 8),
    ] {
        let msg = VhostUserInflight::new(size, offset, 2, QSIZE);
        assert!(
            h.set_inflight_fd(&msg, memfd(len)).is_err(),
            "file {len}, mmap_size {size}, mmap_offset {offset}"
        );
        assert!(h.inflight.is_none());
    }
    let msg = VhostUserInflight::new(needed, 4096, 2, QSIZE);
    h.set_inflight_fd(&msg, memfd(4096 + needed)).unwrap();
    assert!(h.inflight.is_some());
}
