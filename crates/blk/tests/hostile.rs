//! A hostile front end against a real `iopath blk serve`: broken chains,
//! addresses outside the shared memory or the IOTLB, malformed vhost-user
//! messages. Each gets IOERR/UNSUPP or a closed connection, memory outside
//! what was granted is never touched, and the next front end is served.
//! The IOMMU cases are in `hostile_iommu.rs`.

mod frontend;

use frontend::*;

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

    // An avail entry naming a descriptor past the queue: no crash, and the
    // queue goes on. The ring is served in order, so the answer to the read
    // made available behind it shows that the server has taken the entry.
    c.submit(0, &[5000]);
    let (st, back) = c.read(0, 0, 512);
    assert_eq!(st, S_OK);
    assert!(back == secret[..512]);
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
