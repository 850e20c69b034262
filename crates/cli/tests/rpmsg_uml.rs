//! Linux's own `virtio_rpmsg_bus`, in User-Mode Linux (`scripts/linux-lab`),
//! as the host of `iopath rpmsg remote --vhost-user`: the channel the
//! remote announces appears in `/sys/bus/rpmsg/devices`, Linux's
//! `rpmsg_client_sample` runs its 100 round trips against the remote's
//! echo, and a second boot (a new driver on the same remote) finds the
//! channel again.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{s, wait_path, Proc};
use iopath_testkit::{skip, Feature};
use rustix::process::Signal;

const SAMPLE: &str = "rpmsg-client-sample";

/// What the guest runs: waits for the channel, loads the sample (when
/// given), waits for its goodbye, and prints what the kernel said.
const GUEST: &str = r#"
set -u
ko=${1:-}
i=0
until ls /sys/bus/rpmsg/devices | grep -q "\.rpmsg-client-sample\."; do
    i=$((i + 1)); [ $i -lt 100 ] || { echo "no channel"; ls /sys/bus/rpmsg/devices; dmesg | tail -20; exit 3; }
    sleep 0.1
done
echo "channels: $(ls /sys/bus/rpmsg/devices | tr '\n' ' ')"
[ -n "$ko" ] || exit 0
insmod "$ko" || exit 4
i=0
until dmesg | grep -q "goodbye!"; do
    i=$((i + 1)); [ $i -lt 300 ] || { echo "no goodbye"; dmesg | tail -20; exit 5; }
    sleep 0.1
done
echo "incoming: $(dmesg | grep -c 'rpmsg_client_sample.*incoming msg')"
dmesg | grep -E "rpmsg host is online|goodbye!"
"#;

/// The workspace root (scripts/ lives there).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The lab's kernel directory (`linux`, `modules/`), built if needed.
fn lab() -> Option<PathBuf> {
    let out = Command::new(root().join("scripts/linux-lab"))
        .arg("path")
        .output()
        .expect("run scripts/linux-lab");
    if !out.status.success() {
        skip(
            Feature::Package("linux-source-6.12"),
            format!(
                "the Linux lab's kernel cannot be built: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        );
        return None;
    }
    Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Boots the lab with the remote's socket as virtio device 7 and runs the
/// guest script; returns its output.
fn boot(dir: &Path, sock: &Path, ko: Option<&Path>) -> String {
    let script = dir.join("guest.sh");
    std::fs::write(&script, GUEST).unwrap();
    let mut cmd = Command::new(root().join("scripts/linux-lab"));
    cmd.args([
        "run",
        "--device",
        &format!("{}:7", s(sock)),
        "--timeout",
        "120",
    ])
    .args(["--", s(&script)]);
    if let Some(ko) = ko {
        cmd.arg(ko);
    }
    let out = cmd
        .current_dir(dir)
        .output()
        .expect("run scripts/linux-lab");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "guest failed ({}):\n{text}",
        out.status
    );
    text
}

#[test]
#[ignore = "UML's virtio_uml runs the rpmsg rx callback in IRQ context; insmod of the sample often panics the 6.12 guest (scheduling while atomic)"]
fn linux_rpmsg_client_sample_against_the_remote() {
    let Some(kdir) = lab() else { return };
    let ko = kdir.join("modules/rpmsg_client_sample.ko");
    assert!(ko.exists(), "{} missing from the lab's build", ko.display());
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("rpmsg.sock");
    let mut remote = Proc::spawn(
        dir.path(),
        "remote",
        &[
            "rpmsg",
            "remote",
            "--vhost-user",
            s(&sock),
            "--echo",
            SAMPLE,
        ],
    );
    wait_path(&sock);

    let out = boot(dir.path(), &sock, Some(&ko));
    assert!(out.contains(".rpmsg-client-sample."), "{out}");
    assert!(out.contains("incoming: 100"), "{out}");
    assert!(out.contains("goodbye!"), "{out}");

    // The guest is gone: the remote waits for the next driver, which finds
    // the channel again.
    let out = boot(dir.path(), &sock, None);
    assert!(out.contains(".rpmsg-client-sample."), "{out}");
    let err = remote.stderr();
    assert_eq!(err.matches("remote: host ready").count(), 2, "{err}");
    // The sample's 100 messages in, 100 echoes and the announcement out.
    assert!(
        err.contains("remote: rx 100 tx 101 refused 0 malformed 0"),
        "{err}"
    );

    remote.signal(Signal::TERM);
    assert!(remote.wait(Duration::from_secs(10)).success());
    assert!(!sock.exists(), "the socket is removed on SIGTERM");
}
