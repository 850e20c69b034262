//! What one client may hold of the endpoint service: at most N endpoints
//! per control connection and per user, and never the last fds of the
//! service, so one client that creates endpoints and keeps them exhausts
//! only itself. A refused creation is that client's own error:
//!
//! ```text
//!  its connection holds max_per_client ──► EMFILE  (its own open-file limit)
//!  its uid holds max_per_uid           ──► ENOSPC  (no room left for that user)
//!  the service's fds down to RESERVE   ──► ENFILE  (the service's own limit)
//! ```
//!
//! An fd endpoint outlives the connection that made it (the client keeps
//! the fd), so it counts against that connection and user until it is
//! destroyed.

use foldhash::HashMap;
use iopath_sys::limits::{fd_limit, open_fds};

/// Fds the service never gives to endpoints: accepting a control
/// connection, a legacy node's open, the bus's own work still get theirs.
pub(super) const RESERVE: u64 = 64;

/// Endpoints one control connection may hold by default: 1024 is the
/// soft open-file limit a process starts with on Linux, so a client holds
/// as many endpoints here as it could hold `/dev/rpmsgN` fds of the kernel
/// without raising its own limit.
pub(super) const DEFAULT_PER_CLIENT: u32 = 1024;

/// Endpoints one user may hold by default over all its connections: four
/// clients' worth, which keeps a user's share of the service's fds (hard
/// limit 524,288 under systemd, 1,048,576 elsewhere) at a few thousand, so
/// hundreds of users fit before the reserve is reached.
pub(super) const DEFAULT_PER_UID: u32 = 4 * DEFAULT_PER_CLIENT;

/// Who asked for an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Client {
    /// The control connection.
    pub conn: u64,
    /// Its peer's uid.
    pub uid: u32,
}

/// The bounds in force.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub per_client: u32,
    pub per_uid: u32,
    /// Fds endpoints may use in all.
    pub fd_budget: u64,
}

impl Limits {
    /// `per_client`/`per_uid` as given, or by default [`DEFAULT_PER_CLIENT`]
    /// and [`DEFAULT_PER_UID`] within the fd budget: the open-file limit
    /// less the fds open now, the spares and the reserve. By default one
    /// user never gets more than a quarter of the budget in endpoints (half
    /// its fds, as a legacy endpoint costs two), so under a small limit
    /// (`ulimit -n 1024`) the others still find room; bounds given
    /// explicitly are the operator's, held only by the reserve. By default
    /// one connection holds at most a quarter of its user's bound, so one
    /// client that keeps its endpoints leaves room for the same user's
    /// other clients too.
    pub fn new(per_client: Option<u32>, per_uid: Option<u32>, spare_fds: u64) -> Self {
        let fd_budget = fd_limit().saturating_sub(open_fds() + spare_fds + RESERVE);
        Self::within(per_client, per_uid, fd_budget)
    }

    /// [`Limits::new`] for a given fd budget.
    fn within(per_client: Option<u32>, per_uid: Option<u32>, fd_budget: u64) -> Self {
        let share = u32::try_from(fd_budget / 4).unwrap_or(u32::MAX).max(1);
        let per_uid = per_uid.unwrap_or(DEFAULT_PER_UID.min(share));
        Limits {
            per_client: per_client.unwrap_or(DEFAULT_PER_CLIENT.min(per_uid / 4).max(1)),
            per_uid,
            fd_budget,
        }
    }
}

/// What is held, by connection and by user, and the fds it costs.
#[derive(Debug, Default)]
pub(super) struct Usage {
    per_conn: HashMap<u64, u32>,
    per_uid: HashMap<u32, u32>,
    fds: u64,
}

