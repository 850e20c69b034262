//! A hostile front end with VIRTIO_F_ACCESS_PLATFORM against a real
//! `iopath blk serve`: every address is an IOVA that goes through the
//! IOTLB the front end fills, and a request reaching past what it mapped,
//! or with an access the mapping does not allow, fails alone (IOERR) while
//! memory outside the mappings is never touched.

mod frontend;

use frontend::*;
use iopath_virtio::device::{IotlbMsg, Perm};

fn map(c: &Client, gpa: u64, size: u64, perm: Perm) {
    let m = IotlbMsg::Update {
        iova: IOVA + gpa,
        size,
        uaddr: UADDR + gpa,
        perm,
    };
    assert_eq!(send_iotlb(&c.fe, &m), 0, "IOTLB update refused");
}

#[test]
fn iommu_mode_translates_through_the_iotlb_and_enforces_it() {
    translates_and_enforces(Server::start(4 << 20, &[]));
}

/// The same with the image in RAM, where the back end copies small
/// requests itself (through the same translations) instead of io_uring.
#[test]
fn iommu_mode_translates_and_enforces_on_an_image_in_ram() {
    if let Some(srv) = Server::start_in_ram(4 << 20, &[]) {
        translates_and_enforces(srv);
    }
}

fn translates_and_enforces(mut srv: Server) {
    let mut c = Client::negotiate(&srv.socket, VERSION_1 | ACCESS_PLATFORM | BLK_F_FLUSH);
    assert_ne!(
        c.features & ACCESS_PLATFORM,
        0,
        "ACCESS_PLATFORM not offered"
    );
    // Rings and the first 3 MiB of data: RW. 0x40_0000..+64K: the device
    // may only read. 0x50_0000..: never mapped.
    map(&c, 0, 0x40_0000, Perm::ReadWrite);
    map(&c, 0x40_0000, 0x1_0000, Perm::ReadOnly);
    map(&c, 0x41_0000, 0x1_0000, Perm::WriteOnly);
    c.setup_queues(1);

    // Through IOVAs, both directions, checked in memory and in the image.
    let data = pattern(256 * SECTOR, 64 << 10, 9);
    assert_eq!(c.write(0, 256, &data), S_OK);
    assert_eq!(c.flush(0), S_OK);
    let (st, back) = c.read(0, 256, 64 << 10);
    assert_eq!(st, S_OK);
    assert!(back == data);
    assert!(srv.image_bytes(256 * SECTOR, 64 << 10) == data);

    let expect_ioerr = |c: &mut Client, kind: u32, data_gpa: u64, fill: u8, what: &str| {
        c.reset_alloc();
        let h = c.header(kind, 256);
        let st = c.status_slot();
        c.fill(data_gpa, 4096, fill);
        let flags = if kind == T_IN { F_WRITE } else { 0 };
        c.run_chain_dev(
            0,
            &[
                (c.dev(h), 16, 0),
                (c.dev(data_gpa), 4096, flags),
                (c.dev(st), 1, F_WRITE),
            ],
            &[],
        );
        assert_eq!(c.status(st), S_IOERR, "{what}");
        assert_eq!(
            c.bytes(data_gpa, 4096),
            vec![fill; 4096],
            "{what}: memory touched"
        );
    };
    // Never mapped: reads must not land, writes must not be taken.
    expect_ioerr(&mut c, T_IN, 0x50_0000, 0x11, "read into unmapped IOVA");
    expect_ioerr(&mut c, T_OUT, 0x50_0000, 0x12, "write from unmapped IOVA");
    // Mapped read-only: the device may not write there.
    expect_ioerr(&mut c, T_IN, 0x40_0000, 0x13, "read into RO mapping");
    // Mapped write-only: the device may not read there.
    expect_ioerr(&mut c, T_OUT, 0x41_0000, 0x14, "write from WO mapping");
    // Straddling the end of the RW mapping into nothing.
    expect_ioerr(&mut c, T_IN, 0x50_0000 - 2048, 0x15, "read across the end");
    assert!(
        srv.image_bytes(256 * SECTOR, 64 << 10) == data,
        "image changed"
    );

    // A guest-physical address is not an IOVA.
    c.reset_alloc();
    let h = c.header(T_IN, 256);
    let st = c.status_slot();
    let d = c.alloc(4096, 0);
    c.run_chain_dev(
        0,
        &[
            (c.dev(h), 16, 0),
            (d, 4096, F_WRITE),
            (c.dev(st), 1, F_WRITE),
        ],
        &[],
    );
    assert_eq!(c.status(st), S_IOERR);

    // Invalidate the data area: the same request that worked now fails.
    let (st, _) = c.read(0, 256, 4096);
    assert_eq!(st, S_OK);
    let inv = IotlbMsg::Invalidate {
        iova: IOVA + DATA_BASE + 0x1000,
        size: 0x1000,
    };
    assert_eq!(send_iotlb(&c.fe, &inv), 0);
    c.reset_alloc();
    let h = c.header(T_IN, 256); // DATA_BASE
    let d = c.alloc(4096, 0); // DATA_BASE + 0x1000: invalidated
    c.fill(d, 4096, 0x16);
    let st = c.alloc(1, 0);
    c.run_chain_dev(
        0,
        &[
            (c.dev(h), 16, 0),
            (c.dev(d), 4096, F_WRITE),
            (c.dev(st), 1, F_WRITE),
        ],
        &[],
    );
    assert_eq!(c.status(st), S_IOERR);
    assert_eq!(c.bytes(d, 4096), vec![0x16; 4096]);

    // Malformed IOTLB updates are refused without ending the session.
    let mut bad = IotlbMsg::Update {
        iova: IOVA,
        size: 4096,
        uaddr: UADDR,
        perm: Perm::ReadWrite,
    }
    .to_wire();
    bad[24] = 7;
    let sock_reply = {
        use std::io::{Read, Write};
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: borrowed, never closed here (ManuallyDrop).
        let sock = std::mem::ManuallyDrop::new(unsafe {
            std::os::unix::net::UnixStream::from_raw_fd(c.fe.as_raw_fd())
        });
        let mut s: &std::os::unix::net::UnixStream = &sock;
        s.write_all(&message(22, 0x8, &bad)).unwrap();
        let mut reply = [0u8; 20];
        s.read_exact(&mut reply).unwrap();
        u64::from_le_bytes(reply[12..20].try_into().unwrap())
    };
    assert_ne!(sock_reply, 0, "bad permission accepted");
    // Map the invalidated page again: requests through it work again.
    map(&c, DATA_BASE + 0x1000, 0x1000, Perm::ReadWrite);
    let (st, back) = c.read(0, 256, 64 << 10);
    assert_eq!(st, S_OK);
    assert!(back == data);

    // Unmapping the rings stops the queue cold; the server stays up.
    let inv = IotlbMsg::Invalidate {
        iova: IOVA,
        size: 0x4000,
    };
    assert_eq!(send_iotlb(&c.fe, &inv), 0);
    drop(c);
    still_serves(&mut srv);
}

