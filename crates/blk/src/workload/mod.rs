//! A dd-like workload on a [`BlkDriver`](crate::BlkDriver): many blocks in
//! flight on every queue, sequential or random offsets, a data pattern and
//! its check.
//!
//! ```text
//!  Workload ─► Blocks (one buffer slot per block in flight)
//!      └─► drive: runs × pass ─► queue_pass per queue (its own thread)
//!              block k of the order ─► device block order(k) ─► submit
//!              completion ─► next block into the freed slot
//!          verify: one more pass reading the range, checked against the pattern
//!  ◄─ Outcome { runs: per-run timings }        (callers summarise with Stats)
//! ```
//!
//! Random access visits every block of the range exactly once per pass, in
//! an order drawn from a seeded permutation (as fio's random map does), so
//! a pattern written at random offsets verifies like a sequential one and a
//! seed gives the same order again.
//!
//! The workload and its checks are in `spec.rs`, its named choices in
//! `choices.rs`, the block buffers in `blocks.rs`, the order of a pass in
//! `order.rs`, the data patterns in `pattern.rs`, timings in `stats.rs` and
//! the engine in `drive.rs`.

mod blocks;
mod choices;
mod drive;
mod error;
mod order;
mod pattern;
mod spec;
mod stats;

pub use blocks::Blocks;
pub use choices::{Access, Op, Pattern};
pub use drive::{drive, pass, Outcome, Progress};
pub use error::WorkloadError;
pub use pattern::{check_pattern, fill_seq};
pub use spec::{Workload, MAX_QUEUE_DEPTH};
pub use stats::{Run, Stats};