impl Usage {
    /// Whether `client` may add an endpoint costing `fds` while `conns`
    /// control connections are open; the errno if not.
    pub fn check(&self, l: &Limits, client: Client, fds: u64, conns: u64) -> Result<(), i32> {
        if self.per_conn.get(&client.conn).copied().unwrap_or(0) >= l.per_client {
            return Err(libc::EMFILE);
        }
        if self.per_uid.get(&client.uid).copied().unwrap_or(0) >= l.per_uid {
            return Err(libc::ENOSPC);
        }
        if self.fds + conns + fds > l.fd_budget {
            return Err(libc::ENFILE);
        }
        Ok(())
    }

    /// An endpoint of `client` costing `fds` was made.
    pub fn add(&mut self, client: Client, fds: u64) {
        *self.per_conn.entry(client.conn).or_default() += 1;
        *self.per_uid.entry(client.uid).or_default() += 1;
        self.fds += fds;
    }

    /// An endpoint of `client` costing `fds` was destroyed.
    pub fn remove(&mut self, client: Client, fds: u64) {
        fn dec<K: std::hash::Hash + Eq>(m: &mut HashMap<K, u32>, k: K) {
            if let Some(n) = m.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&k);
                }
            }
        }
        dec(&mut self.per_conn, client.conn);
        dec(&mut self.per_uid, client.uid);
        self.fds = self.fds.saturating_sub(fds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_leaves_room_for_its_users_other_clients() {
        // Near the fd limit: 1024 fds left for endpoints.
        let l = Limits::within(None, None, 1024);
        assert_eq!((l.per_uid, l.per_client), (256, 64));
        let mut u = Usage::default();
        let hog = Client { conn: 1, uid: 1000 };
        while u.check(&l, hog, 1, 2).is_ok() {
            u.add(hog, 1);
        }
        assert_eq!(u.check(&l, hog, 1, 2), Err(libc::EMFILE));
        // The same user's next client is still served.
        let next = Client { conn: 2, uid: 1000 };
        assert_eq!(u.check(&l, next, 1, 2), Ok(()));
        // Plenty of fds: the defaults.
        let l = Limits::within(None, None, 1 << 20);
        assert_eq!(
            (l.per_uid, l.per_client),
            (DEFAULT_PER_UID, DEFAULT_PER_CLIENT)
        );
        // The operator's bounds stand as given.
        let l = Limits::within(Some(500), Some(500), 1 << 20);
        assert_eq!((l.per_uid, l.per_client), (500, 500));
        // A bound per user alone gives each connection a quarter of it.
        assert_eq!(Limits::within(None, Some(100), 1 << 20).per_client, 25);
        assert_eq!(Limits::within(None, Some(2), 1 << 20).per_client, 1);
    }

    #[test]
    fn each_bound_has_its_errno_and_frees_on_remove() {
        let l = Limits {
            per_client: 2,
            per_uid: 3,
            fd_budget: 10,
        };
        let mut u = Usage::default();
        let a = Client { conn: 1, uid: 1000 };
        let b = Client { conn: 2, uid: 1000 };
        let c = Client { conn: 3, uid: 0 };
        for _ in 0..2 {
            u.check(&l, a, 1, 3).unwrap();
            u.add(a, 1);
        }
        assert_eq!(u.check(&l, a, 1, 3), Err(libc::EMFILE));
        u.check(&l, b, 1, 3).unwrap();
        u.add(b, 1);
        assert_eq!(u.check(&l, b, 1, 3), Err(libc::ENOSPC));
        // Another user is untouched by the first one's bounds...
        u.check(&l, c, 2, 3).unwrap();
        // ...but not past the service's fds: 3 used + 3 connections + 5.
        assert_eq!(u.check(&l, c, 5, 3), Err(libc::ENFILE));
        u.remove(a, 1);
        u.check(&l, a, 1, 3).unwrap();
        u.check(&l, b, 1, 3).unwrap();
        u.remove(a, 1);
        u.remove(b, 1);
        assert!(u.per_conn.is_empty() && u.per_uid.is_empty() && u.fds == 0);
    }
}
