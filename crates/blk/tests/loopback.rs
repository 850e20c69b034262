//! The driver over the in-process loopback transport with a RAM-disk
//! virtio-blk device (a test device, below the real-peer tests): every DMA
//! mode, IOMMU included (the loopback enforces the IOTLB), and limits the
//! real peers do not have (small `size_max`/`seg_max`, a small bounce
//! window) so the splitting is exercised; device errors become exact driver
//! errors.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::{alloc, driver, seq, Mode, MODES};
use iopath_blk::config as c;
use iopath_blk::wire::{
    OutHeader, RangeSegment, HEADER_LEN, RANGE_LEN, VIRTIO_BLK_S_IOERR as S_IOERR,
    VIRTIO_BLK_S_OK as S_OK, VIRTIO_BLK_S_UNSUPP as S_UNSUPP, VIRTIO_BLK_T_DISCARD as T_DISCARD,
    VIRTIO_BLK_T_FLUSH as T_FLUSH, VIRTIO_BLK_T_GET_ID as T_GET_ID, VIRTIO_BLK_T_IN as T_IN,
    VIRTIO_BLK_T_OUT as T_OUT, VIRTIO_BLK_T_WRITE_ZEROES as T_WRITE_ZEROES,
};
use iopath_blk::{BlkError, Command, DriverOptions};
use iopath_virtio::features as vf;
use iopath_virtio::transport::loopback::{Loopback, LoopbackDevice};
use iopath_virtio::{BounceGeometry, Choice, Platform, Policy, Transport};
use vm_memory::ByteValued;

const DISK: usize = 8 << 20;
const SIZE_MAX: u32 = 64 << 10;
const SEG_MAX: u32 = 4;

/// A RAM disk speaking virtio-blk; records the largest data transfer of
/// one request, and fails requests touching `bad_sector`.
#[derive(Clone)]
struct RamDisk {
    disk: Arc<Mutex<Vec<u8>>>,
    largest: Arc<AtomicUsize>,
    bad_sector: Option<u64>,
    status_override: Option<u8>,
}

impl RamDisk {
    fn new() -> Self {
        RamDisk {
            disk: Arc::new(Mutex::new(vec![0; DISK])),
            largest: Arc::new(AtomicUsize::new(0)),
            bad_sector: None,
            status_override: None,
        }
    }
}

