//! An experiment's progress on stderr: an indicatif bar on a terminal,
//! plain lines (at most one a second) otherwise, nothing when stdout is
//! JSON for a script.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::ProgressDrawTarget;

static SHOW: AtomicBool = AtomicBool::new(true);

/// Whether the bars made from now on show.
pub(crate) fn show(yes: bool) {
    SHOW.store(yes, Ordering::Relaxed);
}

/// One experiment's progress: steps done out of a total, and what runs now.
#[derive(Debug)]
pub(crate) struct ProgressBar {
    /// Drawn on a terminal, else hidden (it still counts the steps).
    bar: indicatif::ProgressBar,
    /// Plain lines instead of the bar.
    lines: bool,
    label: String,
    /// When the last plain line was printed, and its message.
    last: Mutex<(Option<Instant>, String)>,
}

impl ProgressBar {
    pub(crate) fn new(label: &str, total: u64) -> ProgressBar {
        let show = SHOW.load(Ordering::Relaxed);
        let terminal = show && std::io::stderr().is_terminal();
        let target = match terminal {
            true => ProgressDrawTarget::stderr(),
            false => ProgressDrawTarget::hidden(),
        };
        let template = format!("{{spinner}} {label} [{{bar:30}}] {{pos}}/{{len}} {{msg}} {{eta}}");
        let style = indicatif::ProgressStyle::with_template(&template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        let bar = indicatif::ProgressBar::with_draw_target(Some(total), target)
            .with_style(style.progress_chars("=> "));
        ProgressBar {
            bar,
            lines: show && !terminal,
            label: label.to_string(),
            last: Mutex::new((None, String::new())),
        }
    }

    pub(crate) fn set_message(&self, msg: impl Into<String>) {
        let msg = msg.into();
        if !self.lines {
            return self.bar.set_message(msg);
        }
        let mut last = iopath_sys::lock(&self.last);
        if last.0.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) && last.1 != msg {
            eprintln!("{}: {msg} ({})", self.label, self.steps());
            *last = (Some(Instant::now()), msg);
        }
    }

    pub(crate) fn inc(&self, n: u64) {
        self.bar.inc(n);
    }

    /// "done/total", as the plain lines print it.
    fn steps(&self) -> String {
        let total = self.bar.length().unwrap_or(0);
        format!("{}/{total}", self.bar.position())
    }

    /// Clears the bar, or prints the last plain line.
    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
        if self.lines {
            eprintln!("{}: done ({})", self.label, self.steps());
        }
    }
}
