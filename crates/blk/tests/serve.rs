//! `iopath blk serve` against a front end driven from the test: reads,
//! writes, flush, GET_ID, discard and write-zeroes, checked in guest memory
//! and in the image file on the host.

mod frontend;

use frontend::*;
use vm_memory::ByteValued;

#[test]
fn reads_writes_flush_and_id_reach_the_image() {
    reads_writes_flush_and_id(&Server::start(16 << 20, &[]));
}

/// The same on an image in RAM, where requests of up to 128 KiB are
/// copied inline and larger ones still go through io_uring.
#[test]
fn reads_writes_flush_and_id_reach_an_image_in_ram() {
    if let Some(srv) = Server::start_in_ram(16 << 20, &[]) {
        reads_writes_flush_and_id(&srv);
    }
}

fn reads_writes_flush_and_id(srv: &Server) {
    let mut c = Client::new(&srv.socket, VERSION_1 | BLK_F_FLUSH | INDIRECT_DESC, 1);
    let cfg = iopath_blk::config::BlkConfig::from_bytes(&c.config());
    assert_eq!(cfg.capacity, (16 << 20) / SECTOR);
    assert_eq!(cfg.blk_size, 512);
    assert_eq!(cfg.num_queues, 1);

    // 1 MiB, page-aligned buffer: the O_DIRECT path straight from memory.
    let data = pattern(100 * SECTOR, 1 << 20, 0x5a5a);
    assert_eq!(c.write(0, 100, &data), S_OK);
    assert_eq!(c.flush(0), S_OK);
    let (st, back) = c.read(0, 100, 1 << 20);
    assert_eq!(st, S_OK);
    assert!(back == data, "read back differs");
    assert!(
        srv.image_bytes(100 * SECTOR, 1 << 20) == data,
        "image differs"
    );

    // A buffer at an odd address: staged through aligned memory.
    let odd = pattern(9000 * SECTOR, 8 * 512, 0x1234);
    assert_eq!(c.request(0, T_OUT, 9000, Some(&odd), 0, 3).0, S_OK);
    let (st, back) = c.request(0, T_IN, 9000, None, 8 * 512, 5);
    assert_eq!(st, S_OK);
    assert!(back == odd);
    assert_eq!(c.flush(0), S_OK);
    assert!(srv.image_bytes(9000 * SECTOR, 8 * 512) == odd);

    // 4 KiB, page-aligned, one segment: the small-block case.
    let small = pattern(4096 * SECTOR, 4096, 0x77);
    assert_eq!(c.write(0, 4096, &small), S_OK);
    let (st, back) = c.read(0, 4096, 4096);
    assert_eq!(st, S_OK);
    assert!(back == small);
    assert!(srv.image_bytes(4096 * SECTOR, 4096) == small);

    // The last sector is in range, one past it is not.
    let last = (16 << 20) / SECTOR - 1;
    assert_eq!(c.write(0, last, &[7u8; 512]), S_OK);
    assert_eq!(c.write(0, last + 1, &[7u8; 512]), S_IOERR);

    let (st, id) = c.request(0, T_GET_ID, 0, None, 20, 0);
    assert_eq!(st, S_OK);
    assert_eq!(&id[..15], b"iopath:disk.img");
    assert_eq!(id[15..], [0u8; 5]);
}

/// One discard / write-zeroes segment; `flags` 1 is the unmap flag.
fn range(sector: u64, count: u32, flags: u32) -> Vec<u8> {
    RangeSegment::new(sector, count, flags == 1)
        .as_slice()
        .to_vec()
}

#[test]
fn write_zeroes_and_discard_clear_data() {
    let srv = Server::start(4 << 20, &[]);
    let mut c = Client::new(&srv.socket, VERSION_1 | (1 << 13) | (1 << 14), 1);
    let data = pattern(0, 64 * 512, 99);
    assert_eq!(c.write(0, 0, &data), S_OK);
    // Zero sectors 8..16 (no unmap) and 32..40 (unmap allowed).
    let mut ranges = range(8, 8, 0);
    ranges.extend(range(32, 8, 1));
    assert_eq!(c.request(0, T_WRITE_ZEROES, 0, Some(&ranges), 0, 0).0, S_OK);
    assert_eq!(
        c.request(0, T_DISCARD, 0, Some(&range(48, 8, 0)), 0, 0).0,
        S_OK
    );
    // Discard takes no flags; ranges past the end fail.
    assert_eq!(
        c.request(0, T_DISCARD, 0, Some(&range(0, 8, 1)), 0, 0).0,
        S_UNSUPP
    );
    assert_eq!(
        c.request(0, T_WRITE_ZEROES, 0, Some(&range(8190, 8, 0)), 0, 0)
            .0,
        S_IOERR
    );
    let (st, back) = c.read(0, 0, 64 * 512);
    assert_eq!(st, S_OK);
    let mut want = data.clone();
    want[8 * 512..16 * 512].fill(0);
    want[32 * 512..40 * 512].fill(0);
    assert!(back[..48 * 512] == want[..48 * 512]);
    assert!(back[56 * 512..] == want[56 * 512..]);
    assert_eq!(c.flush(0), S_OK);
    assert!(srv.image_bytes(0, 48 * 512) == want[..48 * 512]);
}

