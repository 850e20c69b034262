//! `iopath bench heap`: its arguments, mapped to [`HeapConfig`].

use std::path::PathBuf;

use iopath_bench::heap::HeapConfig;
use iopath_bench::Report;

use super::Outputs;

/// Arguments of `iopath bench heap`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Each run drops the file's cached pages first (fsync + POSIX_FADV_DONTNEED,
checked with mincore). Columns: alloc ms = time allocating and faulting in
buffers on the allocator thread (overlapped with reads); read ms = time in
transfers; total ms = wall time, allocation included; GiB/s over total;
cache growth = file pages left in the page cache (worst run). Two bounds are
measured in every run: fio's O_DIRECT io_uring read of the same file (the
`limit` row, 100%) and allocating and faulting in the same buffers with no
I/O (`alloc only`); a load can be no faster than the slower of the two.")]
pub struct HeapArgs {
    /// Read this file (it must hold buffers x buffer-size bytes).
    #[arg(long, conflicts_with = "size")]
    pub file: Option<PathBuf>,
    /// Make a scratch file of this size in /var/tmp (or the current
    /// directory, never a tmpfs), removed afterwards [default: 1G].
    #[arg(long, value_parser = iopath_sys::parse_size::<usize>)]
    pub size: Option<usize>,
    /// Buffers per load [default: file size / buffer size].
    #[arg(long)]
    pub buffers: Option<usize>,
    /// Bytes per buffer.
    #[arg(long, default_value = "32M", value_parser = iopath_sys::parse_size::<usize>)]
    pub buffer_size: usize,
    /// Runs per row (median and spread are reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Heaps to try, comma-separated [default: all; absent ones are listed
    /// as skipped].
    #[arg(long, value_delimiter = ',')]
    pub heaps: Vec<String>,
    /// Methods to try, comma-separated [default: auto,buffered,direct,sendfile,uring].
    #[arg(long, value_delimiter = ',')]
    pub methods: Vec<String>,
    /// io_uring requests in flight.
    #[arg(long, default_value_t = 16)]
    pub queue_depth: u32,
    /// Only the dma-buf table: the six rows of the DMA_BUF_IOCTL_RW_FILE
    /// proposal (udmabuf buffered/direct read and sendfile, dma-heap
    /// buffered/direct read), iopath's routes beside them and a pool's
    /// first and second load; no heap x method sweep and no fio limit.
    #[arg(long)]
    pub dma_buf_table: bool,
    /// Print one JSON object with `rows` and `limit`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub out: Outputs,
}

impl HeapArgs {
    fn config(&self) -> HeapConfig {
        HeapConfig {
            file: self.file.clone(),
            size: self.size,
            buffers: self.buffers,
            buffer_size: self.buffer_size,
            runs: self.runs,
            heaps: self.heaps.clone(),
            methods: self.methods.clone(),
            queue_depth: self.queue_depth,
            progress: !self.json,
            dma_buf_only: self.dma_buf_table,
        }
    }

    /// Runs the experiment.
    pub(super) fn report(&self) -> anyhow::Result<Report> {
        Ok(iopath_bench::heap::run(&self.config())?.report())
    }
}
