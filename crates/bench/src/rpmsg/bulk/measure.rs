//! The bulk rows' in-process measurements: a host and a remote `Bus` in
//! this process streaming through zero-copy buffers, and the memcpy limit.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use iopath_rpmsg::bufsz::{BufSizes, Convention};
use iopath_rpmsg::rsc_table::ShmLayout;
use iopath_rpmsg::vring::VIRTIO_RING_F_EVENT_IDX;
use iopath_rpmsg::{Bus, Endpoint, EndpointOptions, NotifySpec, SharedMem, ZeroCopyEndpoint};

use super::{BUF, RING};
use crate::error::{check, check_failed};
use crate::place::{on_cpu, Cpus};
use crate::{Error, Result};

const T: Duration = Duration::from_secs(30);

/// Copies `msgs` pieces of `size` bytes, one after the other, into an
/// area as large as a ring's buffers (wrapping round), on this thread;
/// returns the time taken.
pub(super) fn memcpy(msgs: u64, size: usize) -> Duration {
    let src = vec![0x5Au8; size];
    let slots = (RING as usize * BUF as usize / size).max(1);
    let mut dst = vec![0u8; slots * size];
    let t0 = Instant::now();
    for i in 0..msgs as usize {
        let at = (i % slots) * size;
        dst[at..at + size].copy_from_slice(std::hint::black_box(&src));
    }
    std::hint::black_box(&dst);
    t0.elapsed()
}

