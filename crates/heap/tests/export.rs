//! Buffers loaded from a file are exported to a real second process (this
//! test binary re-executed), which reads them byte for byte and writes back
//! into the shared memory.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::Command;

use iopath_heap::{load, Buffer, HugePages, LoadOptions, MemfdHeap, Method};

const CHILD_ENV: &str = "IOPATH_HEAP_TEST_CHILD_SOCK";
const MARK: &[u8] = b"written by the child";

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[test]
fn exported_buffer_is_read_by_another_process() {
    let Some(dir) = common::disk_dir() else {
        return;
    };
    let size = (5 << 20) + 123;
    let data = common::pattern(size, 11);
    let path = dir.path().join("model.bin");
    std::fs::write(&path, &data).unwrap();
    let opts = LoadOptions {
        buffer_size: 1 << 20,
        method: Method::Auto,
        ..LoadOptions::default()
    };
    let loaded = load(&path, &MemfdHeap::new(HugePages::None), &opts, &mut |_| {}).unwrap();
    assert_eq!(loaded.buffers.len(), 6);
    assert_eq!(loaded.stats.bytes, size as u64);

    let sock = dir.path().join("sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_imports_and_checksums",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, &sock)
        .spawn()
        .unwrap();
    let (conn, _) = listener.accept().unwrap();
    let mut lines = BufReader::new(conn.try_clone().unwrap()).lines();
    for i in [2usize, 5] {
        let buf = &loaded.buffers[i];
        buf.export(&conn).unwrap();
        let mut expect = vec![0u8; buf.len()];
        let start = i << 20;
        let end = (start + buf.len()).min(size);
        expect[..end - start].copy_from_slice(&data[start..end]);
        let reply = lines.next().unwrap().unwrap();
        assert_eq!(
            reply,
            format!("{} {:016x}", buf.len(), fnv1a(&expect)),
            "child saw other bytes in buffer {i}"
        );
        // The child wrote into the same memory.
        let mut mark = vec![0u8; MARK.len()];
        buf.read_at(100, &mut mark).unwrap();
        assert_eq!(mark, MARK);
    }
    drop(conn);
    assert!(child.wait().unwrap().success(), "child failed");
}

/// The child half; runs only when started by the test above.
#[test]
#[ignore = "run by exported_buffer_is_read_by_another_process in a child process"]
fn child_imports_and_checksums() {
    let sock = std::env::var_os(CHILD_ENV).expect("started by the parent test");
    let mut conn = UnixStream::connect(sock).unwrap();
    for _ in 0..2 {
        let buf = Buffer::import(&conn).unwrap();
        let mut bytes = vec![0u8; buf.len()];
        buf.read_at(0, &mut bytes).unwrap();
        // Write into the shared memory before replying, so the parent sees it.
        buf.write_at(100, MARK).unwrap();
        writeln!(conn, "{} {:016x}", buf.len(), fnv1a(&bytes)).unwrap();
    }
}