impl LoopbackDevice for RamDisk {
    fn device_id(&self) -> u32 {
        2
    }
    fn features(&self) -> u64 {
        vf::VIRTIO_F_VERSION_1
            | c::VIRTIO_BLK_F_SIZE_MAX
            | c::VIRTIO_BLK_F_SEG_MAX
            | c::VIRTIO_BLK_F_FLUSH
            | c::VIRTIO_BLK_F_MQ
            | c::VIRTIO_BLK_F_DISCARD
            | c::VIRTIO_BLK_F_WRITE_ZEROES
            | vf::VIRTIO_F_EVENT_IDX
            | vf::VIRTIO_F_INDIRECT_DESC
            | vf::VIRTIO_F_ACCESS_PLATFORM
    }
    fn num_queues(&self) -> u16 {
        2
    }
    fn config(&self) -> Vec<u8> {
        c::BlkConfig {
            capacity: (DISK / 512) as u64,
            size_max: SIZE_MAX,
            seg_max: SEG_MAX,
            num_queues: 2,
            // discard and write-zeroes: 1024 sectors per segment, 1 segment.
            max_discard_sectors: 1024,
            max_discard_seg: 1,
            discard_sector_alignment: 1,
            max_write_zeroes_sectors: 1024,
            max_write_zeroes_seg: 1,
            ..c::BlkConfig::default()
        }
        .to_bytes()
        .to_vec()
    }
    fn handle(&mut self, _q: u16, req: &[u8], resp: &mut [u8]) -> usize {
        let Some((status, body)) = resp.split_last_mut() else {
            return 0;
        };
        if req.len() < HEADER_LEN {
            *status = S_IOERR;
            return 1;
        }
        let mut header = OutHeader::default();
        header.as_mut_slice().copy_from_slice(&req[..HEADER_LEN]);
        let (kind, sector) = (header.kind(), header.sector());
        let mut disk = self.disk.lock().unwrap();
        let in_range = |s: u64, len: usize| (s as usize) * 512 + len <= DISK;
        let hits_bad = |s: u64, len: usize| {
            self.bad_sector
                .is_some_and(|b| b >= s && b < s + (len as u64).div_ceil(512).max(1))
        };
        let (st, written) = match kind {
            T_IN => {
                let len = body.len();
                self.largest.fetch_max(len, Ordering::Relaxed);
                if !in_range(sector, len) || hits_bad(sector, len) {
                    (S_IOERR, 0)
                } else {
                    let at = sector as usize * 512;
                    body.copy_from_slice(&disk[at..at + len]);
                    (S_OK, len)
                }
            }
            T_OUT => {
                let data = &req[HEADER_LEN..];
                self.largest.fetch_max(data.len(), Ordering::Relaxed);
                if !in_range(sector, data.len()) || hits_bad(sector, data.len()) {
                    (S_IOERR, 0)
                } else {
                    let at = sector as usize * 512;
                    disk[at..at + data.len()].copy_from_slice(data);
                    (S_OK, 0)
                }
            }
            T_FLUSH => (S_OK, 0),
            T_DISCARD | T_WRITE_ZEROES => {
                let mut st = S_OK;
                for bytes in req[HEADER_LEN..].chunks_exact(RANGE_LEN) {
                    let mut seg = RangeSegment::default();
                    seg.as_mut_slice().copy_from_slice(bytes);
                    let (s, n) = (seg.sector(), seg.num_sectors() as usize);
                    if n > 1024 || !in_range(s, n * 512) {
                        st = S_IOERR;
                        break;
                    }
                    disk[s as usize * 512..(s as usize + n) * 512].fill(0);
                }
                (st, 0)
            }
            T_GET_ID => {
                let id = b"iopath-ramdisk";
                let n = id.len().min(body.len());
                body[..n].copy_from_slice(&id[..n]);
                (S_OK, body.len())
            }
            _ => (S_UNSUPP, 0),
        };
        *status = self.status_override.unwrap_or(st);
        written + 1
    }
}

fn setup(mode: Mode, dev: RamDisk, bufs: &[iopath_heap::Buffer]) -> common::AnyDriver {
    let t: Arc<dyn Transport> = Arc::new(Loopback::new(dev).unwrap());
    let opts = DriverOptions {
        queues: 2,
        ..DriverOptions::default()
    };
    driver(mode, t, bufs, &opts).unwrap()
}

#[test]
fn every_mode_splits_by_device_limits_and_round_trips() {
    for mode in MODES {
        let dev = RamDisk::new();
        let len = 3 << 20; // 3 MiB: 12 requests of 256 KiB (4 x 64 KiB)
        let (src, dst) = (alloc(len), alloc(len));
        src.write_at(0, &seq(4096, len)).unwrap();
        dst.fill(0, len, 0xee).unwrap();
        let mut drv = setup(mode, dev.clone(), &[src.clone(), dst.clone()]);
        assert_eq!(drv.num_queues(), 2);
        drv.write(4096, &src, 0, len).unwrap();
        assert!(
            dev.largest.load(Ordering::Relaxed) <= (SIZE_MAX * SEG_MAX) as usize,
            "{mode:?}: a request carried more than size_max x seg_max"
        );
        assert_eq!(
            &dev.disk.lock().unwrap()[4096..4096 + len],
            &seq(4096, len)[..],
            "{mode:?}: device bytes"
        );
        drv.read(4096, &dst, 0, len).unwrap();
        let mut got = vec![0; len];
        dst.read_at(0, &mut got).unwrap();
        assert!(got == seq(4096, len), "{mode:?}: bytes read back");
        assert_eq!(drv.live_mappings(), 0, "{mode:?}: mappings leaked");
    }
}

