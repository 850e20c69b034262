//! A hostile front end against a real `iopath blk serve`: broken chains,
//! addresses outside the shared memory or the IOTLB, malformed vhost-user
//! messages. Each gets IOERR/UNSUPP or a closed connection, memory outside
//! what was granted is never touched, and the next front end is served.

mod frontend;

use frontend::*;
use iopath_virtio::device::{IotlbMsg, Perm};

/// A normal front end still gets correct data from the server.
fn still_serves(srv: &mut Server) {
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

#[test]
fn hostile_chains_get_ioerr_and_touch_nothing() {
    let mut srv = Server::start(4 << 20, &[]);
    let mut c = Client::new(&srv.socket, VERSION_1 | INDIRECT_DESC, 1);
    let secret = pattern(0, 64 * 512, 5);
    assert_eq!(c.write(0, 0, &secret), S_OK);

    // Read into a buffer that runs off the end of the shared memory: IOERR,
    // and the part inside the memory is not written either.
    c.reset_alloc();
    let h = c.header(T_IN, 0);
    let st = c.status_slot();
    let edge = MEM_SIZE - 512;
    c.fill(edge, 512, 0xaa);
    let used = c.run_chain_dev(
        0,
        &[(h, 16, 0), (edge, 1024, F_WRITE), (st, 1, F_WRITE)],
        &[],
    );
    assert_eq!(c.status(st), S_IOERR);
    assert_eq!(used, 1);
    assert_eq!(c.bytes(edge, 512), vec![0xaa; 512]);

    // Entirely outside, and a length that wraps the address space.
    for (addr, len) in [(MEM_SIZE + 0x1000, 512u32), (u64::MAX - 100, 4096)] {
        c.reset_alloc();
        let h = c.header(T_IN, 0);
        let st = c.status_slot();
        c.run_chain_dev(
            0,
            &[(h, 16, 0), (addr, len, F_WRITE), (st, 1, F_WRITE)],
            &[],
        );
        assert_eq!(c.status(st), S_IOERR, "data at {addr:#x}+{len}");
    }
    // u32::MAX bytes inside the memory's start: past its end.
    c.reset_alloc();
    let h = c.header(T_IN, 0);
    let st = c.status_slot();
    let d = c.alloc(4096, 0);
    c.fill(d, 4096, 0xbb);
    c.run_chain_dev(
        0,
        &[(h, 16, 0), (d, u32::MAX - 511, F_WRITE), (st, 1, F_WRITE)],
        &[],
    );
    assert_eq!(c.status(st), S_IOERR);
    assert_eq!(c.bytes(d, 4096), vec![0xbb; 4096]);

    // A header outside memory.
    c.reset_alloc();
    let st = c.status_slot();
    c.run_chain_dev(0, &[(MEM_SIZE, 16, 0), (st, 1, F_WRITE)], &[]);
    assert_eq!(c.status(st), S_IOERR);

    // A chain that loops: the status descriptor links back to the header.
    c.reset_alloc();
    let h = c.header(T_OUT, 8);
    let d = c.alloc(512, 0);
    c.fill(d, 512, 0xcc);
    let st = c.status_slot();
    c.run_chain_dev(0, &[(h, 16, 0), (d, 512, 0), (st, 1, F_WRITE)], &[(2, 0)]);
    assert_eq!(c.status(st), S_IOERR);
    // A next index past the table: refused, nothing written to the image.
    c.reset_alloc();
    let h = c.header(T_OUT, 8);
    let st = c.status_slot();
    c.run_chain_dev(
        0,
        &[(h, 16, 0), (d, 512, 0), (st, 1, F_WRITE)],
        &[(1, 5000)],
    );
    assert_ne!(c.status(st), S_OK);
    // An indirect table outside memory, and one that is misaligned.
    c.reset_alloc();
    c.run_chain_dev(0, &[(MEM_SIZE + 4096, 48, F_INDIRECT)], &[]);
    c.run_chain_dev(0, &[(DATA_BASE, 47, F_INDIRECT)], &[]);

    // Sector ranges, lengths and types.
    c.reset_alloc();
    assert_eq!(c.read(0, (4 << 20) / SECTOR, 512).0, S_IOERR);
    assert_eq!(c.read(0, u64::MAX, 512).0, S_IOERR);
    assert_eq!(c.request(0, T_IN, 0, None, 100, 0).0, S_IOERR);
    assert_eq!(c.request(0, 77, 0, None, 512, 0).0, S_UNSUPP);
    // The image is what the honest write put there.
    let (st, back) = c.read(0, 0, 64 * 512);
    assert_eq!(st, S_OK);
    assert!(back == secret);

    // An avail entry naming a descriptor past the queue: no crash.
    c.submit(0, &[5000]);
    std::thread::sleep(std::time::Duration::from_millis(100));
    drop(c);
    still_serves(&mut srv);
}

#[test]
fn malformed_messages_close_the_connection() {
    let mut srv = Server::start(1 << 20, &[]);
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("unknown request", message(9999, 0, &[])),
        ("bad version", {
            let mut m = message(1, 0, &[]);
            m[4] = 0x2;
            m
        }),
        ("oversized payload", {
            let mut m = message(2, 0, &[0u8; 8]);
            m[8..12].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
            m
        }),
        ("SET_FEATURES with a short body", message(2, 0, &[1, 2, 3])),
        // SET_MEM_TABLE claiming 3 regions with no room (and no fds) for them.
        (
            "SET_MEM_TABLE lying about regions",
            message(5, 0, &[3, 0, 0, 0, 0, 0, 0, 0]),
        ),
        ("IOTLB_MSG with a short body", message(22, 0, &[0u8; 8])),
        ("IOTLB_MSG with a huge body", message(22, 0, &[0u8; 4000])),
        ("SET_VRING_NUM for queue 200", {
            let mut body = 200u32.to_le_bytes().to_vec();
            body.extend_from_slice(&64u32.to_le_bytes());
            message(8, 0, &body)
        }),
    ];
    for (what, bytes) in bad {
        // Reply-less requests that the handler refuses also end the
        // connection; each must never take the server down.
        assert!(closed_after(&srv.socket, &bytes), "{what}: not closed");
        assert!(srv.alive(), "{what}: server died");
    }
    // A truncated message followed by a hang-up.
    {
        let mut s = std::os::unix::net::UnixStream::connect(&srv.socket).unwrap();
        std::io::Write::write_all(&mut s, &message(1, 0, &[])[..6]).unwrap();
    }
    still_serves(&mut srv);
}

