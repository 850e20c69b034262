//! Peer programs on `PATH`, and whether their absence fails a test.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::panic::Location;
use std::path::{Path, PathBuf};

/// Whether missing peers (and missing features this machine type has)
/// fail tests: under CI (`CI` set and not `false` or `0`) or when
/// `IOPATH_REQUIRE_PEERS=1`.
pub fn peers_required() -> bool {
    let on = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty() && v != OsStr::new("0") && v != OsStr::new("false"))
            .is_some()
    };
    on("CI") || on("IOPATH_REQUIRE_PEERS")
}

/// Where `program` is on `PATH` (an executable file), if anywhere.
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Whether the peer `program` (from Debian package `package`) is on `PATH`.
/// When it is not: reports the test as skipped (as [`crate::skip`] does)
/// and returns `false`, or, when [`peers_required`], panics with the
/// install hint.
///
/// # Panics
/// When the program is missing and peers are required.
#[track_caller]
pub fn have_peer(program: &str, package: &str) -> bool {
    if find_program(program).is_some() {
        return true;
    }
    let hint = format!(
        "{program} is not on PATH (Debian package {package}; scripts/install-deps installs it)"
    );
    if peers_required() {
        panic!("missing peer under CI / IOPATH_REQUIRE_PEERS: {hint}");
    }
    crate::report::report(Location::caller(), &hint);
    false
}

/// [`have_peer`] for several peers at once: `(program, package)` pairs,
/// every missing one reported.
///
/// # Panics
/// When one is missing and peers are required.
#[track_caller]
pub fn have_peers(peers: &[(&str, &str)]) -> bool {
    let mut all = true;
    for (program, package) in peers {
        all &= have_peer(program, package);
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Run by the test below in a child whose `PATH` has no fio.
    #[test]
    #[ignore = "run in a child process by missing_peer_fails_under_ci_and_skips_elsewhere"]
    fn child_asks_for_fio() {
        assert!(!have_peer("fio", "fio"));
    }

    #[test]
    fn missing_peer_fails_under_ci_and_skips_elsewhere() {
        let run = |ci: &str| {
            let out = Command::new(std::env::current_exe().unwrap())
                .args([
                    "--ignored",
                    "--exact",
                    "--nocapture",
                    "peer::tests::child_asks_for_fio",
                ])
                .env("PATH", "/iopath-no-such-dir")
                .env("CI", ci)
                .env_remove("IOPATH_REQUIRE_PEERS")
                .env_remove(crate::SKIP_LOG)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            (out.status.success(), text)
        };
        let (ok, text) = run("true");
        assert!(!ok, "a missing peer passed under CI: {text}");
        assert!(text.contains("missing peer under CI"), "{text}");
        assert!(text.contains("Debian package fio"), "{text}");
        let (ok, text) = run("false");
        assert!(ok, "a missing peer failed off CI: {text}");
        assert!(
            text.contains(
                "skipped: iopath_testkit::peer::tests::child_asks_for_fio: fio is not on PATH"
            ),
            "{text}"
        );
    }

    #[test]
    fn finds_programs_on_path_and_not_elsewhere() {
        assert!(find_program("sh").is_some_and(|p| p.ends_with("sh")));
        assert_eq!(find_program("iopath-no-such-program-here"), None);
    }

    #[test]
    fn a_directory_is_not_a_program() {
        // `/` is on no PATH, but a directory named like a program must
        // not count: `find_program` only takes executable files.
        assert!(!is_executable(Path::new("/usr")));
        assert!(is_executable(&find_program("sh").unwrap()));
    }
}
