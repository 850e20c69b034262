//! The fuzzer's input: an optional well-formed set-up, then vhost-user
//! messages (typed ones and raw bytes) with the fds they carry.

use arbitrary::Arbitrary;

/// An fd attached to a message.
#[derive(Debug, Arbitrary, Clone, Copy)]
pub enum Fd {
    Event,
    Memfd {
        pages: u8,
    },
    /// One end of a unix stream socket pair (the other closed at once).
    Socket,
    /// A pipe's read end.
    Pipe,
}

#[derive(Debug, Arbitrary, Clone, Copy)]
pub struct Region {
    pub gpa_page: u8,
    pub pages: u8,
    pub uaddr_page: u8,
    /// Offset into the file, in pages (the file may be too short).
    pub offset_page: u8,
    /// Pages the memfd really has (may be fewer than the region).
    pub file_pages: u8,
    pub fill: u8,
}

#[derive(Debug, Arbitrary)]
pub enum Msg {
    GetFeatures,
    SetFeatures {
        bits: u8,
    },
    GetProtocolFeatures,
    SetProtocolFeatures {
        bits: u64,
    },
    SetOwner,
    ResetOwner,
    GetQueueNum,
    MemTable {
        regions: Vec<Region>,
        missing_fds: u8,
    },
    AddRegion(Region),
    RemoveRegion(Region),
    VringNum {
        idx: u8,
        num: u16,
    },
    VringAddr {
        idx: u8,
        desc: u16,
        used: u16,
        avail: u16,
        iova: bool,
    },
    VringBase {
        idx: u8,
        base: u16,
        get: bool,
    },
    VringKick {
        idx: u8,
        fd: Option<Fd>,
    },
    VringCall {
        idx: u8,
        fd: Option<Fd>,
    },
    VringEnable {
        idx: u8,
        on: bool,
    },
    Kick {
        idx: u8,
    },
    Iotlb {
        iova: u16,
        size: u16,
        uaddr_page: u8,
        perm: u8,
        kind: u8,
        len: u8,
    },
    BackendReqFd {
        fd: Option<Fd>,
        len: u8,
    },
    Config {
        offset: u16,
        size: u16,
    },
    GetInflight {
        num_queues: u8,
        queue_size: u16,
    },
    /// `SET_INFLIGHT_FD` with a memfd of `pages` pages of `bytes` (which
    /// `Poke` may change later, while the device runs).
    SetInflight {
        mmap_size: u16,
        offset_page: u8,
        num_queues: u8,
        queue_size: u16,
        pages: u8,
        bytes: Vec<u8>,
        fd: Option<Fd>,
    },
    /// Guest memory bytes written by the "driver" (rings, descriptors).
    Poke {
        region: u8,
        at: u16,
        bytes: Vec<u8>,
    },
    Raw {
        request: u8,
        flags: u8,
        payload: Vec<u8>,
        fds: Vec<Fd>,
    },
}

/// A well-formed set-up sent before the fuzzed messages, so that they
/// start from a running queue (memory shared, vring 0 started, with the
/// IOTLB mapping the region when `iommu`) and a valid request posted.
#[derive(Debug, Arbitrary)]
pub struct Prelude {
    pub iommu: bool,
    pub event_idx: bool,
    pub fill: u8,
    /// Negotiate `INFLIGHT_SHMFD` and give back an inflight record of
    /// these bytes before the queue starts.
    pub inflight: Option<Vec<u8>>,
}

#[derive(Debug, Arbitrary)]
pub struct Input {
    pub reply_ack: bool,
    pub prelude: Option<Prelude>,
    pub msgs: Vec<Msg>,
}