/// A front end that negotiated VERSION_1 and REPLY_ACK and asks for a reply
/// to every message, so a refused request is an error at the call.
fn acked_frontend(srv: &Server) -> vhost::vhost_user::Frontend {
    use vhost::vhost_user::message::VhostUserProtocolFeatures as P;
    use vhost::vhost_user::VhostUserFrontend;
    use vhost::VhostBackend;
    let mut fe = connect(&srv.socket);
    fe.set_owner().unwrap();
    let f = fe.get_features().unwrap();
    fe.set_features(f & (VERSION_1 | PROTOCOL_FEATURES))
        .unwrap();
    let pf = fe.get_protocol_features().unwrap();
    fe.set_protocol_features(pf & P::REPLY_ACK).unwrap();
    fe.set_hdr_flags(vhost::vhost_user::message::VhostUserHeaderFlag::NEED_REPLY);
    fe
}

#[test]
fn memory_table_larger_than_its_file_is_refused() {
    let mut srv = Server::start(1 << 20, &[]);
    {
        use vhost::VhostBackend;
        let fe = acked_frontend(&srv);
        let small = memfd(1 << 20);
        let res = fe.set_mem_table(&[vhost::VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: 16 << 20,
            userspace_addr: UADDR,
            mmap_offset: 0,
            mmap_handle: std::os::fd::AsRawFd::as_raw_fd(&small),
        }]);
        assert!(
            res.is_err(),
            "a region past the end of its memfd was accepted"
        );
    }
    still_serves(&mut srv);
}