#[test]
fn many_requests_in_flight_on_two_queues() {
    many_in_flight(&Server::start(8 << 20, &["--queues", "2"]));
}

#[test]
fn many_requests_in_flight_on_two_queues_in_ram() {
    if let Some(srv) = Server::start_in_ram(8 << 20, &["--queues", "2"]) {
        many_in_flight(&srv);
    }
}

fn many_in_flight(srv: &Server) {
    let mut c = Client::new(&srv.socket, VERSION_1 | BLK_F_MQ | EVENT_IDX, 2);
    let cfg = iopath_blk::config::BlkConfig::from_bytes(&c.config());
    assert_eq!(cfg.num_queues, 2);
    // 16 writes of 64 KiB per queue, all submitted before waiting.
    for q in 0..2 {
        c.reset_alloc();
        let mut heads = Vec::new();
        for i in 0..16u16 {
            let sector = (q as u64 * 16 + u64::from(i)) * 128;
            let data = pattern(sector * SECTOR, 64 << 10, q as u64);
            let h = c.alloc(HEADER_LEN as u64, 0);
            let hdr = OutHeader::new(T_OUT, sector);
            vm_memory::Bytes::write_obj(&c.mem, hdr, vm_memory::GuestAddress(h)).unwrap();
            let d = c.alloc(64 << 10, 0);
            vm_memory::Bytes::write_slice(&c.mem, &data, vm_memory::GuestAddress(d)).unwrap();
            let s = c.alloc(1, 0);
            let base = i * 3;
            c.set_desc(q, base, c.dev(h), HEADER_LEN as u32, F_NEXT, base + 1);
            c.set_desc(q, base + 1, c.dev(d), 64 << 10, F_NEXT, base + 2);
            c.set_desc(q, base + 2, c.dev(s), 1, F_WRITE, 0);
            heads.push(base);
        }
        c.submit(q, &heads);
        let used = c.wait_used(q, 16);
        let mut ids: Vec<u32> = used.iter().map(|u| u.0).collect();
        ids.sort_unstable();
        assert_eq!(ids, heads.iter().map(|&h| u32::from(h)).collect::<Vec<_>>());
    }
    assert_eq!(c.flush(1), S_OK);
    for q in 0..2u64 {
        for i in 0..16u64 {
            let sector = (q * 16 + i) * 128;
            let (st, back) = c.read(q as usize, sector, 64 << 10);
            assert_eq!(st, S_OK);
            assert!(back == pattern(sector * SECTOR, 64 << 10, q));
            assert!(srv.image_bytes(sector * SECTOR, 64 << 10) == back);
        }
    }
}

#[test]
fn readonly_refuses_writes() {
    let srv = Server::start(1 << 20, &["--readonly"]);
    let mut c = Client::new(&srv.socket, VERSION_1 | BLK_F_RO, 1);
    assert_ne!(c.features & BLK_F_RO, 0);
    assert_eq!(c.write(0, 0, &[1u8; 512]), S_IOERR);
    let (st, back) = c.read(0, 0, 512);
    assert_eq!(st, S_OK);
    assert_eq!(back, vec![0u8; 512]);
    assert!(srv.image_bytes(0, 512) == vec![0u8; 512]);
}

#[test]
fn flushed_writes_survive_sigkill() {
    let mut srv = Server::start(4 << 20, &[]);
    let mut c = Client::new(&srv.socket, VERSION_1 | BLK_F_FLUSH, 1);
    let data = pattern(2048 * SECTOR, 256 << 10, 0xdead);
    assert_eq!(c.write(0, 2048, &data), S_OK);
    assert_eq!(c.flush(0), S_OK);
    srv.child.kill().unwrap(); // SIGKILL
    srv.child.wait().unwrap();
    assert!(!srv.alive());
    assert!(srv.image_bytes(2048 * SECTOR, 256 << 10) == data);
}

#[test]
fn next_front_end_is_served_after_disconnect() {
    let mut srv = Server::start(1 << 20, &[]);
    {
        let mut c = Client::new(&srv.socket, VERSION_1, 1);
        assert_eq!(c.write(0, 1, &[3u8; 512]), S_OK);
        // Leave a request in the ring unkicked-for and go away.
        c.reset_alloc();
    }
    let mut c = Client::new(&srv.socket, VERSION_1, 1);
    let (st, back) = c.read(0, 1, 512);
    assert_eq!(st, S_OK);
    assert_eq!(back, vec![3u8; 512]);
    assert!(srv.alive());
}

#[test]
fn sigterm_removes_the_socket() {
    let mut srv = Server::start(1 << 20, &[]);
    assert!(srv.socket.exists());
    // SAFETY: plain kill(2) on our own child.
    let rc = unsafe { libc::kill(srv.child.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let st = srv.child.wait().unwrap();
    assert!(st.success(), "exit status {st}");
    assert!(!srv.socket.exists());
}
