//! libblkio (the `blkio` crate's `virtio-blk-vhost-user` driver, the
//! user-space virtio-blk driver QEMU's people maintain) as the front end
//! of iopath's back end: what `iopath blk serve` runs ([`Exports`]) on a
//! real unix socket, with one and two queues and with poll queues. Every
//! block written is read back through libblkio and from the image file on
//! the host, byte for byte.

use std::mem::MaybeUninit;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use blkio::{Blkio, Blkioq, Completion, MemoryRegion, ReqFlags};
use iopath_blk::{ExportSpec, Exports};

const IMAGE: u64 = 16 << 20;
const BLOCK: usize = 4096;
const BIG: usize = 1 << 20;
/// Random 4 KiB blocks written per test.
const BLOCKS: usize = 300;
/// How long one batch may take before the test fails (never a hang).
const DEADLINE: Duration = Duration::from_secs(20);

/// An image served the way `iopath blk serve --export` serves it.
struct Served {
    dir: tempfile::TempDir,
}

impl Served {
    /// Serves a fresh image of [`IMAGE`] bytes with `queues` queues.
    fn start(queues: usize) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(IMAGE)
            .unwrap();
        let mut spec = ExportSpec::new(&image, dir.path().join("blk.sock"));
        spec.options.queues = queues;
        let exports = Exports::open(vec![spec], 0o600).unwrap();
        // The server runs until the test process exits.
        std::thread::spawn(move || exports.serve());
        Served { dir }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("blk.sock")
    }

    /// `len` bytes of the image at `offset`, as the host reads the file.
    fn image_bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let f = std::fs::File::open(self.dir.path().join("disk.img")).unwrap();
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, offset).unwrap();
        buf
    }
}

/// A libblkio instance connected and started, with one memory region
/// mapped for its buffers.
struct Client {
    // Queues before the instance: dropped first.
    queues: Vec<Blkioq>,
    region: MemoryRegion,
    blkio: Blkio,
}

impl Client {
    /// Connects to `socket` with `queues` interrupt-driven queues and
    /// `poll_queues` poll queues (used in that order), and a region of
    /// `region` bytes.
    fn connect(socket: &Path, queues: i32, poll_queues: i32, region: usize) -> Client {
        let mut blkio = Blkio::new("virtio-blk-vhost-user").unwrap();
        blkio.set_str("path", socket.to_str().unwrap()).unwrap();
        blkio.connect().unwrap();
        assert_eq!(blkio.get_u64("capacity").unwrap(), IMAGE);
        blkio.set_i32("num-queues", queues).unwrap();
        blkio.set_i32("num-poll-queues", poll_queues).unwrap();
        let started = blkio.start().unwrap();
        let mut all = started.queues;
        all.extend(started.poll_queues);
        assert_eq!(all.len(), (queues + poll_queues) as usize);
        let region = blkio.alloc_mem_region(region).unwrap();
        blkio.map_mem_region(&region).unwrap();
        Client {
            queues: all,
            region,
            blkio,
        }
    }

    /// Copies `data` into the region at `at`.
    fn fill(&mut self, at: usize, data: &[u8]) {
        assert!(at + data.len() <= self.region.len);
        // SAFETY: the range is inside the region (checked above), which
        // stays mapped while `self.blkio` lives; no request is in flight
        // (every batch completes before `fill` is called again), so the
        // back end does not touch it meanwhile.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.region.addr + at) as *mut u8,
                data.len(),
            );
        }
    }

    /// The region's bytes at `at`.
    fn bytes(&self, at: usize, len: usize) -> Vec<u8> {
        assert!(at + len <= self.region.len);
        let mut out = vec![0u8; len];
        // SAFETY: as in `fill`: in bounds, mapped, no request in flight.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.region.addr + at) as *const u8,
                out.as_mut_ptr(),
                len,
            );
        }
        out
    }

    fn ptr(&self, at: usize) -> *mut u8 {
        (self.region.addr + at) as *mut u8
    }

    /// Runs `ops` (queue, op) in rounds: each round puts up to 32 of each
    /// queue's ops in flight on every queue at once, then waits for them;
    /// every op must complete with 0.
    fn run(&mut self, ops: &[(usize, Op)]) {
        let mut per_queue: Vec<Vec<Op>> = vec![Vec::new(); self.queues.len()];
        for &(q, op) in ops {
            per_queue[q].push(op);
        }
        let rounds = per_queue.iter().map(|o| o.len().div_ceil(32)).max();
        for round in 0..rounds.unwrap_or(0) {
            let mut submitted = vec![0; self.queues.len()];
            for (q, mine) in per_queue.iter().enumerate() {
                let batch = mine.chunks(32).nth(round).unwrap_or_default();
                for (tag, op) in batch.iter().enumerate() {
                    let ptr = match *op {
                        Op::Write { at, .. } | Op::Read { at, .. } => self.ptr(at),
                        Op::Flush => std::ptr::null_mut(),
                    };
                    let queue = &mut self.queues[q];
                    match *op {
                        Op::Write { offset, len, .. } => {
                            queue.write(offset, ptr, len, tag, ReqFlags::empty())
                        }
                        Op::Read { offset, len, .. } => {
                            queue.read(offset, ptr, len, tag, ReqFlags::empty())
                        }
                        Op::Flush => queue.flush(tag, ReqFlags::empty()),
                    }
                }
                submitted[q] = batch.len();
            }
            for (q, &n) in submitted.iter().enumerate() {
                let mut done: Vec<_> = (0..n)
                    .map(|_| MaybeUninit::<Completion>::uninit())
                    .collect();
                let mut left = DEADLINE;
                let got = self.queues[q]
                    .do_io(&mut done, n, Some(&mut left), None)
                    .unwrap();
                assert_eq!(got, n, "queue {q}: completions within {DEADLINE:?}");
                for c in &done[..got] {
                    // SAFETY: do_io filled the first `got` entries.
                    let c = unsafe { c.assume_init_ref() };
                    assert_eq!(c.ret, 0, "queue {q}: request {} failed", c.user_data);
                }
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.queues.clear();
        self.blkio.unmap_mem_region(&self.region);
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Write { at: usize, offset: u64, len: usize },
    Read { at: usize, offset: u64, len: usize },
    Flush,
}

/// `len` bytes no other block of the test repeats: each 8-byte word holds
/// `seed` and its index.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64 / 8)
        .flat_map(|i| {
            (seed << 32 | i)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .to_le_bytes()
        })
        .collect()
}

/// `n` distinct 4 KiB block numbers of the image past its first 2 MiB, in
/// a random order (xorshift, fixed seed).
fn random_blocks(n: usize) -> Vec<u64> {
    let first = (2 * BIG / BLOCK) as u64;
    let count = IMAGE / BLOCK as u64 - first;
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = first + x % count;
        if seen.insert(b) {
            out.push(b);
        }
    }
    out
}