#[test]
fn discard_write_zeroes_flush_and_get_id() {
    let dev = RamDisk::new();
    dev.disk.lock().unwrap().fill(0xab);
    let t: Arc<dyn Transport> = Arc::new(Loopback::new(dev.clone()).unwrap());
    let mut drv = iopath_blk::BlkDriver::<iopath_dma::Direct>::new(
        t,
        &Policy::new(Platform::Direct),
        &DriverOptions::default(),
        &[],
    )
    .unwrap();
    // 2 MiB of write-zeroes is 4 requests of 1024 sectors.
    drv.write_zeroes(1 << 20, 2 << 20, false).unwrap();
    drv.discard(4 << 20, 512 << 10).unwrap();
    drv.flush().unwrap();
    assert_eq!(drv.get_id().unwrap(), b"iopath-ramdisk");
    let d = dev.disk.lock().unwrap();
    assert!(d[..1 << 20].iter().all(|&b| b == 0xab));
    assert!(d[1 << 20..3 << 20].iter().all(|&b| b == 0));
    assert!(d[3 << 20..4 << 20].iter().all(|&b| b == 0xab));
    assert!(d[4 << 20..(4 << 20) + (512 << 10)].iter().all(|&b| b == 0));
    assert!(d[(4 << 20) + (512 << 10)..].iter().all(|&b| b == 0xab));
}

#[test]
fn device_errors_and_bad_arguments_are_exact() {
    let mut dev = RamDisk::new();
    dev.bad_sector = Some(300);
    let buf = alloc(1 << 20);
    let mut drv = setup(Mode::Direct, dev, std::slice::from_ref(&buf));
    // The failing piece is the 256 KiB request starting at sector 0... of
    // the transfer: sectors 0..512 contain 300.
    match drv.write(0, &buf, 0, 1 << 20) {
        Err(BlkError::IoError { sector }) => assert_eq!(sector, 0),
        other => panic!("expected IoError, got {other:?}"),
    }
    // The rest of the device still works.
    drv.write(1 << 20, &buf, 0, 1 << 20).unwrap();
    assert!(matches!(
        drv.write(511, &buf, 0, 4096),
        Err(BlkError::Unaligned { offset: 511, .. })
    ));
    assert!(matches!(
        drv.write((DISK - 4096) as u64, &buf, 0, 8192),
        Err(BlkError::OutOfRange { .. })
    ));
    assert!(matches!(
        drv.submit(
            0,
            Command::Write {
                offset: 0,
                buf: &buf,
                buf_offset: 0,
                len: 0
            },
            1
        ),
        Err(BlkError::Empty)
    ));
    assert_eq!(drv.live_mappings(), 0);

    let mut dev = RamDisk::new();
    dev.status_override = Some(0x7f);
    let mut drv = setup(Mode::Bounce, dev, std::slice::from_ref(&buf));
    assert!(matches!(
        drv.read(0, &buf, 0, 4096),
        Err(BlkError::BadStatus {
            status: 0x7f,
            kind: 0
        })
    ));
}

#[test]
fn queues_in_threads_share_a_small_bounce_window() {
    // A 1 MiB window, two queues each keeping two 512 KiB writes in
    // flight: together they want twice the window, so a queue with nothing
    // in flight must wait for the other's slots rather than fail.
    let dev = RamDisk::new();
    let t: Arc<dyn Transport> = Arc::new(Loopback::new(dev.clone()).unwrap());
    let policy = Policy::new(Platform::Direct)
        .with_override(Some(Choice::Bounce))
        .with_bounce(BounceGeometry {
            window: 1 << 20,
            slot: 4096,
        });
    let opts = DriverOptions {
        queues: 2,
        ..DriverOptions::default()
    };
    let mut drv =
        iopath_blk::BlkDriver::<dyn iopath_dma::DmaOps>::new(t, &policy, &opts, &[]).unwrap();
    assert_eq!(drv.ops().name(), "bounce");
    let bs = 512 << 10;
    std::thread::scope(|s| {
        for (qi, q) in drv.queues_mut().iter_mut().enumerate() {
            s.spawn(move || {
                let bufs = [alloc(bs), alloc(bs)];
                for round in 0..4u64 {
                    for (k, b) in bufs.iter().enumerate() {
                        let off = ((qi as u64 * 8) + round * 2 + k as u64) * bs as u64;
                        b.write_at(0, &seq(off, bs)).unwrap();
                        q.submit(
                            Command::Write {
                                offset: off,
                                buf: b,
                                buf_offset: 0,
                                len: bs,
                            },
                            k as u64,
                        )
                        .unwrap();
                    }
                    for _ in 0..2 {
                        q.complete().unwrap().result.unwrap();
                    }
                }
            });
        }
    });
    let d = dev.disk.lock().unwrap();
    assert!(d[..8 << 20] == seq(0, 8 << 20)[..]);
}