/// A host bus and a remote bus in this process over 64 KiB buffers: the
/// host's endpoint sends, the remote's zero-copy endpoint receives on a
/// thread of its own.
pub(super) struct BusPair {
    host: Bus,
    remote: Bus,
    tx: Endpoint,
    /// Orders to the receiver: how many messages of what size to take.
    orders: mpsc::Sender<(u64, usize)>,
    /// Whether the receiver took them all, or why it stopped.
    done: mpsc::Receiver<std::result::Result<(), String>>,
    receiver: std::thread::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl BusPair {
    /// Starts the remote (its service thread and the receiver on
    /// `server_cpu`) and the host (its service thread on `client_cpu`).
    pub(super) fn start(
        cpus: &Cpus,
        client_cpu: Option<usize>,
        server_cpu: Option<usize>,
    ) -> Result<BusPair> {
        let dir = tempfile::tempdir().map_err(Error::sys("a temporary directory"))?;
        let path = dir.path().join("shm");
        let size =
            ShmLayout::size_for(RING, BufSizes::both(BUF)).expect("a ring of 64 has a layout");
        let layout = ShmLayout::for_size(size, RING).map_err(Error::layer("bulk layout"))?;
        let mut layout = layout
            .with_buf_sizes(Convention::Linux, BufSizes::both(BUF))
            .map_err(Error::layer("bulk layout"))?;
        layout.dfeatures |= 1 << VIRTIO_RING_F_EVENT_IDX;
        let shm = SharedMem::create(&path, &layout).map_err(Error::layer("bulk shared memory"))?;
        let spec = NotifySpec::Eventfd(dir.path().join("ev"));
        let listener = spec.bind().map_err(Error::layer("bulk notifier"))?;
        let (remote, host) = std::thread::scope(|s| {
            let remote = s.spawn(|| {
                on_cpu(server_cpu, cpus, || {
                    let n = listener.accept_until(Instant::now() + T, T);
                    let n = n.map_err(Error::layer("bulk notifier"))?;
                    let bus = Bus::remote(shm, n, Some(T)).map_err(Error::layer("bulk remote"))?;
                    let rx = bus
                        .create_zero_copy(EndpointOptions::new("bulk"))
                        .map_err(Error::layer("bulk endpoint"))?;
                    Ok((bus, rx))
                })
            });
            let host = on_cpu(client_cpu, cpus, || {
                let n = spec.connect(T).map_err(Error::layer("bulk notifier"))?;
                let shm = SharedMem::open(&path).map_err(Error::layer("bulk shared memory"))?;
                Bus::host(shm, n, iopath_rpmsg::HOST_FEATURES).map_err(Error::layer("bulk host"))
            });
            let panicked = || Err(Error::Check("the bulk remote panicked".into()));
            (remote.join().unwrap_or_else(|_| panicked()), host)
        });
        let ((remote, rx), host) = (remote?, host?);
        let (got, want) = (host.max_payload(), BUF as usize - 16);
        check!(
            got == want,
            "the bulk host negotiated {got} bytes of payload, not {want}"
        );
        let tx = host
            .create(EndpointOptions::new("bulk").dst(rx.addr()).announce(false))
            .map_err(Error::layer("bulk endpoint"))?;
        let (orders, orders_rx) = mpsc::channel::<(u64, usize)>();
        let (done_tx, done) = mpsc::channel();
        let cpus = cpus.clone();
        let receiver = std::thread::Builder::new()
            .name("bulk-receiver".into())
            .spawn(move || {
                let _ = on_cpu(server_cpu, &cpus, || {
                    for (msgs, size) in orders_rx {
                        let _ = done_tx.send(take(&rx, msgs, size));
                    }
                    Ok(())
                });
            })
            .map_err(Error::sys("spawning the bulk receiver"))?;
        Ok(BusPair {
            host,
            remote,
            tx,
            orders,
            done,
            receiver,
            _dir: dir,
        })
    }

    /// Streams `msgs` messages of `size` bytes, each built in place in a
    /// free buffer, until the receiver has read them all; the time taken.
    pub(super) fn stream(&self, msgs: u64, size: usize) -> Result<Duration> {
        let mut payload = vec![0xA5u8; size];
        self.orders
            .send((msgs, size))
            .map_err(|_| Error::Check("the bulk receiver is gone".into()))?;
        let h = self.tx.handle();
        let t0 = Instant::now();
        for seq in 0..msgs {
            stamp(&mut payload, seq);
            let mut b = h
                .alloc(Some(T))
                .map_err(|e| Error::Check(format!("bulk: no buffer for message {seq}: {e}")))?;
            b.write(0, &payload)
                .and_then(|()| b.send(size))
                .map_err(|e| Error::Check(format!("bulk: sending message {seq}: {e}")))?;
        }
        self.done
            .recv_timeout(T)
            .map_err(|_| Error::Check("the bulk receiver did not finish in 30 s".into()))?
            .map_err(Error::Check)?;
        Ok(t0.elapsed())
    }

    pub(super) fn stop(self) {
        drop(self.orders);
        self.host.shutdown();
        self.remote.shutdown();
        let _ = self.receiver.join();
    }
}

/// Puts `seq` at both ends of a message (8 bytes each, fewer if shorter).
fn stamp(m: &mut [u8], seq: u64) {
    let b = seq.to_le_bytes();
    let n = m.len().min(8);
    m[..n].copy_from_slice(&b[..n]);
    let end = m.len();
    m[end - n..].copy_from_slice(&b[..n]);
}

/// Takes `msgs` messages of `size` bytes on `rx`, each read out of its
/// shared buffer once and its stamps checked.
fn take(rx: &ZeroCopyEndpoint, msgs: u64, size: usize) -> std::result::Result<(), String> {
    let mut out = vec![0u8; size];
    let mut want = vec![0u8; size.min(8)];
    for seq in 0..msgs {
        let m = rx
            .recv(Some(T))
            .map_err(|e| format!("message {seq}: {e}"))?;
        if m.len() != size {
            return Err(format!("message {seq}: {} bytes, not {size}", m.len()));
        }
        m.read(0, &mut out)
            .map_err(|e| format!("message {seq}: {e}"))?;
        drop(m);
        let n = want.len();
        want.copy_from_slice(&seq.to_le_bytes()[..n]);
        if out[..n] != want[..] || out[size - n..] != want[..] {
            return Err(format!("message {seq} came out of order or garbled"));
        }
    }
    Ok(())
}
