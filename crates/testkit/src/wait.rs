//! Waiting for a child process to say something: its output is re-read
//! until it holds the line, or the test fails showing what it did say.

use std::time::{Duration, Instant};

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
    #[should_panic(expected = "p never said \"ready\"")]
    fn fails_naming_who_and_what() {
        wait_for_line("p", || "nothing".into(), "ready", Duration::from_millis(30));
    }
}
