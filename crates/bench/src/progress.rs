//! An experiment's progress bar on stderr: an indicatif bar on a terminal,
//! plain lines (at most one a second, and one at each phase) otherwise.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::ProgressStyle;

/// How often plain progress lines may come.
const LINE_EVERY: Duration = Duration::from_secs(1);

/// One experiment's progress: steps done out of a total, and what runs now.
#[derive(Debug)]
pub struct ProgressBar {
    how: How,
    label: String,
    total: u64,
    pos: AtomicU64,
    /// When the last plain line was printed, and its message.
    last: Mutex<(Option<Instant>, String)>,
}

#[derive(Debug)]
enum How {
    Hidden,
    Bar(indicatif::ProgressBar),
    Lines,
}

impl ProgressBar {
    /// Progress of `total` steps labelled `label`; `show == false` prints
    /// nothing (e.g. when stdout is JSON for a script).
    pub fn new(show: bool, label: &str, total: u64) -> ProgressBar {
        let how = if !show {
            How::Hidden
        } else if std::io::stderr().is_terminal() {
            let b = indicatif::ProgressBar::new(total);
            let style = ProgressStyle::with_template(&format!(
                "{{spinner}} {label} [{{bar:30}}] {{pos}}/{{len}} {{msg}} {{eta}}"
            ))
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            b.set_style(style);
            How::Bar(b)
        } else {
            How::Lines
        };
        ProgressBar {
            how,
            label: label.to_string(),
            total,
            pos: AtomicU64::new(0),
            last: Mutex::new((None, String::new())),
        }
    }

    /// What runs now.
    pub fn set_message(&self, msg: impl Into<String>) {
        let msg = msg.into();
        match &self.how {
            How::Hidden => {}
            How::Bar(b) => b.set_message(msg),
            How::Lines => {
                let mut last = iopath_sys::lock(&self.last);
                let due = last.0.is_none_or(|t| t.elapsed() >= LINE_EVERY);
                if due && last.1 != msg {
                    eprintln!(
                        "{}: {} ({}/{})",
                        self.label,
                        msg,
                        self.pos.load(Ordering::Relaxed),
                        self.total
                    );
                    *last = (Some(Instant::now()), msg);
                }
            }
        }
    }

    /// `n` more steps done.
    pub fn inc(&self, n: u64) {
        self.pos.fetch_add(n, Ordering::Relaxed);
        if let How::Bar(b) = &self.how {
            b.inc(n);
        }
    }

    /// Clears the bar, or prints the last plain line.
    pub fn finish(&self) {
        match &self.how {
            How::Hidden => {}
            How::Bar(b) => b.finish_and_clear(),
            How::Lines => eprintln!(
                "{}: done ({}/{})",
                self.label,
                self.pos.load(Ordering::Relaxed),
                self.total
            ),
        }
    }
}
