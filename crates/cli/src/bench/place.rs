//! `--placement`: where the processes of a measurement run.

use iopath_bench::Placement;

/// Where the processes of a measurement run (`iopath_bench::Placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlacementArg {
    /// Every process on one CPU: no wake-up crosses CPUs.
    One,
    /// The client on one CPU, the servers (and the limit's) on another.
    Split,
    /// No pinning: where the scheduler puts them.
    Free,
}

impl From<PlacementArg> for Placement {
    fn from(p: PlacementArg) -> Placement {
        match p {
            PlacementArg::One => Placement::One,
            PlacementArg::Split => Placement::Split,
            PlacementArg::Free => Placement::Free,
        }
    }
}
