//! How a load reports itself: [`LoadStats`], [`Shard`] and [`Probe`] as
//! JSON (`Serialize`, times in seconds and milliseconds, rates in GiB/s)
//! and as the words of a summary line (`Display`), which
//! [`Loaded::summary`] and [`Tensors::summary`] complete.

use std::fmt;

use serde::{Serialize, Serializer};

use iopath_sys::human;

use crate::{LoadStats, Loaded, Probe, Shard, Tensors};

/// `in 0.123 s: 4.56 GiB/s, method uring (auto: …), 0 fallback(s), 1 MiB
/// (3%) from the page cache`, and what was mapped, if anything.
impl fmt::Display for LoadStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let map = if self.mapped > 0 { "map + " } else { "" };
        write!(
            f,
            "in {:.3} s: {:.2} GiB/s, method {map}{}",
            self.elapsed.as_secs_f64(),
            self.gib_per_s(),
            self.method
        )?;
        if let Some(p) = &self.probe {
            write!(f, " ({p})")?;
        }
        let pct = if self.bytes == 0 {
            0.0
        } else {
            self.from_cache as f64 * 100.0 / self.bytes as f64
        };
        write!(
            f,
            ", {} fallback(s), {} ({pct:.0}%) from the page cache",
            self.fallbacks,
            human(self.from_cache)
        )?;
        match self.populate {
            Some(how) => write!(
                f,
                "; {} mapped from the page cache (views of the files, made resident with {how})",
                human(self.mapped)
            ),
            None => Ok(()),
        }
    }
}

impl Loaded {
    /// The line `iopath load` prints for a load into buffers of `heap`:
    /// `loaded 5 MiB (5242880 bytes) into 5 x 1 MiB memfd buffers in …;
    /// alloc 4 ms (overlapped), read 3 ms`.
    pub fn summary(&self, heap: &str) -> String {
        let s = &self.stats;
        format!(
            "loaded {} ({} bytes) into {} x {} {heap} buffers {s}; alloc {:.0} ms (overlapped), read {:.0} ms",
            human(s.bytes),
            s.bytes,
            s.buffers,
            human(s.buffer_size as u64),
            s.alloc_time.as_secs_f64() * 1e3,
            s.read_time.as_secs_f64() * 1e3,
        )
    }
}

impl Tensors {
    /// The line `iopath load` prints for a checkpoint loaded into buffers
    /// of `heap`: `loaded 4 tensors from 2 shards (1 MiB, 1048576 bytes)
    /// into 2 memfd buffers of up to 32 MiB in …`.
    pub fn summary(&self, heap: &str) -> String {
        let s = &self.stats;
        let shards = match self.shards.len() {
            n if n > 1 => format!(" from {n} shards"),
            _ => String::new(),
        };
        format!(
            "loaded {} tensors{shards} ({}, {} bytes) into {} {heap} buffers of up to {} {s}",
            self.tensors.len(),
            human(s.bytes + s.mapped),
            s.bytes + s.mapped,
            s.buffers,
            human(s.buffer_size as u64),
        )
    }
}

impl Serialize for LoadStats {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Json<'a> {
            bytes: u64,
            seconds: f64,
            gib_per_s: f64,
            method: &'a str,
            mapped_bytes: u64,
            populate: Option<&'a str>,
            buffers: usize,
            buffer_size: usize,
            fallbacks: u64,
            from_cache_bytes: u64,
            auto_probe: Option<Probe>,
            alloc_ms: f64,
            read_ms: f64,
        }
        Json {
            bytes: self.bytes,
            seconds: self.elapsed.as_secs_f64(),
            gib_per_s: self.gib_per_s(),
            method: self.method.name(),
            mapped_bytes: self.mapped,
            populate: self.populate,
            buffers: self.buffers,
            buffer_size: self.buffer_size,
            fallbacks: self.fallbacks,
            from_cache_bytes: self.from_cache,
            auto_probe: self.probe,
            alloc_ms: self.alloc_time.as_secs_f64() * 1e3,
            read_ms: self.read_time.as_secs_f64() * 1e3,
        }
        .serialize(s)
    }
}

