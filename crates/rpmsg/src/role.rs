//! Which side of an rpmsg link a process is: the two roles every layer
//! (buffer sizes, links, the bus) tells apart.

use std::fmt;

/// Which side of the link this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Virtio driver: owns the buffers.
    Host,
    /// Virtio device.
    Remote,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Host => "host",
            Role::Remote => "remote",
        })
    }
}