/// A front end with a back-end channel answers IOTLB misses the way QEMU
/// with a virtual IOMMU does: one page per miss, sent as an update. Pages
/// it will not map stay misses, and those requests fail.
#[test]
fn iotlb_misses_are_reported_and_answered_pages_are_used() {
    misses_answered(Server::start(4 << 20, &[]));
}

#[test]
fn iotlb_misses_are_answered_on_an_image_in_ram() {
    if let Some(srv) = Server::start_in_ram(4 << 20, &[]) {
        misses_answered(srv);
    }
}

fn misses_answered(mut srv: Server) {
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use vhost::vhost_user::message::VhostUserProtocolFeatures as P;
    use vhost::vhost_user::VhostUserFrontend;

    let mut c = Client::negotiate_with(
        &srv.socket,
        VERSION_1 | ACCESS_PLATFORM | BLK_F_FLUSH,
        P::BACKEND_REQ,
    );
    let (ours, theirs) = UnixStream::pair().unwrap();
    c.fe.set_backend_request_fd(&theirs).unwrap();
    drop(theirs);
    // Rings mapped up front; data pages only on demand.
    map(&c, 0, DATA_BASE, Perm::ReadWrite);
    c.setup_queues(1);

    // The answering side: a thread owning the back-end channel and a second
    // handle on the main socket (the test thread is idle in wait_used while
    // misses are in flight, so the two never talk at once).
    // SAFETY: dup(2) of an fd we own, into a new owned UnixStream.
    let main = unsafe { UnixStream::from_raw_fd(libc::dup(c.fe.as_raw_fd())) };
    let stop = ours.try_clone().unwrap();
    let misses = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&misses);
    let allowed = (IOVA + DATA_BASE)..(IOVA + DATA_BASE + (2 << 20));
    let helper = std::thread::spawn(move || {
        let (mut chan, mut main) = (ours, main);
        loop {
            let mut hdr = [0u8; 12];
            if chan.read_exact(&mut hdr).is_err() {
                return;
            }
            let size = u32::from_le_bytes(hdr[8..12].try_into().unwrap()) as usize;
            let mut body = vec![0u8; size];
            chan.read_exact(&mut body).unwrap();
            assert_eq!(u32::from_le_bytes(hdr[0..4].try_into().unwrap()), 1);
            assert_eq!(body[25], 1, "not a miss");
            counted.fetch_add(1, Ordering::SeqCst);
            let iova = u64::from_le_bytes(body[0..8].try_into().unwrap());
            if allowed.contains(&iova) {
                let page = iova & !0xfff;
                let m = IotlbMsg::Update {
                    iova: page,
                    size: 0x1000,
                    uaddr: UADDR + (page - IOVA),
                    perm: Perm::ReadWrite,
                };
                main.write_all(&message(22, 0x8, &m.to_wire())).unwrap();
                let mut ack = [0u8; 20];
                main.read_exact(&mut ack).unwrap();
                assert_eq!(&ack[12..20], &[0u8; 8]);
            }
            if u32::from_le_bytes(hdr[4..8].try_into().unwrap()) & 0x8 != 0 {
                chan.write_all(&message(1, 0x4, &0u64.to_le_bytes()))
                    .unwrap();
            }
        }
    });

    let data = pattern(512 * SECTOR, 64 << 10, 3);
    assert_eq!(c.write(0, 512, &data), S_OK);
    let after_write = misses.load(Ordering::SeqCst);
    assert!(
        after_write >= 16,
        "only {after_write} misses for 64 KiB of new pages"
    );
    assert_eq!(c.flush(0), S_OK);
    let (st, back) = c.read(0, 512, 64 << 10);
    assert_eq!(st, S_OK);
    assert!(back == data);
    assert!(srv.image_bytes(512 * SECTOR, 64 << 10) == data);

    // Pages the "IOMMU" refuses: the miss goes unanswered, the request
    // fails, the memory there is untouched.
    c.reset_alloc();
    let h = c.header(T_IN, 512);
    let st = c.status_slot();
    let far = DATA_BASE + (3 << 20);
    c.fill(far, 4096, 0x5e);
    c.run_chain_dev(
        0,
        &[
            (c.dev(h), 16, 0),
            (c.dev(far), 4096, F_WRITE),
            (c.dev(st), 1, F_WRITE),
        ],
        &[],
    );
    assert_eq!(c.status(st), S_IOERR);
    assert_eq!(c.bytes(far, 4096), vec![0x5e; 4096]);
    assert!(misses.load(Ordering::SeqCst) > after_write);

    // End the helper (it holds a handle on the main socket too), then the
    // session.
    stop.shutdown(std::net::Shutdown::Both).unwrap();
    helper.join().unwrap();
    drop(c);
    still_serves(&mut srv);
}

