//! Host and remote buses in one process (two threads) over a real
//! shared-memory file and real notifiers; the two-process tests live in the
//! CLI crate.

use std::sync::mpsc;
use std::time::Duration;

use iopath_rpmsg::rsc_table::ShmLayout;
use iopath_rpmsg::vring::VIRTIO_RING_F_EVENT_IDX;
use iopath_rpmsg::wire::MAX_PAYLOAD;
use iopath_rpmsg::{
    Bus, BusError, EndpointOptions, Event, InPlace, NotifySpec, SharedMem, HOST_FEATURES,
};

const T: Duration = Duration::from_secs(10);

fn pattern(size: usize, seed: usize) -> Vec<u8> {
    (0..size).map(|i| (i * 7 + seed * 13) as u8).collect()
}

/// A remote and a host on one new shared memory (`EVENT_IDX` offered when
/// `event_idx`), notifying as `spec` says (given a path in the new
/// directory); `serve` creates the remote's endpoints before the host
/// starts. Returns host, remote and the directory holding the memory.
fn buses(
    spec: impl FnOnce(std::path::PathBuf) -> NotifySpec,
    event_idx: bool,
    serve: impl FnOnce(&Bus) + Send + 'static,
) -> (Bus, Bus, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shm");
    let mut layout = ShmLayout::openamp_demo();
    if event_idx {
        layout.dfeatures |= 1 << VIRTIO_RING_F_EVENT_IDX;
    }
    let shm = SharedMem::create(&path, &layout).unwrap();
    let spec = spec(dir.path().join("n"));
    let listener = spec.bind().unwrap();
    let remote = std::thread::spawn(move || {
        let bus = Bus::remote(shm, listener.accept().unwrap(), Some(T)).unwrap();
        serve(&bus);
        bus
    });
    let n = spec.connect(T).unwrap();
    let host = Bus::host(SharedMem::open(&path).unwrap(), n, HOST_FEATURES).unwrap();
    let remote = remote.join().unwrap();
    (host, remote, dir)
}

/// Starts a remote echoing on "echo" and a host; returns both buses and the
/// channel to learn when the remote saw its service unbound.
fn pair(spec: NotifySpec, event_idx: bool) -> (Bus, Bus, mpsc::Receiver<u32>, tempfile::TempDir) {
    let (unbound_tx, unbound_rx) = mpsc::channel();
    let (host, remote, dir) = buses(
        move |_| spec,
        event_idx,
        move |bus| {
            let ep = bus
                .create_with_callback(EndpointOptions::new("echo"), move |ep, ev| match ev {
                    Event::Message(m) => ep.send_to(m.src, &m.data, Some(T)).unwrap(),
                    Event::Unbound { addr } => {
                        let _ = unbound_tx.send(addr);
                    }
                    Event::LinkDown(_) => {}
                })
                .unwrap();
            std::mem::forget(ep);
        },
    );
    (host, remote, unbound_rx, dir)
}

fn echo_all_sizes(spec: NotifySpec, event_idx: bool) {
    let (host, remote, unbound, _dir) = pair(spec, event_idx);
    assert!(
        remote.has_ns() && host.has_ns(),
        "name service negotiated ({})",
        host.notifier_kind()
    );
    let ch = host.wait_channel("echo", T).unwrap();
    let ep = host
        .create(EndpointOptions::new("echo").dst(ch.addr))
        .unwrap();
    for size in 1..=MAX_PAYLOAD {
        let data = pattern(size, size);
        ep.send(&data).unwrap();
        let m = ep.recv(Some(T)).unwrap();
        assert_eq!(m.src, ch.addr);
        assert_eq!(m.data, data, "size {size}");
    }
    // Too large is refused before touching a buffer.
    assert!(matches!(
        ep.send(&[0; MAX_PAYLOAD + 1]),
        Err(BusError::TooLarge { .. })
    ));
    // A burst larger than the ring (256) with blocking sends.
    let n = 1000;
    let h = ep.handle();
    let sender = std::thread::spawn(move || {
        for i in 0..n {
            h.send(&pattern(64, i)).unwrap();
        }
    });
    for i in 0..n {
        assert_eq!(ep.recv(Some(T)).unwrap().data, pattern(64, i));
    }
    sender.join().unwrap();
    let addr = ep.addr();
    drop(ep);
    // The host's destroy unbinds the remote's echo endpoint.
    assert_eq!(unbound.recv_timeout(T).unwrap(), addr);
    let s = host.stats();
    assert_eq!(s.rx_malformed + s.rx_refused + s.rx_unknown_dst, 0);
    assert_eq!(remote.stats().rx_malformed, 0);
    host.shutdown();
    assert!(remote.wait_down(Some(T)).is_some());
    remote.shutdown();
}

