//! Faults with real processes and real files (issue 12): `iopath blk
//! serve` killed with SIGKILL in the middle of a stream of writes and
//! started again on the same image and socket; an image on a file system
//! that fills up.

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
    /// mount in this container): skipped, or a failure when peers are
    /// required (CI).
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
                let why = format!("cannot mount a tmpfs (needs root): {other:?}");
                assert!(!iopath_testkit::peers_required(), "{why}");
                println!("skipped: {why}");
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