/// A hostile IOMMU front end mixes bad requests with good ones in one
/// batch: reads into a read-only mapping, writes from unmapped IOVAs, and a
/// read straddling the end of a mapping each fail alone (IOERR) while the
/// good requests beside them complete with the right data; the canary
/// pages around the mappings are never touched, nor is the image where a
/// refused write aimed.
#[test]
fn hostile_iommu_requests_fail_alone_and_canaries_survive() {
    fail_alone(Server::start(4 << 20, &[]));
}

#[test]
fn hostile_iommu_requests_fail_alone_on_an_image_in_ram() {
    if let Some(srv) = Server::start_in_ram(4 << 20, &[]) {
        fail_alone(srv);
    }
}

fn fail_alone(mut srv: Server) {
    let mut c = Client::negotiate(&srv.socket, VERSION_1 | ACCESS_PLATFORM | BLK_F_FLUSH);
    assert_ne!(c.features & ACCESS_PLATFORM, 0);
    // Rings, headers and statuses: RW. A: 16 KiB RW. B: 4 KiB RO. The
    // pages around them (C0 before A, C1 after A, C2 after B) are canaries,
    // never mapped.
    const A: u64 = 0x60_0000;
    const C0: u64 = A - 0x1000;
    const C1: u64 = A + 0x4000;
    const B: u64 = 0x61_0000;
    const C2: u64 = B + 0x1000;
    map(&c, 0, 0x40_0000, Perm::ReadWrite);
    map(&c, A, 0x4000, Perm::ReadWrite);
    map(&c, B, 0x1000, Perm::ReadOnly);
    c.setup_queues(1);
    for canary in [C0, C1, C2] {
        c.fill(canary, 4096, 0xcc);
    }
    c.fill(A, 0x4000, 0xaa);
    c.fill(B, 0x1000, 0xbb);
    let good = pattern(100 * SECTOR, 4096, 5);
    assert_eq!(c.write(0, 100, &good), S_OK);
    let written = pattern(200 * SECTOR, 4096, 6);
    vm_memory::Bytes::write_slice(&c.mem, &written, vm_memory::GuestAddress(A + 0x1000)).unwrap();

    // (kind, sector, data IOVA, length, should succeed)
    let reqs: [(u32, u64, u64, u32, bool); 6] = [
        (T_IN, 100, A, 4096, true),              // good read into A
        (T_IN, 100, B, 4096, false),             // into a read-only mapping
        (T_OUT, 300, C1, 4096, false),           // from an unmapped IOVA
        (T_IN, 100, A + 0x3000, 8192, false),    // across A's end into C1
        (T_OUT, 200, A + 0x1000, 4096, true),    // good write from A
        (T_OUT, 301, C0 + 0x800, 0x1000, false), // from C0 into A
    ];
    c.reset_alloc();
    let mut heads = Vec::new();
    let mut statuses = Vec::new();
    for (i, &(kind, sector, data, len, _)) in reqs.iter().enumerate() {
        let h = c.header(kind, sector);
        let st = c.status_slot();
        let d0 = (3 * i) as u16;
        let data_flags = if kind == T_IN { F_WRITE } else { 0 };
        c.set_desc(0, d0, c.dev(h), HEADER_LEN as u32, F_NEXT, d0 + 1);
        c.set_desc(0, d0 + 1, IOVA + data, len, data_flags | F_NEXT, d0 + 2);
        c.set_desc(0, d0 + 2, c.dev(st), 1, F_WRITE, 0);
        heads.push(d0);
        statuses.push(st);
    }
    c.submit(0, &heads);
    let used = c.wait_used(0, reqs.len());
    let mut ids: Vec<u32> = used.iter().map(|u| u.0).collect();
    ids.sort_unstable();
    assert_eq!(ids, heads.iter().map(|&h| u32::from(h)).collect::<Vec<_>>());
    for (i, &(_, _, _, _, ok)) in reqs.iter().enumerate() {
        let want = if ok { S_OK } else { S_IOERR };
        assert_eq!(c.status(statuses[i]), want, "request {i}");
    }
    assert_eq!(c.flush(0), S_OK);

    assert!(c.bytes(A, 4096) == good, "the good read's data");
    assert_eq!(c.bytes(A + 0x3000, 0x1000), vec![0xaa; 0x1000], "A's tail");
    assert_eq!(c.bytes(B, 0x1000), vec![0xbb; 0x1000], "read-only page");
    for canary in [C0, C1, C2] {
        assert_eq!(
            c.bytes(canary, 4096),
            vec![0xcc; 4096],
            "canary {canary:#x}"
        );
    }
    assert!(
        srv.image_bytes(200 * SECTOR, 4096) == written,
        "the good write"
    );
    assert_eq!(
        srv.image_bytes(300 * SECTOR, 1024),
        vec![0; 1024],
        "refused writes"
    );
    drop(c);
    still_serves(&mut srv);
}
