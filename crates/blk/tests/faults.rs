//! Faults with real processes and real files: `iopath blk serve` killed
//! with SIGKILL in the middle of a stream of writes and started again on
//! the same image and socket; started again from the inflight record a
//! kill leaves (`INFLIGHT_SHMFD`); an image on a file system that fills
//! up.

mod common;
mod frontend;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{alloc, connect, driver, Mode};
use frontend::Server;
use iopath_blk::{BlkError, DriverOptions};

const BLOCK: usize = 256 << 10;

/// Block `b` of generation-free data: each 8-byte word holds its device
/// offset, xored with a tag so a block of zeros never passes.
fn block_data(b: u64) -> Vec<u8> {
    let base = b * BLOCK as u64;
    (0..BLOCK as u64 / 8)
        .flat_map(|i| ((base + 8 * i) ^ 0x5eed_0000_0000_0000).to_le_bytes())
        .collect()
}

#[test]
fn back_end_killed_mid_write_fails_fast_and_flushed_writes_survive() {
    const BLOCKS: u64 = 256; // a 64 MiB image, each block written once
    let mut srv = Server::start(BLOCKS * BLOCK as u64, &[]);
    let buf = alloc(BLOCK);
    let opts = DriverOptions::default();
    let mut drv = driver(
        Mode::Direct,
        connect(&srv.socket),
        std::slice::from_ref(&buf),
        &opts,
    )
    .unwrap();

    // The writer: block after block, a flush after every 4; `flushed`
    // counts the blocks a completed flush made durable.
    let flushed = Arc::new(AtomicU64::new(0));
    let killed_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let writer = {
        let flushed = Arc::clone(&flushed);
        std::thread::spawn(move || -> (u64, BlkError, Instant) {
            let mut b = 0;
            loop {
                assert!(b < BLOCKS, "the back end was never killed");
                buf.write_at(0, &block_data(b)).unwrap();
                if let Err(e) = drv.write(b * BLOCK as u64, &buf, 0, BLOCK) {
                    return (b, e, Instant::now());
                }
                b += 1;
                if b % 4 == 0 {
                    if let Err(e) = drv.flush() {
                        return (b, e, Instant::now());
                    }
                    flushed.store(b, Ordering::SeqCst);
                }
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while flushed.load(Ordering::SeqCst) < 32 {
        assert!(Instant::now() < deadline, "the writer made no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
    *killed_at.lock().unwrap() = Some(Instant::now());
    srv.kill();
    let kill = killed_at.lock().unwrap().unwrap();
    let (at, err, failed) = writer.join().unwrap();
    let durable = flushed.load(Ordering::SeqCst);
    // A clear error, within a second: the connection is gone.
    assert!(
        failed.duration_since(kill) < Duration::from_secs(1),
        "the driver took {:?} to notice",
        failed.duration_since(kill)
    );
    assert!(
        matches!(err, BlkError::Virtio(iopath_virtio::Error::Closed)),
        "unexpected error at block {at}: {err:?} ({err})"
    );
    assert!(
        durable >= 32 && at >= durable,
        "{durable} flushed, failed at {at}"
    );

    // Every block acknowledged before a completed flush is in the image.
    let img = srv.image_bytes(0, (durable as usize) * BLOCK);
    for b in 0..durable {
        let at = b as usize * BLOCK;
        assert!(
            img[at..at + BLOCK] == block_data(b)[..],
            "flushed block {b} is not in the image"
        );
    }

    // The back end again, on the same image and socket: a new connection
    // reads the flushed blocks back and writes and verifies new data.
    srv.restart(&[]);
    let back = alloc(BLOCK);
    let mut drv = driver(
        Mode::Direct,
        connect(&srv.socket),
        std::slice::from_ref(&back),
        &opts,
    )
    .unwrap();
    let mut got = vec![0u8; BLOCK];
    for b in [0, durable / 2, durable - 1] {
        back.fill(0, BLOCK, 0x5a).unwrap();
        drv.read(b * BLOCK as u64, &back, 0, BLOCK).unwrap();
        back.read_at(0, &mut got).unwrap();
        assert!(got == block_data(b), "block {b} read after the restart");
    }
    let last = BLOCKS - 1;
    back.write_at(0, &block_data(last)).unwrap();
    drv.write(last * BLOCK as u64, &back, 0, BLOCK).unwrap();
    drv.flush().unwrap();
    back.fill(0, BLOCK, 0).unwrap();
    drv.read(last * BLOCK as u64, &back, 0, BLOCK).unwrap();
    back.read_at(0, &mut got).unwrap();
    assert!(got == block_data(last), "a write after the restart");
    assert!(srv.image_bytes(last * BLOCK as u64, BLOCK) == block_data(last));
}

/// A size-limited tmpfs mounted for one test; unmounted on drop.
struct Mount {
    dir: tempfile::TempDir,
}

impl Mount {
    /// Mounts a tmpfs of `size` bytes, or says why it cannot (not root, no
    /// mount in this container): skipped, or a failure under CI, whose
    /// machine runs the suite as root.
    fn tmpfs(size: u64) -> Option<Mount> {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size}"))
            .arg("tmpfs")
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Mount { dir }),
            other => {
                iopath_testkit::skip(
                    iopath_testkit::Feature::Root,
                    format_args!("cannot mount a tmpfs (needs root): {other:?}"),
                );
                None
            }
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

#[test]
fn image_on_a_full_file_system_gets_ioerr_and_keeps_what_was_written() {
    const MIB: usize = 1 << 20;
    let Some(fs) = Mount::tmpfs(4 * MIB as u64) else {
        return;
    };
    // A sparse 16 MiB image on a 4 MiB file system: writes fill it up.
    let image = fs.dir.path().join("disk.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(16 * MIB as u64)
        .unwrap();
    let sock_dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start_on(sock_dir, image, &[]);
    let buf = alloc(MIB);
    let back = alloc(MIB);
    let mut drv = driver(
        Mode::Direct,
        connect(&srv.socket),
        &[buf.clone(), back.clone()],
        &DriverOptions::default(),
    )
    .unwrap();
    let data = |b: usize| common::seq((b * MIB) as u64, MIB);

    // Block after block until the file system is full.
    let mut written = 0;
    let first_err = loop {
        assert!(written < 16, "a 4 MiB file system took 16 MiB");
        buf.write_at(0, &data(written)).unwrap();
        match drv.write((written * MIB) as u64, &buf, 0, MIB) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(first_err, BlkError::IoError { .. }),
        "a write past full: {first_err:?}"
    );
    assert!((2..=4).contains(&written), "{written} MiB fit in 4 MiB");
    drv.flush().unwrap();
    // Past full again, on the same connection: IOERR again, not a hang.
    buf.write_at(0, &data(8)).unwrap();
    assert!(matches!(
        drv.write((8 * MIB) as u64, &buf, 0, MIB),
        Err(BlkError::IoError { .. })
    ));
    // What was written before reads back intact, through the driver and
    // in the file.
    let mut got = vec![0u8; MIB];
    for b in 0..written {
        back.fill(0, MIB, 0x5a).unwrap();
        drv.read((b * MIB) as u64, &back, 0, MIB).unwrap();
        back.read_at(0, &mut got).unwrap();
        assert!(got == data(b), "block {b} read back");
        assert!(
            srv.image_bytes((b * MIB) as u64, MIB) == data(b),
            "block {b} in the image"
        );
    }
    drop(drv);
    // The back end is still up and serves a new connection.
    assert!(srv.alive(), "the back end died on a full file system");
    let mut drv = driver(
        Mode::Direct,
        connect(&srv.socket),
        std::slice::from_ref(&back),
        &DriverOptions::default(),
    )
    .unwrap();
    back.fill(0, MIB, 0).unwrap();
    drv.read(0, &back, 0, MIB).unwrap();
    back.read_at(0, &mut got).unwrap();
    assert!(got == data(0), "block 0 on a new connection");
    drop(drv);
    srv.kill();
}

/// Bytes of a split-ring inflight record's queue header and of one
/// descriptor's state (the vhost-user spec's `QueueRegionSplit` and
/// `DescStateSplit`): `inflight` is a descriptor state's first byte,
/// `counter` its u64 at 8; `used_idx` is the header's u16 at 14.
const RECORD_HEADER: u64 = 16;
const RECORD_DESC: u64 = 16;

/// The real back end restarted from an inflight record (what a SIGKILL
/// between a pop and its put leaves): `iopath blk serve` must run the
/// recorded heads again, against the image, and signal the driver
/// although its `used_event` (EVENT_IDX) asks for nothing.
#[test]
fn restarted_serve_resubmits_the_recorded_heads_and_signals_the_driver() {
    use frontend::{
        pattern, Client, OutHeader, EVENT_IDX, F_NEXT, F_WRITE, HEADER_LEN, QUEUE_SIZE, SECTOR,
        S_OK, T_IN, T_OUT, VERSION_1,
    };
    use std::os::unix::fs::FileExt;
    use vhost::vhost_user::message::{VhostUserInflight, VhostUserProtocolFeatures};
    use vhost::vhost_user::VhostUserFrontend;
    use vm_memory::{Bytes, GuestAddress};

    const LEN: u32 = 4096;
    let inflight = VhostUserProtocolFeatures::INFLIGHT_SHMFD;
    let mut srv = Server::start(1 << 20, &[]);
    let mut c = Client::negotiate_with(&srv.socket, VERSION_1 | EVENT_IDX, inflight);
    assert_ne!(c.features & EVENT_IDX, 0);
    let (msg, record) =
        c.fe.get_inflight_fd(&VhostUserInflight::new(0, 0, 1, QUEUE_SIZE))
            .unwrap();
    c.setup_queues(1);

    // The first back end serves head 0: a write of `a` to sector 0.
    let a = pattern(0, LEN as usize, 0xa);
    assert_eq!(c.write(0, 0, &a), S_OK);
    let field = |at: u64, n: usize| {
        let mut b = vec![0u8; n];
        record.read_exact_at(&mut b, at).unwrap();
        b
    };
    assert_eq!(field(14, 2), [1, 0], "the record's used index");
    while c.queues[0].call.read().is_ok() {}

    // Killed after popping heads 20 (a read of sector 0) and 10 (a write
    // of `b` to sector 16), in that order: the record marks both (pop
    // writes the counter, then the flag), the used ring still holds 1.
    srv.kill();
    let b = pattern(16 * SECTOR, LEN as usize, 0xb);
    let (header_at, data_at, status_at) = (0x20_0000u64, 0x21_0000u64, 0x23_0000u64);
    let chain = |head: u16, kind: u32, sector: u64, flags: u16| {
        let h = header_at + u64::from(head) * HEADER_LEN as u64;
        c.mem
            .write_obj(OutHeader::new(kind, sector), GuestAddress(h))
            .unwrap();
        let data = data_at + u64::from(head) * u64::from(LEN);
        let status = status_at + u64::from(head);
        c.mem.write_obj(0xffu8, GuestAddress(status)).unwrap();
        c.set_desc(0, head, c.dev(h), HEADER_LEN as u32, F_NEXT, head + 1);
        c.set_desc(0, head + 1, c.dev(data), LEN, flags | F_NEXT, head + 2);
        c.set_desc(0, head + 2, c.dev(status), 1, F_WRITE, 0);
        data
    };
    let read_at = chain(20, T_IN, 0, F_WRITE);
    c.fill(read_at, LEN as usize, 0xee);
    let write_at = chain(10, T_OUT, 16, 0);
    c.mem.write_slice(&b, GuestAddress(write_at)).unwrap();
    let avail = c.queues[0].avail;
    for (slot, head) in [(1u64, 20u16), (2, 10)] {
        c.mem
            .write_obj(head, GuestAddress(avail + 4 + 2 * slot))
            .unwrap();
    }
    c.mem.write_obj(3u16, GuestAddress(avail + 2)).unwrap();
    // used_event: "signal me when entry 0 is used", long behind.
    let used_event = avail + 4 + 2 * u64::from(QUEUE_SIZE);
    c.mem.write_obj(0u16, GuestAddress(used_event)).unwrap();
    for (head, counter) in [(20u64, 1u64), (10, 2)] {
        let at = RECORD_HEADER + head * RECORD_DESC;
        record.write_all_at(&counter.to_le_bytes(), at + 8).unwrap();
        record.write_all_at(&[1], at).unwrap();
    }
    c.queues[0].avail_idx = 3;

    srv.restart(&[]);
    c.reconnect(&srv.socket, inflight, Some((&msg, &record)));
    // Both heads come back on the used ring (in the order their I/O ends).
    let used = c.queues[0].used;
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.mem.read_obj::<u16>(GuestAddress(used + 2)).unwrap() != 3 {
        assert!(
            Instant::now() < deadline,
            "the recorded heads never came back"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let entry = |i: u64| {
        let at = used + 4 + 8 * i;
        let id: u32 = c.mem.read_obj(GuestAddress(at)).unwrap();
        let len: u32 = c.mem.read_obj(GuestAddress(at + 4)).unwrap();
        (id, len)
    };
    let mut back = [entry(1), entry(2)];
    back.sort_unstable();
    assert_eq!(back, [(10, 1), (20, LEN + 1)]);
    assert_eq!(entry(0).0, 0, "the first back end's entry was kept");
    assert_eq!(c.status(status_at + 10), S_OK);
    assert_eq!(c.status(status_at + 20), S_OK);
    assert!(c.bytes(read_at, LEN as usize) == a, "the resubmitted read");
    assert!(
        srv.image_bytes(16 * SECTOR, LEN as usize) == b,
        "the resubmitted write"
    );
    // Two signals: one when the queue restarted, one once the heads were
    // used (whatever used_event said).
    let mut signals = 0;
    while signals < 2 && Instant::now() < deadline {
        if let Ok(n) = c.queues[0].call.read() {
            signals += n;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(signals, 2, "call eventfd signals after the restart");
    for head in [10, 20] {
        assert_eq!(
            field(RECORD_HEADER + head * RECORD_DESC, 1),
            [0],
            "head {head}"
        );
    }
    assert_eq!(field(14, 2), [3, 0], "the record's used index");

    // And the queue goes on from there.
    c.queues[0].used_seen = 3;
    let (st, got) = c.read(0, 16, LEN);
    assert_eq!(st, S_OK);
    assert!(got == b);
    srv.kill();
}
