//! Adaptive polling on both sides of the ring, against a real `iopath blk
//! serve` process over its vhost-user socket: no kick is lost while either
//! side goes from polling to sleeping and back thousands of times; a
//! polling back end whose front end dies serves the next one; a polling
//! driver whose back end stops answering times out naming the request; a
//! sleeping driver that coalesces its wake-ups loses no completion.

mod common;
mod frontend;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{alloc, connect, driver, seq, Mode};
use frontend::{iopath_bin, Server};
use iopath_blk::{BlkError, DriverOptions};
use iopath_virtio::PollMode;

const IMAGE: u64 = 8 << 20;
const BS: usize = 4096;

fn us(n: u64) -> PollMode {
    PollMode::from_us(n).unwrap()
}

/// A small xorshift for gaps and offsets (the same run every time).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Longest a request may take before it counts as a lost notification.
/// A kick the back end misses leaves the request unanswered until the
/// driver's 5 s timeout names it; an interrupt the driver misses leaves
/// it asleep until that timeout, after which its look at the ring finds
/// the answer and the request succeeds, late. Both show as a request that
/// took seconds; nothing else here takes more than milliseconds.
const STALL: Duration = Duration::from_secs(2);

/// `n` requests one at a time (4 KiB writes of the seq pattern, each read
/// back and compared). Each is submitted 0 to `gap_ns` after the previous
/// one completed, with nothing else in between (the data is laid out
/// before): the other side's poller started its window as it put that
/// completion on the ring, so the request lands while it polls, just as
/// its window ends and it re-enables notifications, or once it sleeps.
/// Every request must complete, within [`STALL`].
fn one_at_a_time(server_args: &[&str], driver_poll: PollMode, n: usize, gap_ns: u64) {
    let srv = Server::start(IMAGE, server_args);
    run_one_at_a_time(&srv, driver_poll, n, gap_ns);
}

fn run_one_at_a_time(srv: &Server, driver_poll: PollMode, n: usize, gap_ns: u64) {
    let (wbuf, rbuf) = (alloc(BS), alloc(BS));
    let opts = DriverOptions {
        timeout: Duration::from_secs(5),
        poll: driver_poll,
        ..DriverOptions::default()
    };
    let bufs = [wbuf.clone(), rbuf.clone()];
    let transport = connect(&srv.socket);
    // The driver's poller is told where the back end runs.
    assert_eq!(
        transport.peer(),
        Some(rustix::process::Pid::from_child(&srv.child))
    );
    let mut drv = driver(Mode::Direct, transport, &bufs, &opts).unwrap();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let blocks = IMAGE / BS as u64;
    let mut got = vec![0u8; BS];
    let mut done = Instant::now();
    for i in 0..n {
        let off = (rng.next() % blocks) * BS as u64;
        let want = seq(off, BS);
        wbuf.write_at(0, &want).unwrap();
        rbuf.fill(0, BS, 0x5a).unwrap();
        let gaps = [rng.next() % gap_ns, rng.next() % gap_ns].map(Duration::from_nanos);
        for (k, gap) in gaps.into_iter().enumerate() {
            while done.elapsed() < gap {
                std::hint::spin_loop();
            }
            let t = Instant::now();
            let (what, r) = if k == 0 {
                ("write", drv.write(off, &wbuf, 0, BS))
            } else {
                ("read", drv.read(off, &rbuf, 0, BS))
            };
            done = Instant::now();
            r.unwrap_or_else(|e| panic!("{what} {i} of {n} at {off}: {e}"));
            let took = done - t;
            assert!(
                took < STALL,
                "{what} {i} of {n} at {off} took {took:?}: a lost notification"
            );
        }
        rbuf.read_at(0, &mut got).unwrap();
        assert!(got == want, "request {i}: block at {off} reads back wrong");
    }
}

#[test]
fn no_kick_is_lost_when_both_sides_poll_briefly() {
    // Windows of a few to tens of microseconds, requests spread over
    // twice the back end's: both pollers give up and re-enable
    // notifications around almost every request.
    one_at_a_time(&["--poll-us", "2"], us(3), 6000, 4_000);
    one_at_a_time(&["--poll-us", "20"], us(20), 4000, 40_000);
}

