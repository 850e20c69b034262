//! iopath-sys: the process-level mechanisms every iopath crate shares, each
//! written once (as rust-vmm's `vmm-sys-util` is for its crates).
//!
//! ```text
//!   iopath-heap, -dma, -virtio, -blk, -rpmsg, the CLI, the bench
//!        │ call
//!        ▼
//!   iopath-sys: unix_socket (claim, bind, connect, peer) · signals (stop) ·
//!               limits (fd limit, meminfo) · sync (lock and wait past
//!               poison) · size (one size grammar) · error (an error and
//!               its chain) · cpus (pin a thread and the processes it
//!               starts) · process (a child stopped and reaped when
//!               dropped; its CPU time)
//! ```
//!
//! ```
//! use iopath_sys::{error_chain, lock, parse_size};
//! assert_eq!(parse_size::<u64>("64K").unwrap(), 64 << 10);
//! assert_eq!(parse_size::<usize>("0x1000").unwrap(), 4096);
//! let m = std::sync::Mutex::new(1);
//! *lock(&m) += 1;
//! assert_eq!(*lock(&m), 2);
//! let e = std::io::Error::other("disk gone");
//! assert_eq!(error_chain(&e), "disk gone");
//! ```
#![forbid(unsafe_code)]

pub mod cpus;
mod error;
pub mod limits;
pub mod process;
pub mod signals;
pub mod size;
mod sync;
pub mod unix_socket;

pub use error::error_chain;
pub use limits::raise_fd_limit;
pub use size::{format_size, human, parse_size, SizeError};
pub use sync::{lock, read_lock, wait, wait_timeout, wait_timeout_while, write_lock};