#[test]
fn echo_eventfd() {
    echo_all_sizes(
        NotifySpec::Eventfd(tempfile::tempdir().unwrap().keep().join("n")),
        false,
    );
}

#[test]
fn echo_unix_event_idx() {
    echo_all_sizes(
        NotifySpec::Unix(tempfile::tempdir().unwrap().keep().join("n")),
        true,
    );
}

#[test]
fn echo_poll() {
    echo_all_sizes(NotifySpec::Poll, false);
}

/// Zero-copy both ways: the remote echoes from its held rx buffer straight
/// into a host buffer it took from vq0; the host builds messages in place
/// and reads echoes from its rx buffers, holding many at once.
#[test]
fn zero_copy_both_roles() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shm");
    let shm = SharedMem::create(&path, &ShmLayout::openamp_demo()).unwrap();
    let spec = NotifySpec::Eventfd(dir.path().join("n"));
    let listener = spec.bind().unwrap();
    let remote = std::thread::spawn(move || {
        let bus = Bus::remote(shm, listener.accept().unwrap(), Some(T)).unwrap();
        let ep = bus.create_zero_copy(EndpointOptions::new("zc")).unwrap();
        let mut n = 0;
        loop {
            let m = match ep.recv(Some(T)) {
                Ok(m) => m,
                Err(BusError::Unbound) => break,
                Err(e) => panic!("{e}"),
            };
            let mut out = ep.alloc(Some(T)).unwrap();
            assert!(out.capacity() >= m.len());
            let mut tmp = vec![0u8; m.len()];
            m.read(0, &mut tmp).unwrap();
            out.write(0, &tmp).unwrap();
            let src = m.src();
            drop(m);
            out.send_to(src, tmp.len()).unwrap();
            n += 1;
        }
        (bus, n)
    });
    let n = spec.connect(T).unwrap();
    let host = Bus::host(SharedMem::open(&path).unwrap(), n, HOST_FEATURES).unwrap();
    let ch = host.wait_channel("zc", T).unwrap();
    let ep = host
        .create_zero_copy(EndpointOptions::new("zc").dst(ch.addr))
        .unwrap();
    // Every size, built in place; an unsent buffer is kept for later.
    drop(ep.alloc(None).unwrap());
    for size in 1..=MAX_PAYLOAD {
        let mut b = ep.alloc(Some(T)).unwrap();
        assert_eq!(b.capacity(), MAX_PAYLOAD);
        assert!(matches!(
            b.write(MAX_PAYLOAD, &[1]),
            Err(BusError::TooLarge { .. })
        ));
        b.write(0, &pattern(size, 3)).unwrap();
        b.send(size).unwrap();
        let m = ep.recv(Some(T)).unwrap();
        assert_eq!((m.src(), m.len()), (ch.addr, size));
        assert_eq!(m.to_vec(), pattern(size, 3), "size {size}");
        assert!(m.read(size - 1, &mut [0; 2]).is_err());
    }
    // Hold 100 echoes at once (the remote keeps echoing into fresh host
    // buffers), then release them all.
    for i in 0..100 {
        ep.send(&pattern(32, i)).unwrap();
    }
    let held: Vec<_> = (0..100).map(|_| ep.recv(Some(T)).unwrap()).collect();
    for (i, m) in held.iter().enumerate() {
        assert_eq!(m.to_vec(), pattern(32, i));
    }
    drop(held);
    ep.send(b"after").unwrap();
    assert_eq!(ep.recv(Some(T)).unwrap().to_vec(), b"after");
    let s = host.stats();
    assert_eq!(s.rx_malformed + s.rx_refused, 0);
    drop(ep);
    let (remote, echoed) = remote.join().unwrap();
    assert_eq!(echoed, MAX_PAYLOAD + 101);
    host.shutdown();
    remote.shutdown();
}

