//! Shared helpers of the driver's end-to-end tests: real back ends on unix
//! sockets, images, and DMA ops per mode.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{self, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iopath_blk::{BlkDriver, Command, DriverOptions};
use iopath_dma::{Direct, DmaOps};
use iopath_heap::{Buffer, Heap, HugePages, MemfdHeap};
use iopath_sys::process::Supervised;
use iopath_virtio::transport::vhost_user::VhostUser;
use iopath_virtio::{Choice, Platform, Policy, Transport};

/// A back-end process serving an image on a socket; killed on drop.
pub struct Peer {
    child: Supervised,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub image: PathBuf,
}

impl Peer {
    /// Waits until the socket exists (or the process died).
    fn wait_ready(mut self) -> Self {
        let socket = self.socket.clone();
        let limit = Duration::from_secs(20);
        self.child
            .wait_for("its socket", limit, || socket.exists())
            .unwrap();
        self
    }

    /// Sends `sig` to the back end.
    pub fn signal(&self, sig: rustix::process::Signal) {
        self.child.signal(sig).unwrap();
    }

    /// Stops the back end ([`stop`]).
    pub fn stop(&self) {
        stop(rustix::process::Pid::from_raw(self.child.id() as i32).unwrap());
    }

    /// SIGKILL the back end and reap it.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// The image's bytes as the host sees them.
    pub fn image_bytes(&self) -> Vec<u8> {
        std::fs::read(&self.image).unwrap()
    }
}

fn image(dir: &Path, len: u64) -> PathBuf {
    let image = dir.join("disk.img");
    let f = std::fs::File::create(&image).unwrap();
    f.set_len(len).unwrap();
    image
}

/// `qemu-storage-daemon` exporting a fresh image of `len` bytes with
/// `queues` queues, or `None` (test skipped) when it is not installed.
pub fn qsd(len: u64, queues: u16) -> Option<Peer> {
    if !iopath_testkit::have_peer("qemu-storage-daemon", "qemu-utils") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path(), len);
    let socket = dir.path().join("vhost.sock");
    let mut cmd = process::Command::new("qemu-storage-daemon");
    cmd
        .arg("--blockdev")
        .arg(format!(
            "driver=file,node-name=disk,filename={},cache.direct=on",
            image.display()
        ))
        .arg("--export")
        .arg(format!(
            "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path={},writable=on,num-queues={queues}",
            socket.display()
        ))
        .stdout(Stdio::null());
    let child = Supervised::spawn("qemu-storage-daemon", &mut cmd);
    Some(
        Peer {
            child: child.unwrap(),
            dir,
            socket,
            image,
        }
        .wait_ready(),
    )
}

/// Connects a vhost-user-blk front end.
pub fn connect(socket: &Path) -> Arc<dyn Transport> {
    Arc::new(VhostUser::connect(socket, 2, Duration::from_secs(10)).unwrap())
}

/// The DMA modes of the experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Direct,
    DirectStatic,
    Iommu,
    Bounce,
}

pub const MODES: [Mode; 4] = [Mode::Direct, Mode::DirectStatic, Mode::Iommu, Mode::Bounce];

pub fn alloc(len: usize) -> Buffer {
    MemfdHeap::new(HugePages::None).alloc(len).unwrap()
}

/// `seq` pattern: each 8-byte little-endian word holds its device offset.
pub fn seq(dev_off: u64, len: usize) -> Vec<u8> {
    (0..len / 8)
        .flat_map(|i| (dev_off + 8 * i as u64).to_le_bytes())
        .collect()
}

/// A driver in `mode` with its data buffers registered (dyn dispatch
/// except `DirectStatic`, which is returned separately by [`with_driver`]).
pub enum AnyDriver {
    Dyn(BlkDriver<dyn DmaOps>),
    Static(BlkDriver<Direct>),
}

