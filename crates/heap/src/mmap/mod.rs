//! Mappings of file descriptors, one concern per file: the one owning type
//! around a mapping, the views made of it, the SIGBUS guard that keeps a
//! peer who truncates a shared file from killing the process, and which
//! pages of a file the page cache holds.
//!
//! ```text
//!   crate::Buffer ───────────────┐
//!   file_view.rs  FileView ──────┼─► mapping.rs  Mmap ─────► guard.rs  SigbusGuard
//!   (a file's cached pages)      │   (mmap, populate,        (the SIGBUS handler
//!   shared.rs     SharedMapping ─┘    advice, munmap)         and its slots)
//!   (a peer's file)
//!
//!   mincore.rs    resident_map, resident_pages (mincore(2) on a passing mapping)
//! ```
//!
//! Raw pointers into buffer memory live here, in the borrowed range
//! ([`crate::BufRange`]) that everything else goes through, and in the
//! syscall wrappers ([`crate::sys`], [`crate::ring`]) that take a range: its
//! lifetime borrows the [`crate::Buffer`], so the mapping outlives every use
//! of the pointer, and its bounds are checked once, when it is made.
//! Engines never see a pointer.

mod file_view;
mod guard;
mod mapping;
mod mincore;
mod shared;

pub(crate) use file_view::FileView;
pub use guard::SigbusGuard;
pub(crate) use mapping::Mmap;
pub(crate) use mincore::{resident_map, resident_pages};
pub use shared::SharedMapping;
