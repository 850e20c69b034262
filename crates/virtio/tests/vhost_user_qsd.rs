//! The vhost-user front end against a real peer: `qemu-storage-daemon`
//! exporting a raw image as vhost-user-blk.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use iopath_sys::process::Supervised;
use iopath_virtio::features::{VIRTIO_F_ACCESS_PLATFORM, VIRTIO_F_VERSION_1};
use iopath_virtio::transport::vhost_user::VhostUser;
use iopath_virtio::Transport;

/// qemu-storage-daemon serving `image` on `socket`; killed on drop.
struct Qsd {
    _child: Supervised,
    _dir: tempfile::TempDir,
    socket: PathBuf,
}

fn qsd(image_len: u64) -> Option<Qsd> {
    if !iopath_testkit::have_peer("qemu-storage-daemon", "qemu-utils") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(image_len)
        .unwrap();
    let socket = dir.path().join("vhost.sock");
    let mut cmd = Command::new("qemu-storage-daemon");
    cmd.arg("--blockdev")
        .arg(format!(
            "driver=file,node-name=disk,filename={}",
            image.display()
        ))
        .arg("--export")
        .arg(format!(
            "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path={},writable=on,num-queues=2",
            socket.display()
        ));
    let child = Supervised::spawn("qemu-storage-daemon", &mut cmd);
    Some(Qsd {
        _child: child.unwrap(),
        _dir: dir,
        socket,
    })
}

fn connect(sock: &Path) -> VhostUser {
    VhostUser::connect(sock, 2, Duration::from_secs(10)).unwrap()
}

#[test]
fn reads_capacity_and_queue_count_from_qemu_storage_daemon() {
    let Some(q) = qsd(24 << 20) else { return };
    let vu = connect(&q.socket);
    assert_eq!(vu.num_queues(), 2);
    // VERSION_1 is offered; ACCESS_PLATFORM is not (no IOTLB in qsd).
    let offered = vu.device_features().unwrap();
    assert_ne!(offered & VIRTIO_F_VERSION_1, 0);
    assert_eq!(offered & VIRTIO_F_ACCESS_PLATFORM, 0);
    // Without ACCESS_PLATFORM there is no IOTLB to send records to.
    vu.set_driver_features(VIRTIO_F_VERSION_1).unwrap();
    assert!(vu.iotlb_sink().is_none());
    // qemu-storage-daemon ignores the offset of GET_CONFIG and always copies
    // from the start of its config, so read from offset 0.
    let mut cfg = [0u8; 60];
    vu.read_config(0, &mut cfg).unwrap();
    // capacity (u64 at 0, sectors) and num_queues (u16 at 34).
    assert_eq!(
        u64::from_le_bytes(cfg[0..8].try_into().unwrap()),
        (24 << 20) / 512
    );
    assert_eq!(u16::from_le_bytes(cfg[34..36].try_into().unwrap()), 2);
}
