//! Waiting, with a bounded deadline, for something a test cannot be told
//! about directly: a child process saying a line, another thread blocking.
//! The test fails after the deadline, saying what it waited for, instead of
//! sleeping a fixed time and hoping.

use std::time::{Duration, Instant};

/// Polls `cond` every millisecond until it holds, and returns; fails the
/// test after `limit`, naming `what` was awaited.
pub fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Re-reads `read()` (e.g. a child's stderr file) every 10 ms until it
/// holds `line`, and returns it all; fails the test after `limit`, naming
/// `who` and quoting what was read.
pub fn wait_for_line(who: &str, read: impl Fn() -> String, line: &str, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        let text = read();
        if text.contains(line) {
            return text;
        }
        assert!(
            start.elapsed() < limit,
            "{who} never said {line:?} within {limit:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn returns_once_the_line_is_there() {
        let n = AtomicU32::new(0);
        let read = || {
            let k = n.fetch_add(1, Ordering::SeqCst);
            if k < 3 {
                "starting".to_string()
            } else {
                "starting\nready".to_string()
            }
        };
        let all = wait_for_line("p", read, "ready", Duration::from_secs(5));
        assert_eq!(all, "starting\nready");
    }

    #[test]
    fn waits_until_the_condition_holds() {
        let n = AtomicU32::new(0);
        wait_until("n reaching 3", Duration::from_secs(5), || {
            n.fetch_add(1, Ordering::SeqCst) >= 3
        });
        assert_eq!(n.load(Ordering::SeqCst), 4);
    }

    #[test]
    #[should_panic(expected = "never: not within")]
    fn fails_naming_what_it_waited_for() {
        wait_until("never", Duration::from_millis(20), || false);
    }

    #[test]
    #[should_panic(expected = "p never said \"ready\"")]
    fn fails_naming_who_and_what() {
        wait_for_line("p", || "nothing".into(), "ready", Duration::from_millis(30));
    }
}
