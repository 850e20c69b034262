//! The bench's own servers (the far ends of the rpmsg limits) as child
//! processes of the `iopath` executable: started with [`ENV`] set to the
//! server as JSON, whose `main` calls [`crate::serve_if_child`] before
//! parsing its command line, so they are not among its subcommands.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::error::invalid;
use crate::Result;

/// The environment variable that holds the server a child runs.
pub(crate) const ENV: &str = "IOPATH_BENCH_CHILD";

/// A server the bench runs in a child process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Server {
    /// The create+destroy limits' far end ([`crate::rpmsg::raw::fd`]).
    Fd {
        sock: PathBuf,
    },
    /// The poll floor's two stand-ins ([`crate::rpmsg::raw::poll`]).
    PollForward {
        sock: PathBuf,
        shm: PathBuf,
        count: u64,
    },
    PollEcho {
        shm: PathBuf,
        count: u64,
    },
    /// The stream limit's far end ([`crate::rpmsg::raw::sink`]).
    Sink {
        sock: PathBuf,
    },
}

impl Server {
    /// The command that runs it as a child of the executable `exe`.
    pub(crate) fn command(&self, exe: &Path) -> Command {
        let mut cmd = Command::new(exe);
        let json = serde_json::to_string(self).expect("a server is plain data");
        cmd.env(ENV, json);
        cmd
    }

    /// The server that `value` (of [`ENV`]) names.
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
        let (sock, shm) = (PathBuf::from("/tmp/s"), PathBuf::from("/dev/shm/p"));
        let servers = [
            Server::Fd { sock: sock.clone() },
            Server::PollForward {
                sock: sock.clone(),
                shm: shm.clone(),
                count: 3,
            },
            Server::PollEcho { shm, count: 3 },
            Server::Sink { sock },
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
