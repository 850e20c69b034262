//! The engines alone, without allocation: how fast each method moves a cold
//! file into buffers that are already allocated and mapped, and how fast
//! allocation alone is. Rows alternate within every round, so a drift of the
//! disk or of the machine's load hits every row alike.
//!
//! ```text
//! cargo run --release -p iopath-heap --example engines -- FILE ROUNDS ROW...
//!   ROW = METHOD[:REQUEST_SIZE_MIB[:QUEUE_DEPTH]]   e.g. direct uring:1:16 uring:4:16
//!       | alloc:THREADS                             allocate + map, no I/O
//! ```
//!
//! Buffers are 32 MiB memfd buffers, as `iopath load` uses; the file's
//! cache is dropped (`POSIX_FADV_DONTNEED`) before every row.

use std::path::PathBuf;
use std::time::Instant;

use iopath_heap::{
    new_engine, Buffer, EngineOptions, Heap, HugePages, IoFile, MemfdHeap, Method, Pull, ReadReq,
};

const BUF: usize = 32 << 20;

fn alloc_all(heap: &MemfdHeap, n: usize, threads: usize) -> Vec<Buffer> {
    let per = n.div_ceil(threads.max(1));
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads.max(1))
            .map(|t| {
                s.spawn(move || {
                    let lo = (t * per).min(n);
                    let hi = ((t + 1) * per).min(n);
                    (lo..hi)
                        .map(|_| {
                            let b = heap.alloc(BUF).expect("alloc");
                            b.populate().expect("populate");
                            b
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().expect("allocator thread"))
            .collect()
    })
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: engines FILE ROUNDS ROW... (see the source)";
    let path = PathBuf::from(args.next().expect(usage));
    let rounds: usize = args.next().expect(usage).parse().expect("ROUNDS");
    let rows: Vec<String> = args.collect();
    assert!(!rows.is_empty(), "{usage}");
    let file = IoFile::open(&path).expect("open FILE");
    let size = file.size().expect("size") as usize;
    let n = size.div_ceil(BUF);
    let heap = MemfdHeap::new(HugePages::None);
    let bufs = alloc_all(&heap, n, 1);
    let mut got: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    for round in 0..rounds {
        for k in 0..rows.len() {
            let i = (k + round) % rows.len();
            let spec: Vec<&str> = rows[i].split(':').collect();
            file.drop_cache().expect("drop cache");
            if spec[0] == "alloc" {
                let threads = spec.get(1).map_or(1, |t| t.parse().expect("THREADS"));
                let t = Instant::now();
                let b = alloc_all(&heap, n, threads);
                let secs = t.elapsed().as_secs_f64();
                drop(b);
                got[i].push((n * BUF) as f64 / f64::from(1u32 << 30) / secs);
                continue;
            }
            let method: Method = spec[0].parse().expect("METHOD");
            let mut opts = EngineOptions::default();
            if let Some(c) = spec.get(1) {
                opts.chunk = c.parse::<usize>().expect("REQUEST_SIZE_MIB") << 20;
            }
            if let Some(d) = spec.get(2) {
                opts.queue_depth = d.parse().expect("QUEUE_DEPTH");
            }
            let engine = new_engine(method, opts).expect("engine");
            let mut next_i = 0;
            let mut next = |_wait: bool| {
                if next_i == n {
                    return Ok(Pull::End);
                }
                let off = next_i * BUF;
                let r = ReadReq {
                    buf: bufs[next_i].clone(),
                    buf_off: 0,
                    file_off: off as u64,
                    len: BUF.min(size - off),
                };
                next_i += 1;
                Ok(Pull::Req(r))
            };
            let t = Instant::now();
            let tr = engine
                .read_batch(&file, &mut next, &mut |_, _| {})
                .expect("read");
            let secs = t.elapsed().as_secs_f64();
            assert_eq!(tr.bytes, size as u64);
            got[i].push(size as f64 / f64::from(1u32 << 30) / secs);
        }
    }
    for (row, g) in rows.iter().zip(&mut got) {
        let runs: Vec<String> = g.iter().map(|x| format!("{x:.2}")).collect();
        g.sort_by(f64::total_cmp);
        println!(
            "{row:16} median {:.3} GiB/s  min {:.3}  max {:.3}  runs {}",
            g[g.len() / 2],
            g[0],
            g[g.len() - 1],
            runs.join(" ")
        );
    }
}