/// A front end that keeps the right to truncate the memory it shares would
/// crash the back end (SIGBUS on every access past the new end): a memfd
/// that allows sealing comes out of SET_MEM_TABLE sealed against shrinking,
/// and truncating it fails.
#[test]
fn shared_memfd_is_sealed_against_shrinking() {
    let mut srv = Server::start(1 << 20, &[]);
    {
        use vhost::VhostBackend;
        let fe = acked_frontend(&srv);
        let mem = memfd::MemfdOptions::default()
            .allow_sealing(true)
            .close_on_exec(true)
            .create("iopath-test-sealable")
            .unwrap();
        mem.as_file().set_len(4 << 20).unwrap();
        assert!(
            !mem.seals().unwrap().contains(&memfd::FileSeal::SealShrink),
            "the test's memfd starts unsealed"
        );
        fe.set_mem_table(&[vhost::VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: 4 << 20,
            userspace_addr: UADDR,
            mmap_offset: 0,
            mmap_handle: std::os::fd::AsRawFd::as_raw_fd(mem.as_file()),
        }])
        .unwrap();
        assert!(mem.seals().unwrap().contains(&memfd::FileSeal::SealShrink));
        let e = mem.as_file().set_len(0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
        // Growing stays allowed: nothing mapped is lost by it.
        mem.as_file().set_len(8 << 20).unwrap();
    }
    still_serves(&mut srv);
}

/// A front end whose memory cannot be sealed (this client's memfd forbids
/// sealing) truncates it under the back end's mapping: the back end's next
/// access raises SIGBUS, which it catches: that front end is dropped, the
/// back end lives on and serves the next one.
#[test]
fn front_end_truncating_its_memory_is_dropped_not_fatal() {
    use vhost::VhostBackend;
    let mut srv = Server::start(1 << 20, &[]);
    {
        let mut c = Client::new(&srv.socket, VERSION_1 | BLK_F_FLUSH, 1);
        let data = pattern(0, 4096, 5);
        assert_eq!(c.write(0, 0, &data), S_OK);
        // The memory goes (the test's own mapping is not touched again);
        // a kick makes the back end read the ring.
        c.memfd.set_len(0).unwrap();
        c.queues[0].kick.write(1).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while c.fe.get_features().is_ok() {
            assert!(srv.alive(), "the back end died of the front end's SIGBUS");
            assert!(
                std::time::Instant::now() < deadline,
                "the front end that truncated its memory is still served"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    assert!(srv.alive(), "the back end died of the front end's SIGBUS");
    still_serves(&mut srv);
}

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
    let mut srv = Server::start(4 << 20, &[]);
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
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use vhost::vhost_user::message::VhostUserProtocolFeatures as P;
    use vhost::vhost_user::VhostUserFrontend;

    let mut srv = Server::start(4 << 20, &[]);
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

#[test]
fn kick_fd_that_is_not_an_eventfd_is_refused() {
    use std::os::fd::{FromRawFd, IntoRawFd};
    use vhost::VhostBackend;
    use vmm_sys_util::eventfd::EventFd;

    let mut srv = Server::start(1 << 20, &[]);
    {
        let fe = acked_frontend(&srv);
        fe.set_vring_num(0, 64).unwrap();
        let (rd, _wr) = rustix::pipe::pipe().unwrap();
        // SAFETY: `rd` is an open fd we own; EventFd takes it over and only
        // hands its number to the message (the test never reads through it).
        let not_an_eventfd = unsafe { EventFd::from_raw_fd(rd.into_raw_fd()) };
        assert!(
            fe.set_vring_kick(0, &not_an_eventfd).is_err(),
            "a pipe was accepted as the kick fd"
        );
    }
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
    let mut srv = Server::start(4 << 20, &[]);
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
        c.set_desc(0, d0, c.dev(h), 16, F_NEXT, d0 + 1);
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
