//! Parsing virtio-blk requests out of descriptor chains (virtio 1.2,
//! 5.2.6), separate from executing them.
//!
//! A chain is seen as a byte stream: device-readable bytes (the 16-byte
//! header, then data for writes, discard and write-zeroes) followed by
//! device-writable bytes (data for reads and `GET_ID`, then the status
//! byte). Descriptors may split these anywhere. Every address is checked
//! against the memory the device may access with the access it will make,
//! so the executor only ever touches memory that was mapped for it.
//!
//! The request types are in `types.rs`, the errors in `error.rs`, the
//! parser in `parse.rs`; the wire layouts it reads are in `crate::wire`.

mod error;
mod parse;
#[cfg(test)]
mod tests;
mod types;

pub use error::{ParseError, Rejected};
pub use types::{Limits, Request, RequestKind, SectorRange, Segment};
