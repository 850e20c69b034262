//! What the endpoint service holds: its endpoints (each a bus endpoint,
//! the socket the service owns, and who made it), the table they are kept
//! in, and the service's running totals.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use foldhash::HashMap;
use iopath_sys::lock;

use super::limits::{Client, Usage};
use crate::bus::Endpoint;
use crate::ctrl::proto::ServiceStats;

/// Where the bus thread delivers an endpoint's messages.
#[derive(Debug, Default)]
pub(super) struct Sink {
    pub(super) sock: Mutex<Option<Arc<OwnedFd>>>,
}

pub(super) enum Kind {
    Fd,
    Legacy {
        index: u32,
        path: PathBuf,
        listener: OwnedFd,
        owner: u64,
    },
}

pub(super) struct Ept {
    pub(super) bus_ept: Endpoint,
    pub(super) sink: Arc<Sink>,
    pub(super) kind: Kind,
    /// Who made it: counted against its connection and user.
    pub(super) client: Client,
}

impl Kind {
    /// The service's fds an endpoint of this kind may hold: its socket, or
    /// a node's listener and its open connection.
    pub(super) fn fds(&self) -> u64 {
        match self {
            Kind::Fd => 1,
            Kind::Legacy { .. } => 2,
        }
    }
}

/// The endpoints the service holds, by table id, and what they cost
/// their owners. Behind one lock, so STATS is a consistent snapshot.
#[derive(Default)]
pub(super) struct Table {
    pub(super) epts: HashMap<u64, Ept>,
    pub(super) node_indices: BTreeSet<u32>,
    /// Legacy endpoints by the control connection that made them.
    pub(super) by_client: HashMap<u64, Vec<u64>>,
    pub(super) usage: Usage,
}

impl Table {
    /// Adds a live endpoint (its socket already watched).
    pub(super) fn insert(&mut self, id: u64, ept: Ept) {
        self.usage.add(ept.client, ept.kind.fds());
        if let Kind::Legacy { owner, .. } = ept.kind {
            self.by_client.entry(owner).or_default().push(id);
        }
        self.epts.insert(id, ept);
    }

    /// Takes entry `id` out, with its node index and its owner's count.
    pub(super) fn remove(&mut self, id: u64) -> Option<Ept> {
        let ept = self.epts.remove(&id)?;
        self.usage.remove(ept.client, ept.kind.fds());
        if let Kind::Legacy { index, owner, .. } = &ept.kind {
            self.node_indices.remove(index);
            if let Some(v) = self.by_client.get_mut(owner) {
                v.retain(|&x| x != id);
                if v.is_empty() {
                    self.by_client.remove(owner);
                }
            }
        }
        Some(ept)
    }

    /// Counts what is held into `s`.
    pub(super) fn count(&self, s: &mut ServiceStats) {
        for e in self.epts.values() {
            match e.kind {
                Kind::Fd => s.fd_endpoints += 1,
                Kind::Legacy { .. } => {
                    s.legacy_endpoints += 1;
                    if lock(&e.sink.sock).is_some() {
                        s.open_nodes += 1;
                    }
                }
            }
        }
    }
}

/// The service's running totals.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) created: AtomicU64,
    pub(super) destroyed: AtomicU64,
    pub(super) bad_clients: AtomicU64,
    pub(super) oversize: AtomicU64,
    pub(super) too_large: AtomicU64,
    pub(super) dropped: AtomicU64,
    pub(super) msgs: AtomicU64,
    pub(super) clients: AtomicU32,
}

impl Counters {
    /// Copies the totals into `s`.
    pub(super) fn count(&self, s: &mut ServiceStats) {
        s.clients = self.clients.load(Ordering::Relaxed);
        s.created = self.created.load(Ordering::Relaxed);
        s.destroyed = self.destroyed.load(Ordering::Relaxed);
        s.bad_clients = self.bad_clients.load(Ordering::Relaxed);
        s.oversize = self.oversize.load(Ordering::Relaxed);
        s.dropped = self.dropped.load(Ordering::Relaxed);
        s.too_large = self.too_large.load(Ordering::Relaxed);
        s.msgs = self.msgs.load(Ordering::Relaxed);
    }
}
