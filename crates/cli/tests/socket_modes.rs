//! The sockets iopath serves are 0600 whatever the umask (`blk serve
//! --socket`, the rpmsg remote's notify socket), widened only on request
//! (`--socket-mode`, `--notify-mode`), and a peer of another user is
//! refused even when the file's mode would let it through: as real
//! processes, the other user being uid 65534 through `setpriv`.

#[allow(dead_code)]
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use common::{s, wait_path, Proc, BIN};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// `iopath ARGS` under `umask 000`, as process `name` in `dir`.
fn spawn_umask_000(dir: &Path, name: &str, args: &[&str]) -> Proc {
    let mut argv = vec!["-c", "umask 000; exec \"$0\" \"$@\"", BIN];
    argv.extend_from_slice(args);
    Proc::spawn_program(dir, name, Path::new("/bin/sh"), &argv)
}

#[test]
fn sockets_are_0600_under_umask_000_unless_widened() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let image = d.join("disk.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    for (extra, want) in [(None, 0o600), (Some("660"), 0o660)] {
        let sock = d.join(format!("blk{want:o}.sock"));
        let mut args = vec!["blk", "serve", "--image", s(&image), "--socket", s(&sock)];
        if let Some(m) = extra {
            args.extend_from_slice(&["--socket-mode", m]);
        }
        let _serve = spawn_umask_000(d, "serve", &args);
        wait_path(&sock);
        assert_eq!(mode(&sock), want, "blk serve {args:?}");
    }
    for (notify, extra, want) in [
        ("unix", None, 0o600),
        ("eventfd", None, 0o600),
        ("unix", Some("660"), 0o660),
    ] {
        let ev = d.join(format!("ev-{notify}-{want:o}"));
        let shm = d.join(format!("shm-{notify}-{want:o}"));
        let spec = format!("{notify}:{}", s(&ev));
        let mut args = vec![
            "rpmsg",
            "remote",
            "--shm",
            s(&shm),
            "--create",
            "0x80000",
            "--notify",
            &spec,
        ];
        if let Some(m) = extra {
            args.extend_from_slice(&["--notify-mode", m]);
        }
        let _remote = spawn_umask_000(d, "remote", &args);
        wait_path(&ev);
        assert_eq!(mode(&ev), want, "rpmsg remote {args:?}");
        assert_eq!(mode(&shm), 0o600, "rpmsg remote {args:?}");
    }
}

/// Runs `BIN ARGS` as uid and gid 65534 with no supplementary groups.
fn as_nobody(args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
        .args(args)
        .output()
        .expect("setpriv (util-linux) is needed")
}

fn root_or_skip() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    iopath_testkit::skip(
        iopath_testkit::Feature::Root,
        "acting as another user needs root (setpriv)",
    );
    false
}

#[test]
fn blk_serve_refuses_another_user_unless_widened() {
    if !root_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Everyone through the directory; the image is root's, 0644.
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let image = d.join("disk.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o644)).unwrap();
    let sock = d.join("blk.sock");
    let dd = [
        "blk",
        "dd",
        "--socket",
        s(&sock),
        "--bs",
        "1M",
        "--count",
        "1",
        "--pattern",
        "seq",
    ];
    let serve = spawn_umask_000(
        d,
        "serve",
        &["blk", "serve", "--image", s(&image), "--socket", s(&sock)],
    );
    wait_path(&sock);
    // The socket's mode keeps the other user out...
    let o = as_nobody(&dd);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(err.contains("ermission denied"), "{err}");
    // ... and so does the server when the file's mode would let it in.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = as_nobody(&dd);
    assert!(!o.status.success(), "another user wrote through the socket");
    let log = serve.wait_for_line("Refused a front end of another user");
    assert!(log.contains("uid 65534"), "{log}");
    assert!(log.contains("(pid "), "{log}");
    assert!(
        std::fs::read(&image).unwrap().iter().all(|&b| b == 0),
        "the image was written"
    );
    drop(serve);
    // Widened on request: the same user's write goes through, so the
    // refusals above were the mode's doing.
    let _serve = spawn_umask_000(
        d,
        "serve-wide",
        &[
            "blk",
            "serve",
            "--image",
            s(&image),
            "--socket",
            s(&sock),
            "--socket-mode",
            "666",
        ],
    );
    wait_path(&sock);
    let o = as_nobody(&dd);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let data = std::fs::read(&image).unwrap();
    assert_eq!(u64::from_le_bytes(data[8..16].try_into().unwrap()), 8);
}

#[test]
fn rpmsg_remote_refuses_a_host_of_another_user() {
    if !root_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let shm = d.join("shm");
    let ev = d.join("ev");
    let notify = format!("unix:{}", s(&ev));
    let remote = common::spawn_remote(d, s(&shm), &notify, &[]);
    wait_path(&ev);
    assert_eq!(mode(&ev), 0o600);
    // Let the other user through the file system: the remote still refuses
    // it, naming its pid and uid, and waits on for the real host.
    std::fs::set_permissions(&ev, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = as_nobody(&[
        "rpmsg",
        "host",
        "--shm",
        s(&shm),
        "--notify",
        &notify,
        "--openamp-ping",
        "--timeout",
        "2",
    ]);
    assert!(!o.status.success());
    let log = remote.wait_for_line("Refused a peer of another user");
    assert!(log.contains("uid 65534"), "{log}");
    assert!(log.contains("--notify-mode"), "{log}");
    let o = Command::new(BIN)
        .args(["rpmsg", "host", "--shm", s(&shm), "--notify", &notify])
        .args(["--openamp-ping", "--json", "--timeout", "10"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["payloads"].as_u64(), v["errors"].as_u64()),
        (Some(480), Some(0))
    );
}
