//! iopath's virtio-blk driver against iopath's own back end, `iopath blk
//! serve` in its own process: all four DMA modes (the back end offers
//! `ACCESS_PLATFORM` and enforces the IOTLB the IOMMU ops send), both
//! patterns, several requests in flight, two queues; the image file seen
//! from the host holds exactly what was written.

mod common;
mod frontend;

use common::{write_read_verify, Mode, MODES};
use frontend::Server;

const IMAGE: u64 = 24 << 20;

fn run(mode: Mode, pattern: u8, queues: u16) {
    let q = queues.to_string();
    let srv = Server::start(IMAGE, &["--queues", &q]);
    write_read_verify(&srv.socket, &srv.image, IMAGE, mode, pattern, queues);
}

#[test]
fn every_mode_writes_and_verifies_zero_and_seq() {
    for mode in MODES {
        run(mode, 0, 1);
        run(mode, 1, 1);
    }
}

#[test]
fn every_mode_over_two_queues() {
    for mode in MODES {
        run(mode, 1, 2);
    }
}
