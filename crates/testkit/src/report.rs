//! The report of a skip, shared by [`crate::skip`] and [`crate::have_peer`]:
//! a line on stderr past libtest's capture, and a line in the skip log.

use std::fs::OpenOptions;
use std::io::Write;
use std::panic::Location;

/// The environment variable naming a file every skip is appended to, one
/// `<test>\t<reason>` line each: `scripts/test` sets it and ends with a
/// count of the lines by reason.
pub const SKIP_LOG: &str = "IOPATH_SKIP_LOG";

/// Prints the skip line and appends it to the skip log.
pub(crate) fn report(caller: &Location<'_>, reason: &str) {
    let test = test_name(caller);
    // libtest captures `print!` and `eprint!` of passing tests; a write to
    // the stderr handle itself is not captured.
    let _ = std::io::stderr().write_all(format!("skipped: {test}: {reason}\n").as_bytes());
    if let Some(path) = std::env::var_os(SKIP_LOG) {
        let line = format!("{test}\t{}\n", reason.replace(['\n', '\t'], " "));
        // One append of one whole line: lines from tests running at the
        // same time, in threads or in processes, do not interleave.
        if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// The running test as `<test binary>::<test path>`: libtest runs each test
/// on a thread named after it. On another thread, the caller's source
/// location stands in for the test path.
fn test_name(caller: &Location<'_>) -> String {
    let exe = std::env::current_exe().ok();
    let stem = exe
        .as_deref()
        .and_then(|p| p.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Cargo names test binaries `<name>-<16 hex digits>`.
    let binary = match stem.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name
        }
        _ => stem.as_str(),
    };
    match std::thread::current().name() {
        Some(name) if name != "main" => format!("{binary}::{name}"),
        _ => format!("{binary} ({}:{})", caller.file(), caller.line()),
    }
}