/// An in-place endpoint on the remote reads each message in its shared
/// buffer and answers from the callback; far more messages than the ring
/// has buffers go through, so every buffer went back to the host. Sends
/// made under a kick hold arrive too, with fewer kicks than messages.
#[test]
fn in_place_callback_and_held_kicks() {
    let (seen_tx, seen) = mpsc::channel::<(u32, Vec<u8>)>();
    let (ev_tx, evs) = mpsc::channel::<String>();
    let (host, remote, _dir) = buses(NotifySpec::Eventfd, true, move |bus| {
        let ep = bus
            .create_in_place(EndpointOptions::new("inplace"), move |ep, m| match m {
                InPlace::Message(b) => {
                    let mut data = vec![0u8; b.len()];
                    b.read(0, &mut data).unwrap();
                    assert!(b.read(b.len(), &mut [0]).is_err());
                    if data == b"ask" {
                        ep.send_to(b.src(), b"answer", Some(T)).unwrap();
                    }
                    seen_tx.send((b.src(), data)).unwrap();
                }
                InPlace::Event(e) => ev_tx.send(format!("{e:?}")).unwrap(),
            })
            .unwrap();
        std::mem::forget(ep);
    });
    let ch = host.wait_channel("inplace", T).unwrap();
    let ep = host
        .create(EndpointOptions::new("inplace").dst(ch.addr))
        .unwrap();
    let ring = ShmLayout::openamp_demo().num as usize;
    for i in 0..4 * ring {
        ep.send(&pattern(1 + i % MAX_PAYLOAD, i)).unwrap();
        let (src, data) = seen.recv_timeout(T).unwrap();
        assert_eq!((src, data), (ep.addr(), pattern(1 + i % MAX_PAYLOAD, i)));
    }
    ep.send(b"ask").unwrap();
    assert_eq!(seen.recv_timeout(T).unwrap().1, b"ask");
    assert_eq!(ep.recv(Some(T)).unwrap().data, b"answer");
    // A batch under a hold: no kick while it is held, at most one when it
    // goes, and all of it arrives in order.
    let kicks = host.stats().kicks;
    let batch = ring / 2;
    let hold = host.hold_kicks();
    for i in 0..batch {
        ep.send(&pattern(100, i)).unwrap();
    }
    assert_eq!(host.stats().kicks, kicks);
    drop(hold);
    assert!(host.stats().kicks - kicks <= 1, "{:?}", host.stats());
    for i in 0..batch {
        assert_eq!(seen.recv_timeout(T).unwrap().1, pattern(100, i));
    }
    host.shutdown();
    // Events reach the callback too: the host's endpoint going (it bound
    // the remote's), then the link.
    let ev = evs.recv_timeout(T).unwrap();
    assert_eq!(ev, format!("Unbound {{ addr: {} }}", ep.addr()));
    let ev = evs.recv_timeout(T).unwrap();
    assert!(ev.starts_with("LinkDown"), "{ev}");
    remote.shutdown();
}

/// A client streaming through an endpoint fd far faster than the remote
/// takes it: the endpoint service receives straight into the ring's
/// buffers, waits when the ring is full, and every message reaches the
/// remote once, in order, byte for byte (an in-place checker on the
/// remote compares each with what was sent).
#[test]
fn endpoint_fd_stream_arrives_whole_and_in_order() {
    use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_RDWR};
    use iopath_rpmsg::ctrl::{CtrlClient, EptInfo};
    use iopath_rpmsg::CtrlServer;
    const N: usize = 3000;
    let size_of = |i: usize| 1 + (i * 37) % MAX_PAYLOAD;
    let (host, remote, dir) = buses(NotifySpec::Eventfd, true, move |bus| {
        let (mut good, mut next) = (0u64, 0usize);
        let ep = bus
            .create_in_place(EndpointOptions::new("check"), move |ep, m| {
                let InPlace::Message(b) = m else { return };
                let mut data = vec![0u8; b.len()];
                b.read(0, &mut data).unwrap();
                if data == b"SYNC" {
                    ep.send_to(b.src(), &good.to_le_bytes(), Some(T)).unwrap();
                    return;
                }
                if data == pattern(size_of(next), next) {
                    good += 1;
                }
                next += 1;
            })
            .unwrap();
        std::mem::forget(ep);
    });
    let ctrl = dir.path().join("ctrl");
    let _server = CtrlServer::start(host.clone(), &ctrl).unwrap();
    host.wait_channel("check", T).unwrap();
    let c = CtrlClient::connect(&ctrl).unwrap();
    let ep = c
        .create_ept_fd(&EptInfo::new("check"), O_RDWR | O_CLOEXEC)
        .unwrap();
    for i in 0..N {
        ep.send(&pattern(size_of(i), i)).unwrap();
    }
    ep.send(b"SYNC").unwrap();
    let mut back = [0u8; 8];
    assert_eq!(ep.recv_timeout(&mut back, T).unwrap(), Some(8));
    assert_eq!(u64::from_le_bytes(back), N as u64);
    let st = c.stats().unwrap();
    assert_eq!((st.dropped, st.too_large, st.oversize), (0, 0, 0), "{st:?}");
    drop(ep);
    host.shutdown();
    remote.shutdown();
}