/// A shard's file, tensors and load figures (`done_seconds`: from the
/// start of the whole load to its last byte).
impl Serialize for Shard {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Json<'a> {
            file: &'a std::path::Path,
            tensors: usize,
            bytes: u64,
            buffers: usize,
            method: &'a str,
            done_seconds: f64,
            read_ms: f64,
            fallbacks: u64,
            mapped_bytes: u64,
        }
        let st = &self.stats;
        Json {
            file: &self.path,
            tensors: self.tensors,
            bytes: st.bytes,
            buffers: st.buffers,
            method: st.method.name(),
            done_seconds: st.elapsed.as_secs_f64(),
            read_ms: st.read_time.as_secs_f64() * 1e3,
            fallbacks: st.fallbacks,
            mapped_bytes: st.mapped,
        }
        .serialize(s)
    }
}

/// `auto: measured uring 2.10, direct 1.90 GiB/s`, or bounce against
/// buffered where the buffers' mapping refuses direct I/O.
impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.mapping_refused_direct() {
            write!(
                f,
                "auto: the buffers' mapping refuses direct I/O; measured bounce {:.2}, buffered {:.2} GiB/s",
                self.bounce_gib_per_s(),
                self.buffered_gib_per_s()
            )
        } else if self.direct.0 > 0 {
            write!(
                f,
                "auto: measured uring {:.2}, direct {:.2} GiB/s",
                self.uring_gib_per_s(),
                self.direct_gib_per_s()
            )
        } else {
            f.write_str("auto")
        }
    }
}

/// The rates and bytes of the two engines weighed.
impl Serialize for Probe {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(untagged)]
        enum Json {
            Refused {
                mapping_refuses_direct_io: bool,
                bounce_gib_per_s: f64,
                bounce_bytes: u64,
                buffered_gib_per_s: f64,
                buffered_bytes: u64,
            },
            Direct {
                uring_gib_per_s: f64,
                uring_bytes: u64,
                direct_gib_per_s: f64,
                direct_bytes: u64,
            },
        }
        let json = if self.mapping_refused_direct() {
            Json::Refused {
                mapping_refuses_direct_io: true,
                bounce_gib_per_s: self.bounce_gib_per_s(),
                bounce_bytes: self.bounce.0,
                buffered_gib_per_s: self.buffered_gib_per_s(),
                buffered_bytes: self.buffered.0,
            }
        } else {
            Json::Direct {
                uring_gib_per_s: self.uring_gib_per_s(),
                uring_bytes: self.uring.0,
                direct_gib_per_s: self.direct_gib_per_s(),
                direct_bytes: self.direct.0,
            }
        };
        json.serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{LoadStats, Method, Probe};

    fn stats() -> LoadStats {
        LoadStats {
            bytes: 4 << 20,
            buffers: 2,
            buffer_size: 2 << 20,
            alloc_time: Duration::from_millis(3),
            read_time: Duration::from_millis(5),
            elapsed: Duration::from_millis(500),
            method: Method::Uring,
            fallbacks: 1,
            from_cache: 1 << 20,
            probe: Some(Probe {
                uring: (1 << 30, Duration::from_secs(1)),
                direct: (1 << 29, Duration::from_secs(1)),
                ..Probe::default()
            }),
            mapped: 0,
            populate: None,
        }
    }

    #[test]
    fn summary_words() {
        assert_eq!(
            stats().to_string(),
            "in 0.500 s: 0.01 GiB/s, method uring (auto: measured uring 1.00, direct 0.50 GiB/s), \
             1 fallback(s), 1 MiB (25%) from the page cache"
        );
    }

    #[test]
    fn json_keys() {
        let v = serde_json::to_value(stats()).unwrap();
        assert_eq!(v["bytes"], 4 << 20);
        assert_eq!(v["method"], "uring");
        assert_eq!(v["from_cache_bytes"], 1 << 20);
        assert_eq!(v["read_ms"], 5.0);
        assert_eq!(v["auto_probe"]["direct_bytes"], 1 << 29);
        assert_eq!(v["auto_probe"]["uring_gib_per_s"], 1.0);
        assert!(v["populate"].is_null());
    }
}