impl AnyDriver {
    pub fn submit(
        &mut self,
        q: usize,
        req: Command<'_>,
        tag: u64,
    ) -> iopath_blk::driver::Result<()> {
        match self {
            AnyDriver::Dyn(d) => d.queue(q)?.submit(req, tag),
            AnyDriver::Static(d) => d.queue(q)?.submit(req, tag),
        }
    }
    pub fn complete(&mut self, q: usize) -> iopath_blk::driver::Result<iopath_blk::Done> {
        match self {
            AnyDriver::Dyn(d) => d.queue(q)?.complete(),
            AnyDriver::Static(d) => d.queue(q)?.complete(),
        }
    }
    pub fn num_queues(&self) -> usize {
        match self {
            AnyDriver::Dyn(d) => d.num_queues(),
            AnyDriver::Static(d) => d.num_queues(),
        }
    }
    pub fn flush(&mut self) -> iopath_blk::driver::Result<()> {
        match self {
            AnyDriver::Dyn(d) => d.flush(),
            AnyDriver::Static(d) => d.flush(),
        }
    }
    pub fn read(
        &mut self,
        off: u64,
        b: &Buffer,
        bo: usize,
        len: usize,
    ) -> iopath_blk::driver::Result<()> {
        match self {
            AnyDriver::Dyn(d) => d.read(off, b, bo, len),
            AnyDriver::Static(d) => d.read(off, b, bo, len),
        }
    }
    pub fn write(
        &mut self,
        off: u64,
        b: &Buffer,
        bo: usize,
        len: usize,
    ) -> iopath_blk::driver::Result<()> {
        match self {
            AnyDriver::Dyn(d) => d.write(off, b, bo, len),
            AnyDriver::Static(d) => d.write(off, b, bo, len),
        }
    }
    pub fn live_mappings(&self) -> usize {
        match self {
            AnyDriver::Dyn(d) => d.ops().live_mappings(),
            AnyDriver::Static(d) => d.ops().live_mappings(),
        }
    }
}

impl Mode {
    /// The policy that gives this mode's ops: the experiment's override on
    /// a direct platform, with the default bounce geometry.
    pub fn policy(self) -> Policy {
        let choice = match self {
            Mode::Direct | Mode::DirectStatic => Choice::Direct,
            Mode::Iommu => Choice::Iommu,
            Mode::Bounce => Choice::Bounce,
        };
        Policy::new(Platform::Direct).with_override(Some(choice))
    }
}

/// Builds the driver for `mode` over `transport` through the platform
/// policy, registering `bufs` with the ops (bounce ignores registration:
/// only its window is shared).
pub fn driver(
    mode: Mode,
    transport: Arc<dyn Transport>,
    bufs: &[Buffer],
    opts: &DriverOptions,
) -> iopath_blk::driver::Result<AnyDriver> {
    let policy = mode.policy();
    if mode == Mode::DirectStatic {
        BlkDriver::<Direct>::new(transport, &policy, opts, bufs).map(AnyDriver::Static)
    } else {
        BlkDriver::<dyn DmaOps>::new(transport, &policy, opts, bufs).map(AnyDriver::Dyn)
    }
}

