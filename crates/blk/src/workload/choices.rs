//! The named choices of a workload: direction, data pattern, block order.

use serde::Serialize;

use crate::names::names;

/// Direction of the transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Write blocks to the device.
    Write,
    /// Read blocks from the device.
    Read,
}

/// Data written, and expected by a verify pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// All bytes zero.
    Zero,
    /// Each 8-byte little-endian word holds its own byte offset on the device.
    Seq,
}

/// Order in which the blocks of the range are visited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Block 0, 1, 2, ... of the range.
    Seq,
    /// Every block of the range once, in a seeded random order.
    Rand,
}

names!(Op, "op", Write => "write", Read => "read");
names!(Pattern, "pattern", Zero => "zero", Seq => "seq");
names!(Access, "access", Seq => "seq", Rand => "rand");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print() {
        for n in Access::NAMES {
            assert_eq!(n.parse::<Access>().unwrap().name(), *n);
        }
        assert_eq!("read".parse::<Op>().unwrap(), Op::Read);
        assert_eq!(Pattern::Seq.to_string(), "seq");
        let e = "sideways".parse::<Access>().unwrap_err().to_string();
        assert!(e.contains("sideways") && e.contains("rand"), "{e}");
    }
}
