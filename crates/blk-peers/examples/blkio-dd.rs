//! `blkio-dd`: libblkio's `virtio-blk-vhost-user` driver run like `iopath
//! blk dd`, for `iopath bench blk` to put beside iopath's own driver. It
//! is an example of this test-only crate so that libblkio stays a
//! dev-dependency, never one of the product's: build it with
//! `cargo build --release -p iopath-blk-peers --example blkio-dd`.
//!
//! ```text
//! blkio-dd --socket PATH [--bs 4096] [--count N] [--queue-depth D]
//!          [--op read|write] [--access rand|seq] [--seed S] [--runs R]
//!          [--poll]
//! ```
//!
//! Each run keeps D requests in flight on one queue (a poll queue with
//! `--poll`, else one that sleeps on its completion eventfd), every block
//! of the range once, and prints one line of JSON per run:
//! `{"run":1,"count":N,"bs":4096,"seconds":S,"iops":I,"p50_us":L,
//! "p99_us":L,"cpu_ns":C}`: latency from submission to the completion
//! being taken, and this process's CPU time over the run.

use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use blkio::{Blkio, Completion, ReqFlags};

#[derive(Debug)]
struct Args {
    socket: String,
    bs: usize,
    count: u64,
    depth: usize,
    write: bool,
    rand: bool,
    seed: u64,
    runs: usize,
    poll: bool,
}

fn usage(msg: &str) -> ! {
    eprintln!("blkio-dd: {msg}");
    std::process::exit(2);
}

fn parse() -> Args {
    let mut a = Args {
        socket: String::new(),
        bs: 4096,
        count: 65536,
        depth: 1,
        write: false,
        rand: true,
        seed: 0,
        runs: 1,
        poll: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(opt) = it.next() {
        if opt == "--poll" {
            a.poll = true;
            continue;
        }
        let v = it
            .next()
            .unwrap_or_else(|| usage(&format!("{opt} needs a value")));
        let num = |v: &str| -> u64 {
            v.parse()
                .unwrap_or_else(|_| usage(&format!("{opt} {v}: not a number")))
        };
        match opt.as_str() {
            "--socket" => a.socket = v,
            "--bs" => a.bs = num(&v) as usize,
            "--count" => a.count = num(&v),
            "--queue-depth" => a.depth = num(&v) as usize,
            "--seed" => a.seed = num(&v),
            "--runs" => a.runs = num(&v) as usize,
            "--op" => a.write = v == "write",
            "--access" => a.rand = v == "rand",
            _ => usage(&format!("unknown option {opt}")),
        }
    }
    if a.socket.is_empty() || a.depth == 0 || a.count == 0 || a.bs % 512 != 0 {
        usage("--socket is needed; --queue-depth, --count > 0; --bs a multiple of 512");
    }
    a
}

/// This process's CPU time (user and system, every thread), ns.
fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Block numbers 0..count, shuffled from `seed` (xorshift) when `rand`.
fn order(count: u64, rand: bool, seed: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..count).collect();
    if rand {
        let mut x = seed ^ 0x2545_f491_4f6c_dd1d;
        for i in (1..v.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.swap(i, (x % (i as u64 + 1)) as usize);
        }
    }
    v
}

fn main() {
    let a = parse();
    let fail = |what: &str, e: blkio::Error| -> ! {
        eprintln!("blkio-dd: {what}: {e}");
        std::process::exit(1);
    };
    let mut b = Blkio::new("virtio-blk-vhost-user").unwrap_or_else(|e| fail("new", e));
    b.set_str("path", &a.socket)
        .unwrap_or_else(|e| fail("path", e));
    b.connect().unwrap_or_else(|e| fail("connect", e));
    let capacity = b
        .get_u64("capacity")
        .unwrap_or_else(|e| fail("capacity", e));
    if a.count * a.bs as u64 > capacity {
        usage(&format!(
            "--bs x --count is past the device's {capacity} bytes"
        ));
    }
    let (queues, polls) = if a.poll { (0, 1) } else { (1, 0) };
    b.set_i32("num-queues", queues)
        .unwrap_or_else(|e| fail("num-queues", e));
    b.set_i32("num-poll-queues", polls)
        .unwrap_or_else(|e| fail("num-poll-queues", e));
    let mut started = b.start().unwrap_or_else(|e| fail("start", e));
    let mut q = started
        .queues
        .pop()
        .or_else(|| started.poll_queues.pop())
        .expect("one queue");
    let region = b
        .alloc_mem_region(a.bs * a.depth)
        .unwrap_or_else(|e| fail("alloc_mem_region", e));
    b.map_mem_region(&region)
        .unwrap_or_else(|e| fail("map_mem_region", e));
    // Left as libblkio starts it: do_io enables the completion eventfd
    // only while it must wait, so completions that come while it works
    // cost no interrupt.
    let mut done: Vec<MaybeUninit<Completion>> =
        (0..a.depth).map(|_| MaybeUninit::uninit()).collect();
    for run in 0..a.runs {
        let blocks = order(a.count, a.rand, a.seed.wrapping_add(run as u64));
        let mut next = blocks.iter();
        let submit = |q: &mut blkio::Blkioq, slot: usize, block: u64| {
            let buf = (region.addr + slot * a.bs) as *mut u8;
            let off = block * a.bs as u64;
            if a.write {
                q.write(off, buf, a.bs, slot, ReqFlags::empty());
            } else {
                q.read(off, buf, a.bs, slot, ReqFlags::empty());
            }
        };
        let mut latency: Vec<u32> = Vec::with_capacity(blocks.len());
        let mut since = vec![Instant::now(); a.depth];
        let cpu = cpu_ns();
        let t = Instant::now();
        let mut in_flight = 0;
        for (slot, at) in since.iter_mut().enumerate() {
            if let Some(&blk) = next.next() {
                *at = Instant::now();
                submit(&mut q, slot, blk);
                in_flight += 1;
            }
        }
        while in_flight > 0 {
            let n = q
                .do_io(&mut done, 1, None, None)
                .unwrap_or_else(|e| fail("do_io", e));
            let now = Instant::now();
            for c in &done[..n] {
                // SAFETY: do_io filled the first `n` entries.
                let c = unsafe { c.assume_init_ref() };
                if c.ret != 0 {
                    eprintln!("blkio-dd: request failed: {}", c.ret);
                    std::process::exit(1);
                }
                let took = now.saturating_duration_since(since[c.user_data]);
                latency.push(took.as_nanos().try_into().unwrap_or(u32::MAX));
                in_flight -= 1;
                if let Some(&blk) = next.next() {
                    since[c.user_data] = Instant::now();
                    submit(&mut q, c.user_data, blk);
                    in_flight += 1;
                }
            }
        }
        let s = t.elapsed().as_secs_f64();
        let cpu = cpu_ns() - cpu;
        latency.sort_unstable();
        let pct = |p: usize| {
            let i = (latency.len() * p / 100).min(latency.len() - 1);
            Duration::from_nanos(latency[i].into()).as_secs_f64() * 1e6
        };
        println!(
            "{{\"run\":{},\"count\":{},\"bs\":{},\"seconds\":{s},\"iops\":{},\
             \"p50_us\":{},\"p99_us\":{},\"cpu_ns\":{cpu}}}",
            run + 1,
            a.count,
            a.bs,
            a.count as f64 / s,
            pct(50),
            pct(99),
        );
    }
    drop(q);
    b.unmap_mem_region(&region);
}
