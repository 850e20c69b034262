//! The bench's own servers as child processes of the `iopath` executable.
//!
//! The limits of `iopath bench rpmsg` need a far end in another process: a
//! raw eventfd echo, a raw fd server, the poll floor's two stand-ins, a raw
//! sink. The bench starts the executable it runs in (or the one its config
//! names) with [`ENV`] set to the server, written as JSON; the executable's
//! `main` calls [`crate::serve_if_child`] before parsing its own command
//! line, so the servers are not among the product's subcommands.
//!
//! ```text
//!   bench (parent)                      iopath, IOPATH_BENCH_CHILD={"Echo":..}
//!   Server::Echo{..}.command(exe) ----> serve_if_child() -> raw::serve(server)
//! ```

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::error::invalid;
use crate::Result;

/// The environment variable that holds the server a child runs.
pub const ENV: &str = "IOPATH_BENCH_CHILD";

/// A server the bench runs in a child process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Server {
    /// Echo `count` eventfd kicks on `notify` (`eventfd:PATH` to connect
    /// to): the raw ping-pong's far end.
    Echo { notify: String, count: u64 },
    /// Answer each packet on `sock` with an fd: the create+destroy limits'
    /// far end.
    Fd { sock: PathBuf },
    /// The poll floor's host stand-in: forward `count` packets from `sock`
    /// to the echo through the page `shm`, and back.
    PollForward {
        sock: PathBuf,
        shm: PathBuf,
        count: u64,
    },
    /// The poll floor's remote stand-in: answer `count` flags raised in the
    /// page `shm`.
    PollEcho { shm: PathBuf, count: u64 },
    /// Count and drop the packets on `sock`, answering each sync with the
    /// count: the stream limit's far end.
    Sink { sock: PathBuf },
}

impl Server {
    /// The command that runs it as a child of the executable `exe`, its
    /// standard input closed.
    pub(crate) fn command(&self, exe: &Path) -> Command {
        let mut cmd = Command::new(exe);
        let json = serde_json::to_string(self).expect("a server is plain data");
        cmd.env(ENV, json).stdin(Stdio::null());
        cmd
    }

    /// The server that `value` (of [`ENV`]) names.
    ///
    /// # Errors
    /// [`crate::Error::Invalid`] (naming [`ENV`]) for anything else.
    pub(crate) fn parse(value: &OsStr) -> Result<Server> {
        match value.to_str().map(serde_json::from_str) {
            Some(Ok(s)) => Ok(s),
            _ => invalid!(ENV, "{value:?} is no bench server"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_server_parses_back_from_its_command() {
        let servers = [
            Server::Echo {
                notify: "eventfd:/tmp/ev".into(),
                count: 7,
            },
            Server::Fd {
                sock: "/tmp/s".into(),
            },
            Server::PollForward {
                sock: "/tmp/s".into(),
                shm: "/dev/shm/p".into(),
                count: 3,
            },
            Server::PollEcho {
                shm: "/dev/shm/p".into(),
                count: 3,
            },
            Server::Sink {
                sock: "/tmp/s".into(),
            },
        ];
        for s in servers {
            let cmd = s.command(Path::new("iopath"));
            let (name, value) = cmd.get_envs().next().unwrap();
            assert_eq!(name, OsStr::new(ENV));
            assert_eq!(Server::parse(value.unwrap()).unwrap(), s);
        }
        let e = Server::parse(OsStr::new("raw-nothing")).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{ENV}: \"raw-nothing\" is no bench server")
        );
    }
}