/// Both sides pinned to one CPU, the back end's image in RAM: each
/// poller hands the CPU over rather than spinning, and sleeps as soon as
/// a yield finds nothing else to run.
#[test]
fn no_kick_is_lost_when_both_sides_share_one_cpu() {
    use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
    let Some(srv) = Server::start_in_ram(IMAGE, &["--poll-us", "20"]) else {
        return;
    };
    let mine = sched_getaffinity(None).unwrap();
    let cpu = (0..CpuSet::MAX_CPU).find(|&c| mine.is_set(c)).unwrap();
    let mut one = CpuSet::new();
    one.set(cpu);
    // The back end's queue thread starts at the connection, from its
    // main thread, and inherits this.
    sched_setaffinity(Some(rustix::process::Pid::from_child(&srv.child)), &one).unwrap();
    sched_setaffinity(None, &one).unwrap();
    run_one_at_a_time(&srv, us(20), 4000, 40_000);
    sched_setaffinity(None, &mine).unwrap();
}

#[test]
fn no_kick_is_lost_between_a_sleeping_and_a_busy_side() {
    one_at_a_time(&["--poll-us", "0"], PollMode::Busy, 12_000, 5_000);
    one_at_a_time(&["--poll"], PollMode::SLEEP, 2000, 40_000);
}

#[test]
fn a_polling_back_end_serves_the_next_front_end() {
    let srv = Server::start(IMAGE, &["--poll"]);
    // A first front end in its own process, killed while it runs.
    let mut first = Command::new(iopath_bin())
        .args(["blk", "dd", "--socket"])
        .arg(&srv.socket)
        .args(["--bs", "4K", "--count", "2048", "--access", "rand"])
        .args(["--runs", "100000", "--poll"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // It is killed once it has written the whole image (a run of 2048
    // random blocks, each once): well into its runs, with the back end
    // polling its queue.
    let allocated =
        || std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&srv.image).unwrap());
    iopath_testkit::wait_until(
        "the first dd writing the whole image",
        Duration::from_secs(30),
        || allocated() >= IMAGE / 512,
    );
    first.kill().unwrap();
    first.wait().unwrap();

    // The next one is served, its data lands, within seconds.
    let t = Instant::now();
    let (wbuf, rbuf) = (alloc(BS), alloc(BS));
    let opts = DriverOptions {
        timeout: Duration::from_secs(10),
        poll: PollMode::Busy,
        ..DriverOptions::default()
    };
    let bufs = [wbuf.clone(), rbuf.clone()];
    let mut drv = driver(Mode::Direct, connect(&srv.socket), &bufs, &opts).unwrap();
    let want = seq(1 << 20, BS);
    wbuf.write_at(0, &want).unwrap();
    drv.write(1 << 20, &wbuf, 0, BS).unwrap();
    drv.flush().unwrap();
    drv.read(1 << 20, &rbuf, 0, BS).unwrap();
    let mut got = vec![0u8; BS];
    rbuf.read_at(0, &mut got).unwrap();
    assert!(got == want, "the second front end reads back wrong data");
    assert!(srv.image_bytes(1 << 20, BS) == want, "not in the image");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "served after {:?}",
        t.elapsed()
    );
}

