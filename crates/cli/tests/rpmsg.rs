//! rpmsg with real processes: `iopath rpmsg remote` and `iopath rpmsg host`
//! as two processes over a shared-memory file, `iopath rpmsg ping` as a
//! third; OpenAMP demo mode; malformed input from a peer.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{pair, s, spawn_host, spawn_remote, wait_path, Proc, BIN};

fn ping(ctrl: &Path, extra: &[&str]) -> Output {
    Command::new(BIN)
        .args(["rpmsg", "ping", "--ctrl", ctrl.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "ping failed: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn echo_every_size(notify: &str, remote_extra: &[&str]) {
    let p = pair(notify, remote_extra, &[]);
    // 992 round trips: every size 1..=496 twice, every byte compared by ping.
    let v = json(&ping(
        &p.ctrl,
        &["--name", "echo", "--count", "992", "--json"],
    ));
    assert_eq!(v["count"], 992);
    assert_eq!(v["sizes"], serde_json::json!([1, 496]));
    assert_eq!(v["bytes"], 2 * (496 * 497 / 2));
    assert_eq!(v["checked"], true);
    // A second client on the same bus.
    let v = json(&ping(
        &p.ctrl,
        &[
            "--name", "echo", "--count", "100", "--size", "496", "--json",
        ],
    ));
    assert_eq!(v["bytes"], 100 * 496);
    let stderr = p.remote.stderr();
    assert!(stderr.contains("host ready"), "{stderr}");
    assert!(
        !stderr.contains("malformed") && !stderr.contains("refused"),
        "{stderr}"
    );
}

#[test]
fn every_size_eventfd() {
    echo_every_size("eventfd:DIR/ev", &[]);
}

#[test]
fn every_size_unix_byte_event_idx() {
    echo_every_size("unix:DIR/ev", &["--event-idx"]);
}

#[test]
fn every_size_poll() {
    echo_every_size("poll", &[]);
}

#[test]
fn remote_destroy_tears_down_host_channel() {
    let mut p = pair("eventfd:DIR/ev", &["--echo-limit", "10"], &["--once"]);
    let o = ping(
        &p.ctrl,
        &["--name", "echo", "--count", "50", "--timeout", "5"],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("closed after 10 round trips"), "{err}");
    assert!(p.remote.wait(Duration::from_secs(10)).success());
    let host_err = p.host.stderr();
    assert!(host_err.contains("peer destroyed \"echo\""), "{host_err}");
    // The channel is gone on the host: an endpoint can no longer bind to it.
    let o = ping(
        &p.ctrl,
        &["--name", "echo", "--count", "1", "--timeout", "1"],
    );
    assert!(!o.status.success());
    // (Or the host is already going: the request or connection is refused,
    // or the connection reset.)
    let err = String::from_utf8_lossy(&o.stderr).to_lowercase();
    assert!(
        err.contains("not announced") || err.contains("refused") || err.contains("connect"),
        "{err}"
    );
    // And the host ends once the remote has gone, with a status a
    // supervisor can tell from a requested stop.
    assert_eq!(p.host.wait(Duration::from_secs(10)).code(), Some(1));
    let host_err = p.host.stderr();
    assert!(
        host_err.contains("the link to the remote went down"),
        "{host_err}"
    );
}

#[test]
fn host_destroy_tears_down_remote_channel() {
    let mut p = pair("unix:DIR/ev", &["--exit-on-unbind"], &[]);
    // ATTACH: an announced endpoint (fd endpoints are not, as rpmsg_char's).
    let v = json(&ping(
        &p.ctrl,
        &["--name", "echo", "--count", "10", "--attach", "--json"],
    ));
    assert_eq!(v["count"], 10);
    // Closing the ping's endpoint sends a name-service DESTROY; the remote
    // sees its channel torn down and exits.
    assert!(p.remote.wait(Duration::from_secs(10)).success());
    let err = p.remote.stderr();
    assert!(err.contains("host destroyed its endpoint"), "{err}");
    assert!(err.contains("channel closed"), "{err}");
    drop(p.dir);
}

/// OpenAMP demo mode both ways: iopath plays rpmsg-echo (remote) and
/// rpmsg-echo-ping (host), layout 0x80000 with the unix-socket byte.
#[test]
fn openamp_demo_ping_against_demo_echo() {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("openamp.shm");
    let ev = format!("unix:{}/openamp.event.0", s(dir.path()));
    let mut remote = spawn_remote(dir.path(), s(&shm), &ev, &["--openamp"]);
    let mut host = spawn_host(dir.path(), s(&shm), &ev, &["--openamp-ping"]);
    assert!(
        host.wait(Duration::from_secs(60)).success(),
        "{}",
        host.stderr()
    );
    assert!(
        host.stdout()
            .contains("480 payloads (sizes 1..480) echoed, errors 0"),
        "{}",
        host.stdout()
    );
    // The session ends with a name-service DESTROY: the demo echo exits.
    assert!(
        remote.wait(Duration::from_secs(10)).success(),
        "{}",
        remote.stderr()
    );
    assert!(
        remote.stderr().contains("host destroyed its endpoint"),
        "{}",
        remote.stderr()
    );
}

#[test]
fn openamp_demo_ping_against_plain_remote() {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("openamp.shm");
    let ev = format!("unix:{}/openamp.event.0", s(dir.path()));
    let _remote = spawn_remote(dir.path(), s(&shm), &ev, &["--event-idx"]);
    let mut host = spawn_host(dir.path(), s(&shm), &ev, &["--openamp-ping", "--json"]);
    assert!(
        host.wait(Duration::from_secs(60)).success(),
        "{}",
        host.stderr()
    );
    let v: serde_json::Value = serde_json::from_str(&host.stdout()).unwrap();
    assert_eq!(v["payloads"], 480);
    assert_eq!(v["errors"], 0);
}

#[test]
fn demo_echo_against_host_and_ping_client() {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("openamp.shm");
    let ev = format!("unix:{}/openamp.event.0", s(dir.path()));
    let ctrl = dir.path().join("ctrl");
    let mut remote = spawn_remote(dir.path(), s(&shm), &ev, &["--openamp"]);
    let _host = spawn_host(dir.path(), s(&shm), &ev, &["--ctrl", s(&ctrl)]);
    wait_path(&ctrl);
    let v = json(&ping(&ctrl, &["--openamp", "--json"]));
    assert_eq!(v["count"], 480);
    assert_eq!(v["sizes"], serde_json::json!([17, 496]));
    assert!(
        remote.wait(Duration::from_secs(10)).success(),
        "{}",
        remote.stderr()
    );
}

// ---------------------------------------------------------------------------
// Malformed input. The test process plays a hostile peer with raw writes into
// the shared memory (so it can lie), against a real iopath process.

use iopath_rpmsg::rsc_table::{status, ShmLayout};
use iopath_rpmsg::vring::VringPlacement;

/// `VRING_DESC_F_WRITE`, as a descriptor's u16 flags hold it.
const VRING_DESC_F_WRITE: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_WRITE as u16;
use iopath_rpmsg::wire::{encode_message, parse_message, Endian, NsMsg, NsOp, NS_ADDR};
use iopath_rpmsg::{NotifySpec, SharedMem};
use std::sync::atomic::Ordering;

const E: Endian = Endian::Little;

fn layouts(shm: &SharedMem) -> (VringPlacement, VringPlacement, u64) {
    let t = shm.table(0).unwrap();
    let (pool, _) = t.buffer_pool(shm.len() as u64).unwrap();
    (
        t.vdev.vrings[0].layout().unwrap(),
        t.vdev.vrings[1].layout().unwrap(),
        pool,
    )
}

fn write_desc(shm: &SharedMem, l: &VringPlacement, id: u16, addr: u64, len: u32, flags: u16) {
    let mut d = [0u8; 16];
    d[0..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[12..14].copy_from_slice(&flags.to_le_bytes());
    shm.write(l.desc + 16 * u64::from(id), &d).unwrap();
}

/// Driver side, raw: publish descriptor `id` in the available ring.
fn publish(shm: &SharedMem, l: &VringPlacement, avail: &mut u16, id: u16) {
    let slot = u64::from(*avail % l.num);
    shm.store_u16(l.avail + 4 + 2 * slot, id, Ordering::Relaxed)
        .unwrap();
    *avail = avail.wrapping_add(1);
    shm.store_u16(l.avail + 2, *avail, Ordering::Release)
        .unwrap();
}

/// Driver side, raw: the next used element `(id, len)`, waiting up to 10 s.
fn next_used(shm: &SharedMem, l: &VringPlacement, last: &mut u16) -> (u32, u32) {
    let start = Instant::now();
    while shm.load_u16(l.used + 2, Ordering::Acquire).unwrap() == *last {
        assert!(start.elapsed() < Duration::from_secs(10), "no used buffer");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut e = [0u8; 8];
    shm.read(l.used + 4 + 8 * u64::from(*last % l.num), &mut e)
        .unwrap();
    *last = last.wrapping_add(1);
    (
        u32::from_le_bytes(e[0..4].try_into().unwrap()),
        u32::from_le_bytes(e[4..8].try_into().unwrap()),
    )
}

fn wait_for(p: &Proc, what: &str) {
    let start = Instant::now();
    while !p.stderr().contains(what) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} never logged {what:?}:\n{}",
            p.name,
            p.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn lying_resource_table_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("shm");
    let f = SharedMem::create(&shm, &ShmLayout::openamp_demo()).unwrap();
    // vq1 claims to sit at 0x7f000: 0x2806 bytes would run past the file.
    f.write_u32(68, 0x7f000).unwrap();
    let mut remote = Proc::spawn(
        dir.path(),
        "remote",
        &["rpmsg", "remote", "--shm", s(&shm), "--notify", "poll"],
    );
    let st = remote.wait(Duration::from_secs(10));
    assert_eq!(st.code(), Some(1));
    assert!(
        remote
            .stderr()
            .contains("runs past the 524288-byte shared memory"),
        "{}",
        remote.stderr()
    );
    let mut host = spawn_host(
        dir.path(),
        s(&shm),
        "poll",
        &["--ctrl", s(&dir.path().join("c")), "--timeout", "1"],
    );
    assert_eq!(host.wait(Duration::from_secs(10)).code(), Some(1));
    assert!(host.stderr().contains("runs past"), "{}", host.stderr());
    // An entry offset pointing outside the table.
    f.write_u32(68, 0x8000).unwrap();
    f.write_u32(16, 0x5000).unwrap();
    let mut remote = Proc::spawn(
        dir.path(),
        "remote2",
        &["rpmsg", "remote", "--shm", s(&shm), "--notify", "poll"],
    );
    assert_eq!(remote.wait(Duration::from_secs(10)).code(), Some(1));
    assert!(
        remote.stderr().contains("lies outside"),
        "{}",
        remote.stderr()
    );
}

#[test]
fn hostile_host_against_remote() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shm");
    let ev = format!("unix:{}/ev", s(dir.path()));
    let mut remote = spawn_remote(dir.path(), s(&path), &ev, &["--echo", "echo", "--once"]);
    let n = ev
        .parse::<NotifySpec>()
        .unwrap()
        .connect(Duration::from_secs(10))
        .unwrap();
    let shm = SharedMem::open(&path).unwrap();
    let t = shm.table(0).unwrap();
    let (vq0, vq1, pool) = layouts(&shm);
    // Play the driver: accept NS, post 8 receive buffers, DRIVER_OK.
    shm.write_u32(t.vdev.gfeatures_offset() as u64, 1).unwrap();
    let (mut a0, mut a1, mut u0, mut u1) = (0u16, 0u16, 0u16, 0u16);
    for id in 0..8u16 {
        write_desc(
            &shm,
            &vq0,
            id,
            pool + 512 * u64::from(id),
            512,
            VRING_DESC_F_WRITE,
        );
        publish(&shm, &vq0, &mut a0, id);
    }
    shm.store_u8(t.vdev.status_offset() as u64, status::DRIVER_OK)
        .unwrap();
    n.kick().unwrap();
    let read_msg = |id: u32, len: u32| {
        let mut b = vec![0u8; len as usize];
        shm.read(pool + 512 * u64::from(id), &mut b).unwrap();
        b
    };
    let (id, len) = next_used(&shm, &vq0, &mut u0);
    let b = read_msg(id, len);
    let (h, p) = parse_message(&b, E).unwrap();
    assert_eq!(h.dst, NS_ADDR);
    let ns = NsMsg::parse(p, E).unwrap();
    assert_eq!((ns.name.as_str(), ns.op), ("echo", NsOp::Create));
    let tx = pool + 0x20000;
    let mut msg = Vec::new();
    // 1. A descriptor pointing outside the shared memory.
    write_desc(&shm, &vq1, 0, 0xffff_0000, 64, 0);
    publish(&shm, &vq1, &mut a1, 0);
    n.kick().unwrap();
    wait_for(&remote, "outside the shared memory");
    // 2. A header whose len runs past the buffer.
    encode_message(5000, ns.addr, &[1; 400], 512, E, &mut msg).unwrap();
    shm.write(tx, &msg[..32]).unwrap();
    write_desc(&shm, &vq1, 1, tx, 32, 0);
    publish(&shm, &vq1, &mut a1, 1);
    n.kick().unwrap();
    wait_for(&remote, "runs past the buffer");
    // 3. A device-writable buffer on the host's tx ring.
    write_desc(&shm, &vq1, 2, tx, 64, VRING_DESC_F_WRITE);
    publish(&shm, &vq1, &mut a1, 2);
    n.kick().unwrap();
    wait_for(&remote, "device-writable");
    // All three buffers came back; the remote still echoes.
    for _ in 0..3 {
        next_used(&shm, &vq1, &mut u1);
    }
    encode_message(5000, ns.addr, b"still alive?", 512, E, &mut msg).unwrap();
    shm.write(tx + 512, &msg).unwrap();
    write_desc(&shm, &vq1, 3, tx + 512, msg.len() as u32, 0);
    publish(&shm, &vq1, &mut a1, 3);
    n.kick().unwrap();
    let (id, len) = next_used(&shm, &vq0, &mut u0);
    let b = read_msg(id, len);
    let (h, p) = parse_message(&b, E).unwrap();
    assert_eq!((h.src, h.dst, p), (ns.addr, 5000, &b"still alive?"[..]));
    // 4. An available index that jumps by more than the ring size.
    shm.store_u16(vq1.avail + 2, a1.wrapping_add(1000), Ordering::Release)
        .unwrap();
    n.kick().unwrap();
    // Served one host (--once), which broke the rings: status 1.
    let st = remote.wait(Duration::from_secs(10));
    assert_eq!(st.code(), Some(1), "{st:?}: {}", remote.stderr());
    let err = remote.stderr();
    assert!(err.contains("moved by more than the ring size"), "{err}");
    assert!(err.contains("the host went away"), "{err}");
    assert!(err.contains("malformed 1"), "{err}");
}

#[test]
fn hostile_remote_used_index_jump() {
    hostile_remote_against_host(false);
}

#[test]
fn hostile_remote_used_len_past_buffer() {
    hostile_remote_against_host(true);
}

/// The test plays the remote: good and bad messages, then one lie the host
/// can only answer by dropping the link (its queue refuses a used length
/// past the 512 bytes offered, or a used index that jumps).
fn hostile_remote_against_host(huge_len: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shm");
    let ev = format!("unix:{}/ev", s(dir.path()));
    let spec: NotifySpec = ev.parse().unwrap();
    let shm = SharedMem::create(&path, &ShmLayout::openamp_demo()).unwrap();
    let listener = spec.bind().unwrap();
    let ctrl = dir.path().join("ctrl");
    let mut host = spawn_host(dir.path(), s(&path), &ev, &["--ctrl", s(&ctrl), "--once"]);
    let n = listener.accept().unwrap();
    let t = shm.table(0).unwrap();
    let start = Instant::now();
    while shm.load_u8(t.vdev.status_offset() as u64).unwrap() & status::DRIVER_OK == 0 {
        assert!(start.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(1));
    }
    let (vq0, _, pool) = layouts(&shm);
    // Play the device on vq0: take the host's posted buffers in order.
    let mut next_avail = 0u16;
    let mut used = 0u16;
    let mut put = |payload: Option<&[u8]>, raw: Option<&[u8]>, used_len: Option<u32>| {
        let slot = u64::from(next_avail % vq0.num);
        let id = shm
            .load_u16(vq0.avail + 4 + 2 * slot, Ordering::Acquire)
            .unwrap();
        next_avail = next_avail.wrapping_add(1);
        let mut d = [0u8; 16];
        shm.read(vq0.desc + 16 * u64::from(id), &mut d).unwrap();
        let addr = u64::from_le_bytes(d[0..8].try_into().unwrap());
        assert!(addr >= pool, "host buffers come from the pool");
        let mut m = Vec::new();
        if let Some(p) = payload {
            encode_message(1030, 1024, p, 512, E, &mut m).unwrap();
        }
        let bytes = raw.unwrap_or(&m);
        shm.write(addr, bytes).unwrap();
        let mut e = [0u8; 8];
        e[0..4].copy_from_slice(&u32::from(id).to_le_bytes());
        e[4..8].copy_from_slice(&used_len.unwrap_or(bytes.len() as u32).to_le_bytes());
        shm.write(vq0.used + 4 + 8 * u64::from(used % vq0.num), &e)
            .unwrap();
        used = used.wrapping_add(1);
        shm.store_u16(vq0.used + 2, used, Ordering::Release)
            .unwrap();
        n.kick().unwrap();
    };
    // A good announcement, then lies.
    let ns = NsMsg {
        name: "echo".into(),
        addr: 1030,
        op: NsOp::Create,
    }
    .encode(E)
    .unwrap();
    let mut m = Vec::new();
    encode_message(1030, NS_ADDR, &ns, 512, E, &mut m).unwrap();
    put(None, Some(&m), None);
    wait_for(&host, "peer announced \"echo\" at 1030");
    // 1. Header len past what the device says it wrote.
    encode_message(1030, 1024, &[7; 300], 512, E, &mut m).unwrap();
    put(None, Some(&m), Some(100));
    wait_for(&host, "runs past the buffer");
    // 2. A name-service record without a NUL in its name.
    let mut bad = ns;
    bad[..32].fill(b'x');
    encode_message(1030, NS_ADDR, &bad, 512, E, &mut m).unwrap();
    put(None, Some(&m), None);
    wait_for(&host, "not NUL-terminated");
    // 3. A message for an address nobody has: counted and dropped.
    put(Some(b"nobody"), None, None);
    // 4. The host is still up, and took all four buffers: it posted each
    // back (avail.idx 256 + 4).
    wait_path(&ctrl);
    let start = Instant::now();
    while shm.load_u16(vq0.avail + 2, Ordering::Acquire).unwrap() != 260 {
        assert!(start.elapsed() < Duration::from_secs(10), "host stalled");
        std::thread::sleep(Duration::from_millis(1));
    }
    if huge_len {
        // 5. Used length beyond the 512-byte buffer.
        put(Some(b"x"), None, Some(100_000));
    } else {
        // 5. A used index that jumps.
        shm.store_u16(vq0.used + 2, used.wrapping_add(1000), Ordering::Release)
            .unwrap();
        let _ = n.kick();
    }
    // The broken link ends the host with status 1, its counters printed.
    let st = host.wait(Duration::from_secs(10));
    assert_eq!(st.code(), Some(1), "{st:?}: {}", host.stderr());
    let err = host.stderr();
    let reason = if huge_len {
        "used len 100000"
    } else {
        "used idx jumped"
    };
    assert!(err.contains(reason), "{err}");
    assert!(err.contains("malformed 2 unknown-dst 1"), "{err}");
}

/// Against OpenAMP itself: its Linux echo demo built from source by
/// `scripts/openamp-demo build SRC OUT`, found through `IOPATH_OPENAMP_BIN`.
/// The demo's paths are fixed: /dev/shm/openamp.shm, /tmp/openamp.event.0.
///
/// OpenAMP is in no package registry, so no fresh machine (CI's included)
/// has it: the test is opt-in, listed as ignored rather than passing
/// unrun, and fails when asked for without the demo.
#[test]
#[ignore = "needs OpenAMP's demo: IOPATH_OPENAMP_BIN=DIR cargo test -p iopath --test rpmsg -- --ignored openamp_real"]
fn openamp_real_demo_both_ways() {
    let bin = std::env::var_os("IOPATH_OPENAMP_BIN")
        .map(PathBuf::from)
        .expect("IOPATH_OPENAMP_BIN not set (build OpenAMP's demo with scripts/openamp-demo)");
    let (echo, ping_bin) = (bin.join("rpmsg-echo"), bin.join("rpmsg-echo-ping"));
    assert!(
        echo.exists() && ping_bin.exists(),
        "no rpmsg-echo / rpmsg-echo-ping in {}",
        bin.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let ev = "unix:/tmp/openamp.event.0";
    // OpenAMP's rpmsg-echo (remote, writes the table, listens) against
    // iopath's host playing rpmsg-echo-ping.
    let _ = std::fs::remove_file("/dev/shm/openamp.shm");
    let mut remote = Proc::spawn_program(dir.path(), "oa-echo", &echo, &[]);
    let mut host = spawn_host(dir.path(), "openamp.shm", ev, &["--openamp-ping", "--json"]);
    assert!(
        host.wait(Duration::from_secs(60)).success(),
        "{}",
        host.stderr()
    );
    let v: serde_json::Value = serde_json::from_str(&host.stdout()).unwrap();
    assert_eq!(
        (v["payloads"].as_u64(), v["errors"].as_u64()),
        (Some(480), Some(0))
    );
    // The name-service destroy ends OpenAMP's echo.
    assert!(remote.wait(Duration::from_secs(10)).success());
    let log = remote.stdout() + &remote.stderr();
    assert!(log.contains("Remote endpoint destroy"), "{log}");
    // iopath's remote playing rpmsg-echo against OpenAMP's rpmsg-echo-ping.
    let _ = std::fs::remove_file("/dev/shm/openamp.shm");
    let mut remote = spawn_remote(dir.path(), "openamp.shm", ev, &["--openamp"]);
    let mut ping = Proc::spawn_program(dir.path(), "oa-ping", &ping_bin, &["1"]);
    assert!(
        ping.wait(Duration::from_secs(60)).success(),
        "{}",
        ping.stdout()
    );
    let out = ping.stdout();
    assert!(out.contains("Error count = 0"), "{out}");
    assert_eq!(out.matches("received payload number").count(), 480, "{out}");
    assert!(
        remote.wait(Duration::from_secs(10)).success(),
        "{}",
        remote.stderr()
    );
    // 480 echoes and the announcement; the remote's own DESTROY counts
    // only if it went out before the remote saw OpenAMP's ping exit (it
    // exits right after its DESTROY): a race either side may win.
    let err = remote.stderr();
    assert!(
        err.contains("rx 480 tx 481 ") || err.contains("rx 480 tx 482 "),
        "{err}"
    );
    let _ = std::fs::remove_file("/dev/shm/openamp.shm");
}
