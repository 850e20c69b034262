//! The bench's own servers as child processes of the `iopath` executable.
//!
//! The limits of `iopath bench rpmsg` need a far end in another process: a
//! raw eventfd echo, a raw fd server, the poll floor's two stand-ins, a raw
//! sink. The bench starts the executable it runs in (or the one its config
//! names) with [`ENV`] set to the server's name and the server's arguments
//! as the only command-line arguments; the executable's `main` calls
//! [`crate::serve_if_child`] before parsing its own command line, so the servers
//! are not among the product's subcommands.
//!
//! ```text
//!   bench (parent)                      iopath, IOPATH_BENCH_CHILD=raw-echo
//!   Server::Echo{..}.command(exe) ----> serve_if_child() -> raw::serve(server)
//! ```

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use iopath_rpmsg::NotifySpec;

use crate::error::invalid;
use crate::Result;

/// The environment variable that names the server a child runs.
pub const ENV: &str = "IOPATH_BENCH_CHILD";

/// A server the bench runs in a child process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Server {
    /// Echo `count` eventfd kicks on `notify` (`eventfd:PATH` to connect
    /// to): the raw ping-pong's far end.
    Echo { notify: NotifySpec, count: u64 },
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
    /// Its name in [`ENV`].
    fn name(&self) -> &'static str {
        match self {
            Server::Echo { .. } => "raw-echo",
            Server::Fd { .. } => "raw-fd-server",
            Server::PollForward { .. } => "raw-poll-forward",
            Server::PollEcho { .. } => "raw-poll-echo",
            Server::Sink { .. } => "raw-sink",
        }
    }

    /// Its arguments, in order.
    fn args(&self) -> Vec<OsString> {
        match self {
            Server::Echo { notify, count } => {
                vec![notify.to_string().into(), count.to_string().into()]
            }
            Server::Fd { sock } | Server::Sink { sock } => vec![sock.into()],
            Server::PollForward { sock, shm, count } => {
                vec![sock.into(), shm.into(), count.to_string().into()]
            }
            Server::PollEcho { shm, count } => vec![shm.into(), count.to_string().into()],
        }
    }

    /// The command that runs it as a child of the executable `exe`, its
    /// standard input closed.
    pub(crate) fn command(&self, exe: &Path) -> Command {
        let mut cmd = Command::new(exe);
        cmd.env(ENV, self.name())
            .args(self.args())
            .stdin(Stdio::null());
        cmd
    }

    /// The server named `name` with the arguments `args`.
    ///
    /// # Errors
    /// [`Error::Invalid`] (naming [`ENV`]) for an unknown name or wrong
    /// arguments.
    pub(crate) fn parse(name: &OsStr, args: &[OsString]) -> Result<Server> {
        let path = |i: usize| PathBuf::from(&args[i]);
        let count = |i: usize| -> Result<u64> {
            match args[i].to_str().and_then(|s| s.parse().ok()) {
                Some(n) => Ok(n),
                None => invalid!(ENV, "{:?} is not a count", args[i]),
            }
        };
        let want = |n: usize| -> Result<()> {
            if args.len() != n {
                invalid!(
                    ENV,
                    "{} takes {n} arguments, not {}",
                    name.to_string_lossy(),
                    args.len()
                );
            }
            Ok(())
        };
        Ok(match name.to_str() {
            Some("raw-echo") => {
                want(2)?;
                let notify = match args[0].to_str().map(str::parse) {
                    Some(Ok(n)) => n,
                    _ => invalid!(ENV, "{:?} is not a notifier", args[0]),
                };
                Server::Echo {
                    notify,
                    count: count(1)?,
                }
            }
            Some("raw-fd-server") => {
                want(1)?;
                Server::Fd { sock: path(0) }
            }
            Some("raw-poll-forward") => {
                want(3)?;
                Server::PollForward {
                    sock: path(0),
                    shm: path(1),
                    count: count(2)?,
                }
            }
            Some("raw-poll-echo") => {
                want(2)?;
                Server::PollEcho {
                    shm: path(0),
                    count: count(1)?,
                }
            }
            Some("raw-sink") => {
                want(1)?;
                Server::Sink { sock: path(0) }
            }
            _ => invalid!(ENV, "no bench server {name:?}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_server_parses_back_from_its_command() {
        let servers = [
            Server::Echo {
                notify: NotifySpec::Eventfd("/tmp/ev".into()),
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
            let env: Vec<_> = cmd.get_envs().collect();
            assert_eq!(env, [(OsStr::new(ENV), Some(OsStr::new(s.name())))]);
            let args: Vec<OsString> = cmd.get_args().map(OsStr::to_owned).collect();
            assert_eq!(Server::parse(OsStr::new(s.name()), &args).unwrap(), s);
        }
    }

    #[test]
    fn wrong_servers_and_arguments_name_the_variable() {
        let e = Server::parse(OsStr::new("raw-nothing"), &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{ENV}: no bench server \"raw-nothing\"")
        );
        let e = Server::parse(OsStr::new("raw-sink"), &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{ENV}: raw-sink takes 1 arguments, not 0")
        );
        let e = Server::parse(OsStr::new("raw-poll-echo"), &["p".into(), "x".into()]).unwrap_err();
        assert_eq!(e.to_string(), format!("{ENV}: \"x\" is not a count"));
    }
}