/// The shared memory can be a memfd (a heap `Buffer`) instead of a file:
/// both sides map the same fd.
#[test]
fn memfd_shared_memory() {
    use iopath_heap::{Heap, HugePages, MemfdHeap};
    let layout = ShmLayout::openamp_demo();
    let buf = MemfdHeap::new(HugePages::None)
        .alloc(layout.shm_size as usize)
        .unwrap();
    buf.write_at(0, &layout.table()).unwrap();
    let remote_shm = SharedMem::from_buffer(buf.clone()).unwrap();
    let host_shm = SharedMem::from_buffer(buf).unwrap();
    let spec = NotifySpec::Poll;
    let remote = std::thread::spawn(move || {
        let bus = Bus::remote(remote_shm, spec.bind().unwrap().accept().unwrap(), Some(T)).unwrap();
        let ep = bus
            .create_with_callback(EndpointOptions::new("echo"), |ep, ev| {
                if let Event::Message(m) = ev {
                    ep.send_to(m.src, &m.data, Some(T)).unwrap();
                }
            })
            .unwrap();
        (bus, ep)
    });
    let host = Bus::host(
        host_shm,
        NotifySpec::Poll.connect(T).unwrap(),
        HOST_FEATURES,
    )
    .unwrap();
    let ch = host.wait_channel("echo", T).unwrap();
    let ep = host
        .create(EndpointOptions::new("echo").dst(ch.addr))
        .unwrap();
    for size in [1, 100, MAX_PAYLOAD] {
        ep.send(&pattern(size, 9)).unwrap();
        assert_eq!(ep.recv(Some(T)).unwrap().data, pattern(size, 9));
    }
    let (remote, rep) = remote.join().unwrap();
    drop((ep, rep));
    host.shutdown();
    remote.shutdown();
}