/// Writes 1 MiB and [`BLOCKS`] random 4 KiB blocks over every queue,
/// flushes, reads all back into a dirtied region, and compares with what
/// was written, through libblkio and in the image file.
fn writes_flush_and_reads_back(queues: usize, poll_queues: usize) {
    let served = Served::start(queues + poll_queues);
    let region = 2 * BIG + BLOCKS * BLOCK;
    let mut c = Client::connect(&served.socket(), queues as i32, poll_queues as i32, region);
    let nq = c.queues.len();

    // 1 MiB at 1 MiB, in one request.
    let big = pattern(1, BIG);
    c.fill(0, &big);
    c.run(&[(
        0,
        Op::Write {
            at: 0,
            offset: BIG as u64,
            len: BIG,
        },
    )]);

    // Random blocks, round robin over the queues.
    let blocks = random_blocks(BLOCKS);
    let data: Vec<Vec<u8>> = (0..BLOCKS)
        .map(|i| pattern(100 + i as u64, BLOCK))
        .collect();
    let at = |i: usize| 2 * BIG + i * BLOCK;
    for (i, d) in data.iter().enumerate() {
        c.fill(at(i), d);
    }
    let writes: Vec<_> = blocks
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            (
                i % nq,
                Op::Write {
                    at: at(i),
                    offset: b * BLOCK as u64,
                    len: BLOCK,
                },
            )
        })
        .collect();
    c.run(&writes);
    c.run(&(0..nq).map(|q| (q, Op::Flush)).collect::<Vec<_>>());

    // Dirty every buffer, then read back: a device that writes nothing
    // fails.
    c.fill(0, &vec![0xa5; region]);
    let reads: Vec<_> = writes
        .iter()
        .map(|&(q, op)| match op {
            // Read on another queue than the write went through.
            Op::Write { at, offset, len } => ((q + 1) % nq, Op::Read { at, offset, len }),
            _ => unreachable!(),
        })
        .collect();
    c.run(&reads);
    c.run(&[(
        nq - 1,
        Op::Read {
            at: BIG,
            offset: BIG as u64,
            len: BIG,
        },
    )]);
    assert!(c.bytes(BIG, BIG) == big, "1 MiB read back differs");
    for (i, (&b, d)) in blocks.iter().zip(&data).enumerate() {
        assert!(c.bytes(at(i), BLOCK) == *d, "block {b} read back differs");
    }

    // The host sees the same bytes in the image file.
    assert!(
        served.image_bytes(BIG as u64, BIG) == big,
        "image differs (1 MiB)"
    );
    for (&b, d) in blocks.iter().zip(&data) {
        assert!(
            served.image_bytes(b * BLOCK as u64, BLOCK) == *d,
            "image differs at block {b}"
        );
    }
    // What was never written reads as zeros.
    assert!(served.image_bytes(0, BIG).iter().all(|&x| x == 0));
}

#[test]
fn one_queue() {
    writes_flush_and_reads_back(1, 0);
}

#[test]
fn two_queues() {
    writes_flush_and_reads_back(2, 0);
}

#[test]
fn one_poll_queue() {
    writes_flush_and_reads_back(0, 1);
}

#[test]
fn a_queue_and_a_poll_queue() {
    writes_flush_and_reads_back(1, 1);
}

/// The back end serves one front end at a time: a second libblkio waits
/// in its connect until the first is gone, then reads what the first
/// wrote.
#[test]
fn a_second_client_waits_its_turn() {
    let served = Served::start(1);
    let mut first = Client::connect(&served.socket(), 1, 0, BLOCK);
    let data = pattern(7, BLOCK);
    first.fill(0, &data);
    first.run(&[
        (
            0,
            Op::Write {
                at: 0,
                offset: 0,
                len: BLOCK,
            },
        ),
        (0, Op::Flush),
    ]);

    let (tx, rx) = mpsc::channel();
    let socket = served.socket();
    let second = std::thread::spawn(move || {
        let mut c = Client::connect(&socket, 1, 0, BLOCK);
        tx.send(()).unwrap();
        c.run(&[(
            0,
            Op::Read {
                at: 0,
                offset: 0,
                len: BLOCK,
            },
        )]);
        c.bytes(0, BLOCK)
    });
    // While the first is connected the second is not served.
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(500)),
        Err(mpsc::RecvTimeoutError::Timeout),
        "a second front end was served while the first was connected"
    );
    drop(first);
    rx.recv_timeout(DEADLINE)
        .expect("the second front end is served once the first has gone");
    assert!(second.join().unwrap() == data, "the second read differs");
}