/// Writes `total` bytes from `dev_off` in `bs` blocks with `depth` in flight
/// over every queue, `pattern` 0 = zeros (after an 0xa5 fill), 1 = seq.
///
/// The back end listens on `socket` and serves `image` (of `image_len`
/// bytes, zero before the test); afterwards the image file must hold the
/// data and nothing else.
pub fn write_read_verify(
    socket: &Path,
    image: &Path,
    image_len: u64,
    mode: Mode,
    pattern: u8,
    queues: u16,
) {
    let (bs, depth, dev_off, total) = (1usize << 20, 4usize, 1u64 << 20, 12usize << 20);
    let bufs: Vec<_> = (0..depth).map(|_| alloc(bs)).collect();
    let opts = DriverOptions {
        queues,
        ..DriverOptions::default()
    };
    // Pre-fill the range with 0xa5 so a zero pattern that never arrives
    // shows; read back into a buffer that starts dirty.
    let fill = alloc(total);
    fill.fill(0, total, 0xa5).unwrap();
    let back = alloc(total);
    back.fill(0, total, 0x5a).unwrap();
    let all = [bufs.clone(), vec![fill.clone(), back.clone()]].concat();
    let mut drv = driver(mode, connect(socket), &all, &opts).unwrap();
    assert_eq!(drv.num_queues(), usize::from(queues));
    drv.write(dev_off, &fill, 0, total).unwrap();

    let expect = |i: usize| -> Vec<u8> {
        if pattern == 1 {
            seq(dev_off + (i * bs) as u64, bs)
        } else {
            vec![0u8; bs]
        }
    };
    // Submit every block, keeping `depth` in flight, spread over the queues.
    let blocks = total / bs;
    let mut next = 0;
    let mut in_flight = vec![None::<usize>; depth];
    let mut done = 0;
    while done < blocks {
        for (slot, busy) in in_flight.iter_mut().enumerate() {
            if busy.is_none() && next < blocks {
                bufs[slot].write_at(0, &expect(next)).unwrap();
                let q = next % drv.num_queues();
                drv.submit(
                    q,
                    Command::Write {
                        offset: dev_off + (next * bs) as u64,
                        buf: &bufs[slot],
                        buf_offset: 0,
                        len: bs,
                    },
                    slot as u64,
                )
                .unwrap();
                *busy = Some(q);
                next += 1;
            }
        }
        // Complete one request on the queue of the oldest busy slot.
        let q = in_flight.iter().flatten().next().copied().unwrap();
        let d = drv.complete(q).unwrap();
        d.result.unwrap();
        in_flight[d.tag as usize] = None;
        done += 1;
    }
    drv.flush().unwrap();
    assert_eq!(drv.live_mappings(), 0, "every mapping is gone");

    // Read back through the driver.
    drv.read(dev_off, &back, 0, total).unwrap();
    let mut got = vec![0u8; total];
    back.read_at(0, &mut got).unwrap();
    for i in 0..blocks {
        assert!(
            got[i * bs..(i + 1) * bs] == expect(i)[..],
            "{mode:?}: block {i} read back wrong"
        );
    }
    drop(drv);

    // The host's view of the image: untouched before, the data, untouched after.
    let img = std::fs::read(image).unwrap();
    assert_eq!(img.len() as u64, image_len);
    assert!(
        img[..dev_off as usize].iter().all(|&b| b == 0),
        "{mode:?}: bytes before the range changed"
    );
    for i in 0..blocks {
        let at = dev_off as usize + i * bs;
        assert!(
            img[at..at + bs] == expect(i)[..],
            "{mode:?}: block {i} wrong in the image file"
        );
    }
    assert!(
        img[dev_off as usize + total..].iter().all(|&b| b == 0),
        "{mode:?}: bytes after the range changed"
    );
}

/// Sends SIGSTOP to `pid` and waits until every thread of it has stopped
/// (`/proc/PID/task/*/stat` says `T`): `kill` returns once the signal is
/// queued, and a thread polling on another CPU runs on until it takes it,
/// long enough to serve a request.
pub fn stop(pid: rustix::process::Pid) {
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    let tasks = format!("/proc/{}/task", pid.as_raw_nonzero());
    let deadline = Instant::now() + Duration::from_secs(10);
    // The state is the field after the command name's closing parenthesis.
    let stopped = |stat: String| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with(['T', 't']))
    };
    loop {
        let all = std::fs::read_dir(&tasks)
            .unwrap()
            .filter_map(Result::ok)
            .all(|t| std::fs::read_to_string(t.path().join("stat")).is_ok_and(stopped));
        if all {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{tasks}: not all stopped after 10 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
