//! A peer that truncates the rpmsg shared-memory file does not kill this
//! process: the heap's mapping catches the SIGBUS.

use std::process::Command;

use iopath_rpmsg::{SharedMem, ShmLayout};

#[test]
fn peer_truncating_the_shared_memory_file_is_not_fatal() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("shm");
    let layout = ShmLayout::openamp_demo();
    let remote = SharedMem::create(&path, &layout).unwrap();
    let host = SharedMem::open(&path).unwrap();
    let ring = vec![0x5Au8; 0x1000];
    remote.write(0x8000, &ring).unwrap();
    let mut got = vec![0u8; 0x1000];
    host.read(0x8000, &mut got).unwrap();
    assert_eq!(got, ring);
    let table = {
        let mut t = vec![0u8; layout.table().len()];
        host.read(0, &mut t).unwrap();
        t
    };

    // The peer: another process shrinks the file to its first 16 KiB.
    let st = Command::new("truncate")
        .args(["-s", "16384"])
        .arg(&path)
        .status()
        .expect("run truncate(1)");
    assert!(st.success());

    // Both views survive: the lost vring page reads as zeros ...
    host.read(0x8000, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0), "lost pages read as zeros");
    assert!(host.peer_truncated());
    remote.write(0x9000, b"nowhere").unwrap();
    assert!(remote.peer_truncated());
    // ... and what is still in the file is intact.
    let mut t = vec![0u8; table.len()];
    host.read(0, &mut t).unwrap();
    assert_eq!(t, table);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 16384);
}
