//! Stopping on SIGINT or SIGTERM, the one way every long-running iopath
//! process does it: the two signals are taken from every thread and
//! handled on a thread of their own, which runs the process's clean-up
//! and exits with the status that clean-up returns.

use std::io;

/// The signals a supervisor or a terminal sends to ask for a stop.
pub const STOP_SIGNALS: [i32; 2] = [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM];

/// A signal's name for messages: `"SIGINT"`, `"SIGTERM"`, else its number.
pub fn signal_name(sig: i32) -> String {
    match sig {
        signal_hook::consts::SIGINT => "SIGINT".into(),
        signal_hook::consts::SIGTERM => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

/// Starts the thread named `thread` that waits for SIGINT or SIGTERM, then
/// calls `stop` with the signal and exits the process with the status it
/// returns (`0` for a requested stop, or `128 + sig` as a shell reports a
/// process the signal ended). Call it before starting other threads.
///
/// # Errors
/// The handlers cannot be installed or the thread cannot start.
pub fn on_stop<F>(thread: &str, stop: F) -> io::Result<()>
where
    F: FnOnce(i32) -> i32 + Send + 'static,
{
    let mut signals = signal_hook::iterator::Signals::new(STOP_SIGNALS)?;
    std::thread::Builder::new()
        .name(thread.into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let status = stop(sig);
                std::process::exit(status);
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(signal_name(2), "SIGINT");
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(1), "signal 1");
    }

    #[test]
    fn a_sigterm_runs_the_stop_and_exits_with_its_status() {
        if std::env::var_os("IOPATH_SYS_SIGNALS_CHILD").is_some() {
            let dir = std::env::var("IOPATH_SYS_SIGNALS_CHILD").unwrap();
            on_stop("stop-test", move |sig| {
                std::fs::write(format!("{dir}/stopped"), signal_name(sig)).unwrap();
                128 + sig
            })
            .unwrap();
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::TERM)
                .unwrap();
            std::thread::sleep(std::time::Duration::from_secs(30));
            unreachable!("the stop thread exits the process");
        }
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "signals::tests::a_sigterm_runs_the_stop_and_exits_with_its_status",
            ])
            .args(["--nocapture", "--test-threads=1"])
            .env("IOPATH_SYS_SIGNALS_CHILD", dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(143), "{out:?}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("stopped")).unwrap(),
            "SIGTERM"
        );
    }
}
