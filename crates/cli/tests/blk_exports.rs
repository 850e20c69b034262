//! `iopath blk serve --export ...` repeated: several images from one
//! process, each on its own socket with its own settings. A front end
//! that sends garbage to one export, hogs it or is killed under load
//! leaves the others serving (their blocks verified, on the device and in
//! the image files); SIGTERM removes every socket; exports that cannot be
//! served together, and bad export options, are usage errors that name
//! what is wrong.

#[allow(dead_code)]
mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{s, wait_path, Proc, BIN};

const IMAGE: u64 = 4 << 20;

/// Fresh `len`-byte images `NAME.img` in `dir`.
fn images(dir: &Path, names: &[&str]) -> Vec<PathBuf> {
    names
        .iter()
        .map(|n| {
            let p = dir.join(format!("{n}.img"));
            std::fs::File::create(&p).unwrap().set_len(IMAGE).unwrap();
            p
        })
        .collect()
}

fn spec(image: &Path, socket: &Path, extra: &str) -> String {
    format!("image={},socket={}{extra}", s(image), s(socket))
}

/// `iopath blk dd` writing the `seq` pattern over the whole image of the
/// export on `socket` and verifying it.
fn dd_verify(socket: &Path) -> std::thread::JoinHandle<Output> {
    let socket = socket.to_owned();
    std::thread::spawn(move || {
        Command::new(BIN)
            .args(["blk", "dd", "--bs", "64K", "--count", "64", "--pattern"])
            .args(["seq", "--verify", "--queue-depth", "8", "--socket"])
            .arg(&socket)
            .output()
            .unwrap()
    })
}

/// Joins a [`dd_verify`] and checks it verified.
fn verified(dd: std::thread::JoinHandle<Output>, what: &str) {
    let out = dd.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("verify: 4194304 bytes match"),
        "{what}: {out:?}"
    );
}

/// The image holds the `seq` pattern: each 8-byte word its own offset.
fn holds_seq(image: &Path) -> bool {
    let data = std::fs::read(image).unwrap();
    data.len() == IMAGE as usize
        && data
            .chunks_exact(8)
            .enumerate()
            .all(|(i, w)| u64::from_le_bytes(w.try_into().unwrap()) == 8 * i as u64)
}

/// Front ends that break the protocol: random bytes, a header promising
/// more than it sends, a memory table without its fds, an unknown request.
fn send_garbage(socket: &Path) {
    let header = |request: u32, size: u32| {
        let mut h = request.to_le_bytes().to_vec();
        h.extend(1u32.to_le_bytes());
        h.extend(size.to_le_bytes());
        h
    };
    let mut noise = vec![0u8; 4096];
    let mut x = 0x9e37_79b9_u32;
    for b in &mut noise {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    let mut short = header(1, 4096);
    short.extend([0u8; 10]);
    let mut mem_table = header(5, 40);
    mem_table.extend([0xffu8; 40]);
    let unknown = header(999, 0);
    for msg in [noise, short, mem_table, unknown] {
        let mut c = UnixStream::connect(socket).unwrap();
        let _ = c.write_all(&msg);
        // The export answers by closing; wait for that (or for a timeout).
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = std::io::Read::read_to_end(&mut c, &mut Vec::new());
    }
}

#[test]
fn garbage_a_hog_and_a_killed_front_end_on_one_export_leave_the_others_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let imgs = images(d, &["a", "b", "c"]);
    let socks: Vec<PathBuf> = ["a", "b", "c"]
        .iter()
        .map(|n| d.join(format!("{n}.sock")))
        .collect();
    let serve = Proc::spawn(
        d,
        "serve",
        &[
            "blk",
            "serve",
            "--export",
            &spec(&imgs[0], &socks[0], ""),
            "--export",
            &spec(&imgs[1], &socks[1], ",queues=2"),
            "--export",
            &spec(&imgs[2], &socks[2], ",poll-us=0"),
        ],
    );
    for s in &socks {
        wait_path(s);
    }

    // Garbage on a, then a front end that connects and stays: a serves
    // nobody else meanwhile, while b and c serve two dd's at once.
    send_garbage(&socks[0]);
    let hog = UnixStream::connect(&socks[0]).unwrap();
    let (b, c) = (dd_verify(&socks[1]), dd_verify(&socks[2]));
    verified(b, "b beside a hog on a");
    verified(c, "c beside a hog on a");
    assert!(holds_seq(&imgs[1]) && holds_seq(&imgs[2]));
    drop(hog);

    // A front end killed under load on a; b is served meanwhile.
    let mut victim = Proc::spawn(
        d,
        "victim",
        &[
            "blk", "dd", "--bs", "4K", "--count", "1000", "--runs", "1000",
        ]
        .into_iter()
        .chain(["--access", "rand", "--socket", s(&socks[0])])
        .collect::<Vec<_>>(),
    );
    iopath_testkit::wait_until("the dd on a has run once", Duration::from_secs(20), || {
        victim.stdout().contains("run 1:")
    });
    let b = dd_verify(&socks[1]);
    victim.kill();
    verified(b, "b while a front end of a was killed");

    // a serves again, and the server lived through all of it.
    verified(dd_verify(&socks[0]), "a after garbage, a hog and a kill");
    assert!(holds_seq(&imgs[0]));
    let err = serve.stderr();
    assert!(
        err.contains("front end dropped"),
        "garbage not reported:\n{err}"
    );
    drop(serve);
}

