//! iopath-testkit: one place for what the end-to-end tests do when the
//! machine lacks something they need: a peer program (fio,
//! qemu-storage-daemon, QEMU) or a kernel or file-system feature
//! (io_uring, O_DIRECT, huge pages, root).
//!
//! A test that cannot run reports it with [`skip`] (or [`have_peer`] for a
//! peer program) and returns:
//!
//! ```text
//!   probe fails ──► skip(feature, reason)
//!                     │
//!                     ├─ CI, and this machine type has the feature ──► panic (a broken set-up)
//!                     │
//!                     └─ otherwise ──► "skipped: <test>: <reason>"
//!                                        ├─ on stderr (not captured by libtest)
//!                                        └─ appended to $IOPATH_SKIP_LOG (scripts/test counts them)
//! ```
//!
//! Under CI (`CI` set to anything but `false`/`0`) or with
//! `IOPATH_REQUIRE_PEERS=1` a missing peer always fails the test, with the
//! package that brings it: `scripts/install-deps` installs every peer. A
//! missing feature fails only when the machine type the suite runs on has
//! it ([`Feature::expected_under_ci`]); the others (udmabuf, dma-heaps)
//! stay honest skips.
//!
//! What a test cannot be told directly (a child saying a line, another
//! thread blocking) it waits for with a deadline ([`wait_until`],
//! [`wait_for_line`]), never with a fixed sleep.
//!
//! ```
//! // `sh` is everywhere; a test asks for its peer the same way.
//! assert!(iopath_testkit::have_peer("sh", "dash"));
//! ```

#![forbid(unsafe_code)]

mod peer;
mod report;
mod skip;
mod wait;

pub use peer::{find_program, have_peer, have_peers, peers_required};
pub use report::SKIP_LOG;
pub use skip::{skip, Feature};
pub use wait::{wait_for_line, wait_until};