/// On a polling bus the spinning bus thread also runs the endpoint
/// service's event loop; once the link is down that thread stops, and a
/// pump thread must take over in a process that lives on: endpoints hang
/// up, and control requests, on old and new connections, are answered with
/// EPIPE instead of never.
#[test]
fn endpoint_service_answers_after_a_polling_link_goes_down() {
    use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_RDWR};
    use iopath_rpmsg::ctrl::{CtrlClient, CtrlError, EptInfo};
    use iopath_rpmsg::wire::ADDR_ANY;
    use iopath_rpmsg::CtrlServer;
    let (host, _remote, _unbound, dir) = pair(NotifySpec::Poll, false);
    let ctrl = dir.path().join("ctrl");
    let _server = CtrlServer::start(host.clone(), &ctrl).unwrap();
    let c = CtrlClient::connect(&ctrl).unwrap();
    host.wait_channel("echo", T).unwrap();
    let ep = c
        .create_ept_fd(&EptInfo::new("echo"), O_RDWR | O_CLOEXEC)
        .unwrap();
    assert_ne!(ep.info().dst, ADDR_ANY);
    let msg = pattern(100, 5);
    ep.send(&msg).unwrap();
    let mut back = [0u8; 512];
    let n = ep.recv_timeout(&mut back, T).unwrap().unwrap();
    assert_eq!(&back[..n], &msg[..]);

    // The device reports that it needs a reset: the host's bus goes down.
    let shm = SharedMem::open(&dir.path().join("shm")).unwrap();
    let at = shm.table(0).unwrap().vdev.status_offset() as u64;
    let status = shm.load_u8(at).unwrap();
    shm.store_u8(
        at,
        status | iopath_rpmsg::rsc_table::status::DEVICE_NEEDS_RESET,
    )
    .unwrap();
    assert!(
        host.wait_down(Some(T)).is_some(),
        "the host's bus stayed up"
    );
    let pipe = |e: CtrlError| match e {
        CtrlError::Refused { errno } => errno,
        CtrlError::Io { source, .. } => source.raw_os_error().unwrap_or(0),
        other => panic!("{other}"),
    };
    // The endpoint hangs up (the pump took its EOF over).
    let e = ep.recv_timeout(&mut back, T).unwrap_err();
    assert_eq!(pipe(e), libc::EPIPE);
    let e = c.create_ept_fd(&EptInfo::new("echo"), O_RDWR).unwrap_err();
    assert_eq!(pipe(e), libc::EPIPE);
    let late = CtrlClient::connect(&ctrl).unwrap();
    let e = late.create_ept(&EptInfo::new("echo")).unwrap_err();
    assert_eq!(pipe(e), libc::EPIPE);
    drop(ep);
    let deadline = std::time::Instant::now() + T;
    while late.stats().unwrap().endpoints() != 0 {
        assert!(std::time::Instant::now() < deadline, "endpoint never freed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A client that closes its endpoint fds and then asks STATS finds them
/// freed in that very answer (as a kernel endpoint is gone once its last
/// close returns): the service looks at the hang-ups before it answers,
/// one close or a burst of them, interleaved with other requests.
#[test]
fn stats_after_closing_endpoint_fds_counts_them_freed() {
    use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_RDWR};
    use iopath_rpmsg::ctrl::{CtrlClient, EptInfo};
    use iopath_rpmsg::CtrlServer;
    let nd = tempfile::tempdir().unwrap();
    let (host, _remote, _unbound, dir) = pair(NotifySpec::Eventfd(nd.path().join("n")), false);
    let ctrl = dir.path().join("ctrl");
    let _server = CtrlServer::start(host.clone(), &ctrl).unwrap();
    let c = CtrlClient::connect(&ctrl).unwrap();
    host.wait_channel("echo", T).unwrap();
    assert_eq!(c.stats().unwrap().endpoints(), 0);
    let mut created = 0;
    for burst in [1u32, 40, 200] {
        let eps: Vec<_> = (0..burst)
            .map(|_| {
                c.create_ept_fd(&EptInfo::new("echo"), O_RDWR | O_CLOEXEC)
                    .unwrap()
            })
            .collect();
        created += u64::from(burst);
        let st = c.stats().unwrap();
        assert_eq!((st.fd_endpoints, st.created), (burst, created), "{st:?}");
        drop(eps);
        let st = c.stats().unwrap();
        assert_eq!((st.fd_endpoints, st.destroyed), (0, created), "{st:?}");
    }
    for _ in 0..100 {
        drop(
            c.create_ept_fd(&EptInfo::new("echo"), O_RDWR | O_CLOEXEC)
                .unwrap(),
        );
        created += 1;
        let st = c.stats().unwrap();
        assert_eq!((st.endpoints(), st.destroyed), (0, created), "{st:?}");
    }
}

extern "C" fn on_sigusr1(_: libc::c_int) {}

/// Control requests survive signals: a handler installed without
/// `SA_RESTART` (libFuzzer's timer, a program's own) makes a blocking
/// recv fail with EINTR, which the client must retry, not report. Found
/// by the `ctrl` fuzz target: "the service answers another client: recv:
/// Interrupted system call".
#[test]
fn control_requests_survive_a_signal_storm() {
    use iopath_rpmsg::ctrl::CtrlClient;
    use iopath_rpmsg::CtrlServer;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let (host, _remote, _unbound, dir) = pair(NotifySpec::Poll, false);
    let ctrl = dir.path().join("ctrl");
    let _server = CtrlServer::start(host.clone(), &ctrl).unwrap();
    // SAFETY: a zeroed sigaction is valid; the handler does nothing, so it
    // is async-signal-safe; no SA_RESTART, so blocking calls see EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigusr1 as *const () as usize;
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() };
    let stop = Arc::new(AtomicBool::new(false));
    let storm = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: `me` is the test thread, alive until `stop` is
                // set and this thread joined.
                unsafe { libc::pthread_kill(me, libc::SIGUSR1) };
                sent += 1;
                std::thread::sleep(Duration::from_micros(20));
            }
            sent
        })
    };
    let mut answered = 0;
    for _ in 0..2000 {
        let c = CtrlClient::connect(&ctrl).expect("connect under signals");
        let st = c.stats().expect("stats under signals");
        assert_eq!(st.endpoints(), 0);
        answered += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let sent = storm.join().unwrap();
    assert_eq!(answered, 2000);
    assert!(sent > 100, "only {sent} signals were sent");
}
