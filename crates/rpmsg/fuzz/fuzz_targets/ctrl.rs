//! The control-socket protocol into a running endpoint service, as a
//! hostile local client speaks it: any request (well-formed headers with
//! any body, raw bytes), cut short or padded, with fds attached, read or
//! never read, shut down halfway. The service must keep serving others:
//! afterwards a fresh client's STATS is answered, and once the hostile
//! client is gone every endpoint it made is freed. (An ATTACH that waits
//! for a channel ends with its connection, so runs do not pile threads up.)
#![no_main]

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use iopath_rpmsg::ctrl::{CtrlClient, MAGIC, VERSION};
use iopath_rpmsg::rsc_table::ShmLayout;
use iopath_rpmsg::{Bus, CtrlServer, EndpointOptions, Event, NotifySpec, SharedMem, HOST_FEATURES};
use libfuzzer_sys::fuzz_target;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags, Shutdown, SocketAddrUnix, SocketFlags, SocketType,
};

#[derive(Debug, Arbitrary)]
enum Action {
    /// One packet: `"IOPR" ver op` + body when `op` is given, else raw.
    Send {
        op: Option<(bool, u16)>,
        body: Vec<u8>,
        /// Cut the packet to this many bytes.
        cut: Option<u8>,
        /// Attach this many fds (0..=3).
        fds: u8,
    },
    /// Read (and drop) whatever answers and fds are queued.
    Drain,
    /// Shut the writing side.
    ShutWrite,
}

#[derive(Debug, Arbitrary)]
struct Input {
    actions: Vec<Action>,
}

struct World {
    ctrl: PathBuf,
    _host: Bus,
    _remote: Bus,
    _server: CtrlServer,
}

/// The world's scratch directory (its shared memory, notifier and control
/// socket), removed when the fuzzer exits.
static DIR: OnceLock<PathBuf> = OnceLock::new();

/// Removes [`DIR`]: registered with `atexit`, because libFuzzer ends a
/// run with `exit()`, which drops no static (the world lives in one);
/// without it every run would leave its 512 KiB directory in the
/// temporary directory.
extern "C" fn remove_dir() {
    if let Some(d) = DIR.get() {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// One remote (echo service "echo") and one host with a control socket,
/// in this process, for every run.
fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("iopath-fuzz-ctrl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if DIR.set(dir.clone()).is_ok() {
            // SAFETY: `remove_dir` is a plain `extern "C"` function taking
            // nothing; it only reads a static set above and ignores every
            // error, so it cannot unwind into the C caller.
            unsafe { libc::atexit(remove_dir) };
        }
        let shm_path = dir.join("shm");
        let shm = SharedMem::create(&shm_path, &ShmLayout::openamp_demo()).unwrap();
        let spec = NotifySpec::Eventfd(dir.join("ev"));
        let listener = spec.bind().unwrap();
        let remote = std::thread::spawn(move || {
            let n = listener.accept().unwrap();
            let bus = Bus::remote(shm, n, Some(Duration::from_secs(10))).unwrap();
            let ep = bus
                .create_with_callback(EndpointOptions::new("echo"), |ep, ev| {
                    if let Event::Message(m) = ev {
                        let _ = ep.send_to(m.src, &m.data, Some(Duration::from_secs(1)));
                    }
                })
                .unwrap();
            std::mem::forget(ep);
            bus
        });
        let n = spec.connect(Duration::from_secs(10)).unwrap();
        let host = Bus::host(SharedMem::open(&shm_path).unwrap(), n, HOST_FEATURES).unwrap();
        let remote = remote.join().unwrap();
        host.wait_channel("echo", Duration::from_secs(10)).unwrap();
        let ctrl = dir.join("ctrl");
        let server = CtrlServer::start(host.clone(), &ctrl).unwrap();
        World {
            ctrl,
            _host: host,
            _remote: remote,
            _server: server,
        }
    })
}

fn drain(c: &OwnedFd) {
    let mut buf = [0u8; 1024];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    loop {
        let mut anc = RecvAncillaryBuffer::new(&mut space);
        match rustix::net::recvmsg(
            c,
            &mut [IoSliceMut::new(&mut buf)],
            &mut anc,
            RecvFlags::DONTWAIT,
        ) {
            // Received fds (endpoints) are dropped here: closed.
            Ok(r) if r.bytes > 0 => drop(anc.drain().count()),
            _ => return,
        }
    }
}

fuzz_target!(|i: Input| {
    let w = world();
    let c = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::connect(&c, &SocketAddrUnix::new(&w.ctrl).unwrap()).unwrap();
    let null = std::fs::File::open("/dev/null").unwrap();
    for a in i.actions.iter().take(32) {
        match a {
            Action::Send { op, body, cut, fds } => {
                let mut p = Vec::new();
                if let Some((good_version, op)) = *op {
                    p.extend_from_slice(&MAGIC);
                    let v = if good_version { VERSION } else { VERSION + 1 };
                    p.extend_from_slice(&v.to_le_bytes());
                    p.extend_from_slice(&op.to_le_bytes());
                }
                p.extend_from_slice(&body[..body.len().min(600)]);
                if let Some(n) = cut {
                    p.truncate(usize::from(*n));
                }
                let dups: Vec<OwnedFd> = (0..fds % 4)
                    .map(|_| rustix::io::dup(&null).unwrap())
                    .collect();
                let borrowed: Vec<_> = dups.iter().map(|f| f.as_fd()).collect();
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
                let mut anc = SendAncillaryBuffer::new(&mut space);
                if !borrowed.is_empty() {
                    anc.push(SendAncillaryMessage::ScmRights(&borrowed));
                }
                let _ = rustix::net::sendmsg(
                    &c,
                    &[IoSlice::new(&p)],
                    &mut anc,
                    SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
                );
            }
            Action::Drain => drain(&c),
            Action::ShutWrite => {
                let _ = rustix::net::shutdown(&c, Shutdown::Write);
            }
        }
    }
    drain(&c);
    drop(c);
    // Another client is served, and the hostile one's endpoints go.
    let start = Instant::now();
    loop {
        let st = CtrlClient::connect(&w.ctrl)
            .and_then(|o| o.stats())
            .expect("the service answers another client");
        if st.endpoints() == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "endpoints of a gone client not freed: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
});
