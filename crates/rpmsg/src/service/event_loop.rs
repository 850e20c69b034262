//! The endpoint service's event loop: one `epoll_wait` for the control
//! connections, the legacy listeners, the endpoints' sockets and the bus
//! notifier's fds, run by the bus thread ([`Hook`]) and, once
//! the link is down, by the pump thread.

use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use rustix::event::epoll;
use tracing::warn;

use super::batch::RecvBatch;
use super::{
    conn, legacy, lock, EptService, Inner, NOTIFIER, RETRY_EVERY, SETTLE_EVENTS, SETTLE_WAITS,
    TAG_CTRL, TAG_LISTENER, WAKE,
};
use crate::bus::{BusHook, HookRun};

impl EptService {
    pub(super) fn pump(&self) {
        let mut buf = RecvBatch::new(self.inner.bus.max_payload());
        loop {
            if self.inner.events.stopped.load(Ordering::SeqCst) {
                return;
            }
            let pass = lock(&self.inner.events.pass);
            let r = self.pump_once(None, &mut buf);
            drop(pass);
            if let Err(e) = r {
                warn!(target: "iopath_rpmsg", "endpoint service: epoll failed: {e}");
                return;
            }
        }
    }

    /// Handles what the epoll set reports, waiting for it up to `timeout`
    /// (`None`: until something comes; messages waiting for a bus buffer
    /// cut any wait to [`RETRY_EVERY`]); returns whether there was
    /// anything, and whether the bus notifier's fds (attached by the
    /// [`Hook`]) were among it.
    pub(super) fn pump_once(
        &self,
        timeout: Option<Duration>,
        buf: &mut RecvBatch,
    ) -> Result<(bool, bool), rustix::io::Errno> {
        if self.inner.events.stopped.load(Ordering::SeqCst) {
            return Ok((false, false));
        }
        let mut space = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 64];
        let mut stalled = !lock(&self.inner.stalled).is_empty();
        let mut retried = false;
        if stalled {
            // Buffers the remote gave back (it kicks for them once a send
            // found none) go to the waiting messages before any wait, and
            // the wait is then only a look.
            let _hold = self.inner.bus.hold_kicks();
            retried = self.retry_stalled();
            stalled = !lock(&self.inner.stalled).is_empty();
        }
        let timeout = if retried {
            Some(Duration::ZERO)
        } else {
            timeout
        };
        let timeout = match (timeout, stalled) {
            (Some(t), true) => Some(t.min(RETRY_EVERY)),
            (None, true) => Some(RETRY_EVERY),
            (t, false) => t,
        };
        let ts = timeout.map(|t| rustix::event::Timespec {
            tv_sec: t.as_secs() as i64,
            tv_nsec: i64::from(t.subsec_nanos()),
        });
        let events = match epoll::wait(&self.inner.events.epoll, &mut space[..], ts.as_ref()) {
            Ok((events, _)) => events,
            Err(rustix::io::Errno::INTR) => return Ok((false, false)),
            Err(e) => return Err(e),
        };
        let worked = !events.is_empty();
        // What this pass puts on the ring goes to the remote with one kick,
        // when the pass ends.
        let _hold = self.inner.bus.hold_kicks();
        let mut kicked = self.dispatch(events, buf, true);
        if !lock(&self.inner.due).stats.is_empty() {
            kicked |= self.settle(buf)?;
            let due = std::mem::take(&mut lock(&self.inner.due).stats);
            let answer = self.stats().encode();
            for c in due {
                conn::answer(&c, &answer);
            }
        }
        let retried = retried | (stalled && self.retry_stalled());
        Ok((worked || retried, kicked))
    }

    /// Handles one `epoll_wait`'s events (the control connections and
    /// legacy listeners only if `ctrl`); returns whether the bus notifier's
    /// fds were among them.
    ///
    /// The endpoints' sockets go first, the control connections and
    /// listeners after them: a hang-up reported with a request is destroyed
    /// before the request's answer puts an fd in flight, since closing a
    /// unix socket while one is in flight queues the kernel's unix garbage
    /// collector (about one cycle in 35 when the answers went first).
    pub(super) fn dispatch(
        &self,
        events: &[epoll::Event],
        buf: &mut RecvBatch,
        ctrl: bool,
    ) -> bool {
        let mut kicked = false;
        let mut later = false;
        for ev in events {
            let token = ev.data.u64();
            if token == NOTIFIER {
                kicked = true;
                continue;
            }
            if token == WAKE {
                let mut b = [0u8; 8];
                let _ = rustix::io::read(&self.inner.events.wake, &mut b);
                let doomed = std::mem::take(&mut lock(&self.inner.due).doomed);
                for id in doomed {
                    self.destroy(id);
                }
                continue;
            }
            let (id, tag) = (token >> 2, token & 3);
            match tag {
                TAG_LISTENER | TAG_CTRL => later = true,
                _ => self.forward(id, ev.flags, buf),
            }
        }
        // Level-triggered: without `ctrl` they are reported again by the
        // next wait.
        if later && ctrl {
            for ev in events {
                let token = ev.data.u64();
                if token == NOTIFIER || token == WAKE {
                    continue;
                }
                let (id, tag) = (token >> 2, token & 3);
                match tag {
                    TAG_LISTENER => legacy::accept(self, id),
                    TAG_CTRL => self.ctrl_readable(id, buf.scratch()),
                    _ => {}
                }
            }
        }
        kicked
    }

    /// Takes what the epoll set has ready, without waiting, up to
    /// [`SETTLE_WAITS`] full waits: the endpoints' messages and hang-ups
    /// (a deferred STATS answer then counts them); control connections
    /// wait for the next pass, so no answer overtakes the deferred ones.
    /// Returns whether the bus notifier's fds were among it.
    pub(super) fn settle(&self, buf: &mut RecvBatch) -> Result<bool, rustix::io::Errno> {
        let mut space = [std::mem::MaybeUninit::<epoll::Event>::uninit(); SETTLE_EVENTS];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let mut kicked = false;
        for _ in 0..SETTLE_WAITS {
            let events = match epoll::wait(&self.inner.events.epoll, &mut space[..], Some(&zero)) {
                Ok((events, _)) => events,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e),
            };
            let full = events.len() == SETTLE_EVENTS;
            kicked |= self.dispatch(events, buf, false);
            if !full {
                break;
            }
        }
        Ok(kicked)
    }
}

