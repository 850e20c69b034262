//! The workload API against `iopath blk serve` in its own process: 4 KiB
//! blocks at random offsets over two queues write the `seq` pattern and
//! verify it; the image file holds exactly that range; a verify against
//! data that is not the pattern names the first bad byte.

mod common;
mod frontend;

use common::{connect, driver, AnyDriver, Mode};
use frontend::Server;
use iopath_blk::workload::{self, Access, Blocks, Op, Pattern, Workload, WorkloadError};
use iopath_blk::DriverOptions;

const IMAGE: u64 = 8 << 20;

fn run(srv: &Server, w: &Workload, queues: u16) -> Result<workload::Outcome, WorkloadError> {
    let blocks = Blocks::new(w).unwrap();
    let opts = DriverOptions {
        queues,
        ..DriverOptions::default()
    };
    match driver(Mode::Direct, connect(&srv.socket), blocks.buffers(), &opts).unwrap() {
        AnyDriver::Dyn(mut d) => workload::drive(&mut d, w, &blocks, &()),
        AnyDriver::Static(mut d) => workload::drive(&mut d, w, &blocks, &()),
    }
}

#[test]
fn random_4k_writes_verify_and_land_where_the_pattern_says() {
    let srv = Server::start(IMAGE, &["--queues", "2"]);
    let w = Workload {
        op: Op::Write,
        pattern: Pattern::Seq,
        access: Access::Rand,
        seed: 42,
        bs: 4096,
        count: 512,
        offset: 1 << 20,
        queue_depth: 8,
        runs: 2,
        verify: true,
    };
    let out = run(&srv, &w, 2).unwrap();
    assert_eq!(out.runs.len(), 2);
    assert!(out.verified);
    assert!(out
        .runs
        .iter()
        .all(|r| r.seconds > 0.0 && r.gib_per_s > 0.0));

    let img = srv.image_bytes(0, IMAGE as usize);
    let (from, to) = (1usize << 20, (1usize << 20) + 512 * 4096);
    assert!(
        img[..from].iter().all(|&b| b == 0),
        "bytes before the range"
    );
    assert!(img[to..].iter().all(|&b| b == 0), "bytes after the range");
    let mut want = vec![0u8; to - from];
    workload::fill_seq(&mut want, from as u64);
    assert!(img[from..to] == want[..], "the range holds the pattern");
}

#[test]
fn verify_against_other_data_names_the_first_bad_byte() {
    let srv = Server::start(IMAGE, &[]);
    // Zeros written sequentially, then read back expecting `seq`: word 0
    // of the range (offset 2 MiB) holds 0, not 2 MiB.
    let mut w = Workload {
        op: Op::Write,
        pattern: Pattern::Zero,
        access: Access::Seq,
        bs: 64 << 10,
        count: 16,
        offset: 2 << 20,
        queue_depth: 4,
        runs: 1,
        verify: true,
        seed: 0,
    };
    assert!(run(&srv, &w, 1).unwrap().verified);
    w.op = Op::Read;
    w.pattern = Pattern::Seq;
    w.access = Access::Rand;
    match run(&srv, &w, 1) {
        Err(WorkloadError::Mismatch { offset, pattern }) => {
            assert_eq!((offset, pattern), (2 << 20, Pattern::Seq));
        }
        other => panic!("{other:?}"),
    }
    // Past the end is refused before any I/O.
    w.offset = IMAGE - 512;
    assert!(matches!(
        run(&srv, &w, 1),
        Err(WorkloadError::PastEnd {
            capacity: IMAGE,
            ..
        })
    ));
}
