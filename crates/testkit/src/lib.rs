//! iopath-testkit: one place for what the end-to-end tests do when a peer
//! program (fio, qemu-storage-daemon, QEMU) is missing.
//!
//! On a developer's machine a test whose peer is not installed prints
//! `skipped: ...` with the package that brings it, and returns. Under CI
//! (`CI` set to anything but `false`/`0`) or with `IOPATH_REQUIRE_PEERS=1`
//! a missing peer fails the test instead, with the same hint: `scripts/test`
//! installs every peer, so a missing one there is a broken set-up, never a
//! pass.
//!
//! ```
//! // `sh` is everywhere; a test asks for its peer the same way.
//! assert!(iopath_testkit::have_peer("sh", "dash"));
//! ```

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Whether missing peers fail tests: under CI (`CI` set and not `false` or
/// `0`) or when `IOPATH_REQUIRE_PEERS=1`.
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
/// When it is not: prints a `skipped:` line and returns `false`, or, when
/// [`peers_required`], panics with the install hint.
///
/// # Panics
/// When the program is missing and peers are required.
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
    println!("skipped: {hint}");
    false
}

/// [`have_peer`] for several peers at once: `(program, package)` pairs,
/// every missing one reported.
///
/// # Panics
/// When one is missing and peers are required.
pub fn have_peers(peers: &[(&str, &str)]) -> bool {
    peers.iter().fold(true, |all, (program, package)| {
        have_peer(program, package) && all
    })
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
                    "tests::child_asks_for_fio",
                ])
                .env("PATH", "/iopath-no-such-dir")
                .env("CI", ci)
                .env_remove("IOPATH_REQUIRE_PEERS")
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
        assert!(text.contains("skipped: fio is not on PATH"), "{text}");
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
