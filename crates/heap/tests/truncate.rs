//! A peer that truncates a shared file under a mapping does not kill the
//! process: the SIGBUS guard of the heap's mapping type, with a real child
//! process doing the truncating.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use iopath_heap::{Buffer, Heap, HeapKind, HugePages, MemfdHeap, SharedMapping};

const LEN: usize = 64 << 10;

fn shared_file(dir: &Path) -> (std::path::PathBuf, OwnedFd) {
    let path = dir.join("shared");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.set_len(LEN as u64).unwrap();
    (path, OwnedFd::from(f))
}

/// The peer: another process that shrinks the file to one page.
fn truncate_by_child(path: &Path) {
    let st = Command::new("truncate")
        .args(["-s", "4096"])
        .arg(path)
        .status()
        .expect("run truncate(1)");
    assert!(st.success());
}

#[test]
fn buffer_over_a_truncated_file_reads_zeros_and_says_so() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let (path, fd) = shared_file(dir.path());
    let buf = Buffer::from_fd(fd, LEN, HeapKind::Memfd).unwrap();
    assert!(buf.is_guarded(), "an unsealed file must be guarded");
    let data: Vec<u8> = (0..LEN).map(|i| (i % 253) as u8 + 1).collect();
    buf.write_at(0, &data).unwrap();
    assert!(!buf.peer_truncated());

    truncate_by_child(&path);
    let mut out = vec![0xAAu8; LEN];
    buf.read_at(0, &mut out).unwrap();
    assert_eq!(&out[..4096], &data[..4096], "the page still in the file");
    assert!(out[4096..].iter().all(|&b| b == 0), "past the end: zeros");
    assert!(buf.peer_truncated());
    // Writes past the end land in private pages and reach no one.
    buf.write_at(8192, b"gone").unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 4096);
}

#[test]
fn shared_mapping_shuts_the_peers_socket_down() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let (path, fd) = shared_file(dir.path());
    let map = SharedMapping::new(fd.as_fd(), 4096, LEN - 4096).unwrap();
    drop(fd);
    assert!(map.is_guarded());
    let (ours, mut theirs) = UnixStream::pair().unwrap();
    map.shutdown_on_fault(ours.as_fd()).unwrap();
    truncate_by_child(&path);
    // Touch the first page of the mapping (file offset 4096, now past EOF).
    // SAFETY: the mapping is live for this scope; a volatile read of one of
    // its bytes is what a peer-facing accessor does.
    let byte = unsafe { map.as_ptr().read_volatile() };
    assert_eq!(byte, 0);
    assert!(map.peer_truncated());
    let mut rest = Vec::new();
    theirs.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "the peer's socket was shut down");
}

#[test]
fn sealed_memfd_buffers_need_no_guard() {
    let buf = MemfdHeap::new(HugePages::None).alloc(LEN).unwrap();
    assert!(!buf.is_guarded());
}

/// A SIGBUS outside any guarded mapping still kills: the child below dies
/// of it.
#[test]
fn sigbus_elsewhere_keeps_its_old_disposition() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_faults_outside_the_guard",
            "--nocapture",
        ])
        .env("IOPATH_SIGBUS_CHILD", dir.path())
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "child: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The child half of the test above; runs only when started by it.
#[test]
#[ignore = "run by sigbus_elsewhere_keeps_its_old_disposition in a child process"]
fn child_faults_outside_the_guard() {
    let dir = std::env::var_os("IOPATH_SIGBUS_CHILD").expect("started by the parent test");
    // The parent's directory: this child dies of SIGBUS and could not
    // remove one of its own.
    let (path, fd) = shared_file(Path::new(&dir));
    // Install the guard with one guarded mapping ...
    let _guarded = SharedMapping::new(fd.as_fd(), 0, 4096).unwrap();
    // ... then fault in a mapping nobody guards.
    // SAFETY: a fresh shared mapping of the file, read once below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    truncate_by_child(&path);
    // SAFETY: inside the mapping; past the file's end, so it faults.
    let b = unsafe { p.cast::<u8>().add(8192).read_volatile() };
    println!("survived, read {b}");
    std::process::exit(0);
}

/// More guarded mappings than the guard's first table of slots holds
/// (1,024): every one is guarded, and a file shrunk under them all kills
/// no one. In a child of its own, which a SIGBUS would kill.
#[test]
fn every_one_of_many_file_buffers_is_guarded() {
    const MAPS: usize = 1100;
    if std::env::var_os("IOPATH_MANY_MAPS_CHILD").is_none() {
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "every_one_of_many_file_buffers_is_guarded",
                "--nocapture",
            ])
            .env("IOPATH_MANY_MAPS_CHILD", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{:?} (signal {:?}): {}",
            out.status,
            out.status.signal(),
            String::from_utf8_lossy(&out.stdout)
        );
        return;
    }
    iopath_sys::raise_fd_limit(Some(4 * MAPS as u64));
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, vec![7u8; 2 * 4096]).unwrap();
    let bufs: Vec<Buffer> = (0..MAPS)
        .map(|_| {
            let fd = OwnedFd::from(std::fs::File::open(&path).unwrap());
            Buffer::map_file(fd, 2 * 4096).unwrap()
        })
        .collect();
    assert!(bufs.iter().all(Buffer::is_guarded));
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    for b in &bufs {
        let mut got = [1u8; 2];
        b.read_at(4095, &mut got).unwrap();
        assert_eq!(got, [7, 0]);
        assert!(b.peer_truncated());
    }
}