#[test]
fn a_polling_driver_times_out_naming_the_request() {
    let srv = Server::start(IMAGE, &["--poll"]);
    let buf = alloc(BS);
    let opts = DriverOptions {
        timeout: Duration::from_secs(1),
        poll: PollMode::Busy,
        ..DriverOptions::default()
    };
    let mut drv = driver(
        Mode::Direct,
        connect(&srv.socket),
        std::slice::from_ref(&buf),
        &opts,
    )
    .unwrap();
    drv.write(0, &buf, 0, BS).unwrap();
    let pid = rustix::process::Pid::from_child(&srv.child);
    common::stop(pid);
    let t = Instant::now();
    let err = drv.read(3 * 4096, &buf, 0, BS).unwrap_err();
    let took = t.elapsed();
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
    match &err {
        BlkError::Timeout {
            queue: 0,
            request: "read",
            sector: 24,
            in_flight: 1,
            timeout,
        } => assert_eq!(*timeout, Duration::from_secs(1)),
        other => panic!("unexpected {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("read at sector 24"), "{msg}");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "gave up after {took:?}"
    );
}

/// A sleeping driver that coalesces ([`iopath_blk::BlkQueue::coalesce`]:
/// woken once about three quarters of its requests in flight are done)
/// against a sleeping back end: with 1 to 32 reads in flight, each slot
/// refilled as it drains and the last ones draining to none, every wait
/// ends within [`STALL`] and every block reads back right. An interrupt
/// asked for past the last request in flight would leave the driver
/// asleep until its timeout. The same with one request of them held back
/// ([`iopath_blk::BlkQueue::limit_in_flight`]), handed over as a
/// completion is seen: a held request never published would stall.
#[test]
fn no_completion_is_lost_when_a_sleeping_driver_coalesces() {
    let srv = Server::start(IMAGE, &["--poll-us", "0"]);
    const BLOCKS: u64 = 512;
    let bufs: Vec<_> = (0..32).map(|_| alloc(BS)).collect();
    let opts = DriverOptions {
        timeout: Duration::from_secs(5),
        poll: PollMode::SLEEP,
        ..DriverOptions::default()
    };
    let drv = driver(Mode::Direct, connect(&srv.socket), &bufs, &opts).unwrap();
    let common::AnyDriver::Dyn(mut drv) = drv else {
        unreachable!("Mode::Direct is the dynamic build")
    };
    for b in 0..BLOCKS {
        let off = b * BS as u64;
        bufs[0].write_at(0, &seq(off, BS)).unwrap();
        drv.write(off, &bufs[0], 0, BS).unwrap();
    }
    let q = &mut drv.queues_mut()[0];
    q.coalesce(true);
    let mut got = vec![0u8; BS];
    let limits = [1usize, 2, 3, 4, 7, 13, 32].map(|d| (d, None));
    let held = [2usize, 3, 8, 32].map(|d| (d, Some(d - 1)));
    for (depth, limit) in limits.into_iter().chain(held) {
        q.limit_in_flight(limit).unwrap();
        let mut handed_over = 0;
        let mut next = 0u64;
        // slot -> block read into it
        let mut busy: Vec<Option<u64>> = vec![None; depth];
        let read = |q: &mut iopath_blk::BlkQueue, slot: usize, b: u64| {
            let cmd = iopath_blk::Command::Read {
                offset: b * BS as u64,
                buf: &bufs[slot],
                buf_offset: 0,
                len: BS,
            };
            q.submit(cmd, slot as u64).unwrap();
        };
        for (slot, b) in busy.iter_mut().enumerate() {
            read(q, slot, next);
            *b = Some(next);
            next += 1;
        }
        while busy.iter().any(Option::is_some) {
            let t = Instant::now();
            let d = q.complete().unwrap();
            let took = t.elapsed();
            assert!(took < STALL, "depth {depth}: a wait took {took:?}");
            let slot = d.tag as usize;
            d.result.unwrap();
            handed_over += usize::from(d.timing.is_some_and(|(s, e)| s <= e));
            let b = busy[slot].take().unwrap();
            bufs[slot].read_at(0, &mut got).unwrap();
            assert!(got == seq(b * BS as u64, BS), "depth {depth}: block {b}");
            if next < BLOCKS {
                read(q, slot, next);
                busy[slot] = Some(next);
                next += 1;
            }
        }
        assert_eq!(next, BLOCKS);
        // Under a limit, each request says when it was handed over.
        let want = if limit.is_some() { BLOCKS as usize } else { 0 };
        assert_eq!(handed_over, want, "depth {depth}, limit {limit:?}");
    }
}