#[test]
fn sigterm_stops_every_export_and_removes_every_socket() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let imgs = images(d, &["a", "b"]);
    let socks = [d.join("a.sock"), d.join("b.sock")];
    let mut serve = Proc::spawn(
        d,
        "serve",
        &[
            "blk",
            "serve",
            "--export",
            &spec(&imgs[0], &socks[0], ",readonly"),
            "--export",
            &spec(&imgs[1], &socks[1], ",poll"),
        ],
    );
    // The banner comes once the stop is in place.
    iopath_testkit::wait_until("both exports' banners", Duration::from_secs(10), || {
        serve.stdout().lines().count() == 2
    });
    let out = serve.stdout();
    assert!(
        out.contains("a.img (8192 sectors, O_DIRECT, read-only)")
            || out.contains("a.img (8192 sectors, buffered, read-only)"),
        "{out}"
    );
    assert!(out.contains("(poll, never sleep)"), "{out}");
    // A front end connected to one export does not hold the stop up.
    let _front = UnixStream::connect(&socks[1]).unwrap();
    serve.signal(rustix::process::Signal::TERM);
    let st = serve.wait(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0), "{}", serve.stderr());
    for s in &socks {
        assert!(!s.exists(), "{} left behind", s.display());
    }
}

/// `iopath blk serve ARGS`, expected to fail at once.
fn serve_fails(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args(["blk", "serve"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn bad_exports_are_usage_errors_that_name_the_fault() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let imgs = images(d, &["a", "b"]);
    let (a, b) = (s(&imgs[0]), s(&imgs[1]));
    let sock = |n: &str| d.join(n).to_str().unwrap().to_owned();
    let e = |extra: &str| format!("image={a},socket={}{extra}", sock("a.sock"));
    for (args, want) in [
        (
            vec!["--export".into(), e(",readonyl")],
            "Unknown export option \"readonyl\"",
        ),
        (
            vec!["--export".into(), e(",queues=2,queues=4")],
            "\"queues\" is given twice",
        ),
        (
            vec!["--export".into(), e(",queues=0")],
            "queues=0 is not accepted",
        ),
        (
            vec!["--export".into(), format!("image={a}")],
            "\"socket\" is missing",
        ),
        (
            vec![
                "--export".into(),
                e(""),
                "--export".into(),
                format!("image={b},socket={}/./a.sock", s(d)),
            ],
            "Two exports on one socket",
        ),
        (
            vec![
                "--export".into(),
                e(""),
                "--export".into(),
                format!(
                    "image={}/../{}/a.img,socket={}",
                    s(d),
                    d.file_name().unwrap().to_str().unwrap(),
                    sock("b.sock")
                ),
            ],
            "exported writable twice",
        ),
        (
            vec!["--export".into(), e(""), "--queues".into(), "2".into()],
            "cannot be used with",
        ),
        (
            vec!["--export".into(), e(""), "--poll".into()],
            "--poll and --poll-us are for the one-export form",
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, err) = serve_fails(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!d.join("a.sock").exists() && !d.join("b.sock").exists());
    }
    // A readonly export beside a writable one of the same image is served.
    let mut ok = Proc::spawn(
        d,
        "ok",
        &[
            "blk",
            "serve",
            "--export",
            &e(""),
            "--export",
            &format!("image={a},socket={},readonly", sock("b.sock")),
        ],
    );
    wait_path(&d.join("b.sock"));
    ok.kill();
}

/// A socket path longer than `sun_path` holds is refused with the limit
/// and what to do, before anything is served.
#[test]
fn a_socket_path_past_the_limit_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let imgs = images(dir.path(), &["a"]);
    let long = dir.path().join(format!("{}.sock", "s".repeat(120)));
    let (code, err) = serve_fails(&["--image", s(&imgs[0]), "--socket", s(&long)]);
    assert_eq!(code, Some(1), "{err}");
    let len = long.as_os_str().len();
    assert!(
        err.contains(&format!("is {len} bytes;"))
            && err.contains("at most")
            && err.contains("choose a shorter path"),
        "{err}"
    );
    assert!(!long.exists());
}
