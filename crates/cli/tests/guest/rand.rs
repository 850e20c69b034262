//! The guest's small-block random I/O (`scripts/guest-dd --access rand`):
//! the pattern tool fills a range, reads random 4 KiB blocks of it and
//! checks each against the pattern, writes random blocks with the
//! complement pattern, and reads the range back. The host then checks the
//! image block by block.

use super::*;

/// Random block size (`--bs 4K`).
pub const RAND_BS: u64 = 4096;
/// The random range: 4 KiB-aligned, away from offset 0 (SeaBIOS reads the
/// first sectors before Linux boots).
pub const RAND_OFF: u64 = (4 << 20) + (8 << 10);
pub const RAND_SIZE: u64 = 8 << 20;
/// Bytes past the range that must keep the fill.
const RAND_TAIL: u64 = 4 << 20;

/// An image of the fill, the range and a tail.
pub fn make_rand_image(path: &Path) {
    let mut f = File::create(path).expect("create image");
    let chunk = vec![FILL; 1 << 20];
    let len = RAND_OFF + RAND_SIZE + RAND_TAIL;
    for _ in 0..len.div_ceil(chunk.len() as u64) {
        f.write_all(&chunk).expect("fill image");
    }
    f.sync_all().expect("sync image");
}

/// Boots the guest for `count` random reads and writes with `threads`
/// requests in flight, and checks the figures and the guest's own
/// verification in the JSON it prints.
pub fn run_guest_rand(
    backend: &mut Backend,
    sock: &Path,
    dir: &Path,
    count: u64,
    threads: u32,
    seed: u64,
) -> serde_json::Value {
    let args: Vec<String> = [
        "--socket",
        &sock.display().to_string(),
        "--access",
        "rand",
        "--bs",
        "4K",
        "--count",
        &count.to_string(),
        "--rand-threads",
        &threads.to_string(),
        "--pattern-offset",
        &RAND_OFF.to_string(),
        "--pattern-size",
        &RAND_SIZE.to_string(),
        "--pattern-seed",
        &format!("{seed:#x}"),
        "--timeout",
        "240",
        "--json",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let what = format!("random 4K, {threads} thread(s)");
    let json = run_guest_dd(backend, dir, &args, &what);
    assert_eq!(json["access"], "rand", "{json}");
    assert_eq!(json["bs_bytes"], RAND_BS, "{json}");
    assert_eq!(json["threads"], threads, "{json}");
    for d in ["read", "write"] {
        let r = &json[d];
        assert_eq!(r["ios"], count, "{d}: {r}");
        let iops = r["iops"].as_f64().unwrap_or(0.0);
        assert!(iops > 0.0, "{d}: no IOPS: {r}");
        let (p50, p99) = (r["p50_us"].as_f64(), r["p99_us"].as_f64());
        let (Some(p50), Some(p99)) = (p50, p99) else {
            panic!("{d}: no latency percentiles: {r}");
        };
        assert!(p50 > 0.0 && p99 >= p50, "{d}: p50 {p50} us, p99 {p99} us");
    }
    // Every random read was compared with the pattern in the guest.
    assert_eq!(json["read"]["verified_bytes"], count * RAND_BS, "{json}");
    let distinct = json["write"]["distinct_blocks"].as_u64().unwrap_or(0);
    assert!(
        distinct > 0 && distinct <= count,
        "{distinct} distinct blocks written by {count} writes"
    );
    assert_eq!(json["verify"]["blocks"], RAND_SIZE / RAND_BS, "{json}");
    assert_eq!(json["verify"]["written_blocks"], distinct, "{json}");
    assert_interrupts(&json, 1);
    json
}

/// Checks the image after a random run: every 4 KiB block of the range
/// holds the pattern `o ^ seed` or, where the guest wrote it, the
/// complement `!(o ^ seed)`, whole; the fill is intact before and after
/// the range. Returns how many blocks hold the complement, or the first
/// difference.
pub fn check_rand_image(path: &Path, seed: u64) -> Result<u64, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let end = RAND_OFF + RAND_SIZE;
    if (bytes.len() as u64) < end + RAND_TAIL {
        return Err(format!(
            "image is {} bytes, shorter than it was",
            bytes.len()
        ));
    }
    let outside = (0..RAND_OFF).chain(end..end + RAND_TAIL);
    if let Some(o) = outside.into_iter().find(|&o| bytes[o as usize] != FILL) {
        return Err(format!(
            "byte {o} is {:#04x}, outside the random range, want the fill {FILL:#04x}",
            bytes[o as usize]
        ));
    }
    let mut written = 0;
    for blk in (RAND_OFF..end).step_by(RAND_BS as usize) {
        let got = &bytes[blk as usize..(blk + RAND_BS) as usize];
        let holds = |s: u64| {
            got.chunks_exact(8)
                .zip((blk..).step_by(8))
                .all(|(w, o)| w == pattern_word(o, s))
        };
        if holds(!seed) {
            written += 1;
        } else if !holds(seed) {
            return Err(format!(
                "the 4 KiB block at {blk} holds neither the pattern nor its complement \
                 (first word {:02x?})",
                &got[..8]
            ));
        }
    }
    Ok(written)
}