/// The event loop, run by the bus thread (see [`Bus::set_hook`]).
pub(super) struct Hook {
    pub(super) inner: Weak<Inner>,
    pub(super) batch: RecvBatch,
}

impl BusHook for Hook {
    fn attach(&mut self, notifier: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        let Some(inner) = self.inner.upgrade() else {
            return Ok(());
        };
        for fd in notifier {
            epoll::add(
                &inner.events.epoll,
                fd,
                epoll::EventData::new_u64(NOTIFIER),
                epoll::EventFlags::IN,
            )?;
        }
        Ok(())
    }

    fn run(&mut self, timeout: Duration) -> HookRun {
        let Some(inner) = self.inner.upgrade() else {
            return HookRun {
                done: true,
                ..HookRun::default()
            };
        };
        if inner.events.stopped.load(Ordering::SeqCst) {
            return HookRun {
                done: true,
                ..HookRun::default()
            };
        }
        // Held by the fallback pump once the link is down: the bus thread
        // is on its way out then.
        let Ok(_pass) = inner.events.pass.try_lock() else {
            return HookRun::default();
        };
        match (EptService {
            inner: Arc::clone(&inner),
        })
        .pump_once(Some(timeout), &mut self.batch)
        {
            Ok((worked, kicked)) => HookRun {
                worked,
                kicked,
                done: false,
            },
            Err(e) => {
                warn!(target: "iopath_rpmsg", "endpoint service: epoll failed: {e}");
                HookRun {
                    done: true,
                    ..HookRun::default()
                }
            }
        }
    }

    fn detach(&mut self, notifier: &[BorrowedFd<'_>]) {
        if let Some(inner) = self.inner.upgrade() {
            for fd in notifier {
                let _ = epoll::delete(&inner.events.epoll, fd);
            }
        }
    }
}
