//! Python bindings of iopath-heap (module `iopath._iopath`; the `iopath`
//! package wraps it): buffers with the buffer protocol and their fds, the
//! loader, the safetensors loader (one file or a sharded checkpoint), and
//! shares of loaded tensors that other processes attach to, and pools that
//! keep buffers for the next load. Loading releases the GIL.

use std::os::fd::AsRawFd;
use std::os::raw::c_int;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use iopath_heap::{open_heap, Heap, LoadOptions, SharedTensor};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// An fd-backed shareable buffer. Supports the buffer protocol (a zero-copy,
/// writable `memoryview` of the `filled` bytes, those of the file;
/// `numpy.frombuffer` works on it) and `fileno()`, whose fd can be sent to
/// another process (`socket.send_fds`) and mapped there (`len()` bytes, the
/// whole mapping).
#[pyclass(module = "iopath", name = "Buffer", frozen, weakref)]
struct PyBuffer {
    buf: iopath_heap::Buffer,
    /// Bytes of the file in it.
    filled: usize,
}

#[pymethods]
impl PyBuffer {
    /// The buffer's file descriptor (owned by the buffer: dup it to keep
    /// it). Once asked for, the fd may reach another process, so a `Pool`
    /// never reuses this buffer's memory.
    fn fileno(&self) -> i32 {
        self.buf.mark_exported();
        self.buf.fd().as_raw_fd()
    }

    /// Length in bytes of the mapping (what `mmap` of `fileno()` takes);
    /// the bytes of the file in it are `filled`.
    fn __len__(&self) -> usize {
        self.buf.len()
    }

    /// Bytes of the file loaded into it.
    #[getter]
    fn filled(&self) -> usize {
        self.filled
    }

    /// This process's address of its first byte (to find which buffer an
    /// array's data is in).
    #[getter]
    fn address(&self) -> usize {
        self.buf.addr()
    }

    /// The heap it came from.
    #[getter]
    fn kind(&self) -> String {
        self.buf.kind().to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "<iopath.Buffer {} bytes ({} filled), {}, fd {}>",
            self.buf.len(),
            self.filled,
            self.buf.kind(),
            self.buf.fd().as_raw_fd()
        )
    }

    /// # Safety
    /// Called by Python with a valid `Py_buffer` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        // Only the bytes of the file: the rest of the mapping is padding
        // (a 1-byte file sits in a page, a last buffer is partly used).
        let (ptr, len) = {
            let (buf, filled) = (&slf.get().buf, slf.get().filled);
            let raw = buf
                .range(0, filled.min(buf.len()))
                .map_err(|e| PyValueError::new_err(e.to_string()))?
                .ptr_guard();
            (raw.as_ptr(), raw.len())
        };
        // SAFETY: `ptr..ptr+len` lies in the buffer's live shared mapping;
        // the view holds a reference to `slf` (PyBuffer_FillInfo sets
        // `view.obj`), which owns the buffer and so the mapping, so it
        // outlives the view even though the guard above does not.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                ptr.cast(),
                len as ffi::Py_ssize_t,
                0,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    /// # Safety
    /// Called by Python when a view made by `__getbuffer__` goes.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// Buffers kept across loads: a load given the pool takes a free buffer of
/// the size it needs, pages already in place, instead of allocating and
/// faulting a new one (a server's reload). A buffer is free again once
/// nothing holds it: every array or tensor over it, every `Buffer` and
/// memoryview of it gone. One whose fd left the process (an attach to a
/// share of it, `Buffer.fileno()`) is never reused: the pool lets it go.
#[pyclass(module = "iopath", name = "Pool", frozen)]
struct PyPool {
    pool: Arc<iopath_heap::Pool>,
}

#[pymethods]
impl PyPool {
    /// A pool over `heap` (as `load_safetensors` takes it) keeping up to
    /// `capacity` bytes of buffers (default: every buffer it makes; each
    /// load still checks that it fits in memory); buffers beyond it are
    /// allocated and freed as usual. A capacity beyond what the heap can
    /// give now is a `ValueError`.
    #[new]
    #[pyo3(signature = (heap = "auto", capacity = None))]
    fn new(heap: &str, capacity: Option<u64>) -> PyResult<Self> {
        let heap = open_heap(heap).map_err(to_py)?;
        let pool = match capacity {
            Some(c) => iopath_heap::Pool::new(heap, c).map_err(to_py)?,
            None => iopath_heap::Pool::unbounded(heap),
        };
        Ok(PyPool {
            pool: Arc::new(pool),
        })
    }

    /// Bytes of buffers the pool may keep (None: no limit).
    #[getter]
    fn capacity(&self) -> Option<u64> {
        Some(self.pool.capacity()).filter(|&c| c != u64::MAX)
    }

    /// Bytes of buffers the pool keeps, free or in use.
    #[getter]
    fn kept_bytes(&self) -> u64 {
        self.pool.kept_bytes()
    }

    /// Bytes of kept buffers that are free now.
    #[getter]
    fn free_bytes(&self) -> u64 {
        self.pool.free_bytes()
    }

    /// Allocations served by reusing a kept buffer.
    #[getter]
    fn reused(&self) -> u64 {
        self.pool.counts().0
    }

    /// Allocations served by the heap.
    #[getter]
    fn made(&self) -> u64 {
        self.pool.counts().1
    }

    /// Frees every kept buffer not in use.
    fn shrink(&self) {
        self.pool.shrink();
    }

    fn __repr__(&self) -> String {
        let (reused, made) = self.pool.counts();
        let of = match self.capacity() {
            Some(c) => format!(" of {c}"),
            None => String::new(),
        };
        format!(
            "<iopath.Pool {}, {}{of} bytes kept, {} free, {reused} reused, {made} made>",
            self.pool.name(),
            self.pool.kept_bytes(),
            self.pool.free_bytes()
        )
    }
}

/// The heap a load allocates from: the pool's, else `heap` opened.
enum LoadHeap {
    Pool(Arc<iopath_heap::Pool>),
    Own(Box<dyn Heap>),
}

impl LoadHeap {
    fn new(heap: &str, pool: Option<&PyPool>) -> PyResult<Self> {
        match pool {
            Some(p) if heap == "auto" => Ok(LoadHeap::Pool(p.pool.clone())),
            Some(_) => Err(PyValueError::new_err(format!(
                "heap={heap:?} with pool: the pool's heap is used (give it to iopath.Pool)"
            ))),
            None => Ok(LoadHeap::Own(open_heap(heap).map_err(to_py)?)),
        }
    }

    fn get(&self) -> &dyn Heap {
        match self {
            LoadHeap::Pool(p) => &**p,
            LoadHeap::Own(h) => h.as_ref(),
        }
    }
}

/// Load options from a method name (`map` too: tensors the page cache
/// holds become views of their file) and a buffer size.
fn options(method: &str, buffer_size: usize) -> PyResult<LoadOptions> {
    let mut opts = LoadOptions {
        buffer_size,
        ..LoadOptions::default()
    };
    opts.set_method(method)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(opts)
}

/// A progress callback: with `show`, one line on stderr rewritten after
/// every read (no GIL needed), ended when the last one is done.
fn progress_printer(show: bool) -> impl FnMut(&iopath_heap::Progress) {
    move |p| {
        if show {
            use std::io::Write;
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\riopath: {} / {} MiB ({:.0}%)",
                p.bytes >> 20,
                p.total >> 20,
                p.bytes as f64 * 100.0 / p.total.max(1) as f64
            );
            if p.shards > 1 {
                let _ = write!(
                    err,
                    ", shard {}/{}: {} / {} MiB",
                    p.shard + 1,
                    p.shards,
                    p.shard_bytes >> 20,
                    p.shard_total >> 20
                );
            }
            if p.buffers == p.buffers_total {
                let _ = writeln!(err);
            }
        }
    }
}

/// The Rust error as a Python exception: input errors as `ValueError`,
/// the rest as `OSError`, with the whole error chain as the message.
fn to_py(e: iopath_heap::Error) -> PyErr {
    let msg = iopath_sys::error_chain(&e);
    if is_bad_input(&e) {
        PyValueError::new_err(msg)
    } else {
        PyOSError::new_err(msg)
    }
}

/// Whether `e` is about the input (a shard's error by what went wrong in
/// it).
fn is_bad_input(e: &iopath_heap::Error) -> bool {
    use iopath_heap::Error as E;
    match e {
        E::Shard { source, .. } => is_bad_input(source),
        E::Safetensors { .. }
        | E::Checkpoint { .. }
        | E::Share { .. }
        | E::BadSize { .. }
        | E::UnknownHeap(_)
        | E::NoSuchDmaHeap { .. }
        | E::UdmabufLimit { .. }
        | E::UnknownMethod(_)
        | E::EmptyFile { .. }
        | E::ShortFile { .. }
        | E::NotAFile { .. }
        | E::UnknownSize { .. }
        | E::NoBuffers
        | E::BadQueueDepth { .. }
        | E::BadChunk { .. }
        | E::TooManyBuffers { .. }
        | E::TooManyShards { .. }
        | E::OutOfMemory { .. } => true,
        _ => false,
    }
}

/// Loads `path` into buffers: a list of `Buffer`s in file order, each with
/// `filled` bytes of the file. The GIL is released while loading;
/// `progress=True` shows progress on stderr; with `pool` (an `iopath.Pool`)
/// the buffers come from it.
#[pyfunction]
#[pyo3(signature = (path, heap = "auto", method = "auto", buffer_size = 32 << 20, progress = false, pool = None))]
fn load(
    py: Python<'_>,
    path: PathBuf,
    heap: &str,
    method: &str,
    buffer_size: usize,
    progress: bool,
    pool: Option<PyRef<'_, PyPool>>,
) -> PyResult<Vec<PyBuffer>> {
    let opts = options(method, buffer_size)?;
    if opts.map_cached {
        return Err(PyValueError::new_err(
            "method=\"map\" is for load_safetensors (tensors are what is mapped)",
        ));
    }
    let heap = LoadHeap::new(heap, pool.as_deref())?;
    let mut show = progress_printer(progress);
    let loaded = py
        .allow_threads(|| iopath_heap::load(&path, heap.get(), &opts, &mut show))
        .map_err(to_py)?;
    Ok(loaded
        .buffers
        .into_iter()
        .zip(loaded.lens)
        .map(|(buf, filled)| PyBuffer { buf, filled })
        .collect())
}

/// Loads a safetensors checkpoint (a file, a directory or an
/// `*.index.json`): returns (buffers, {name: (buffer index, offset, length,
/// dtype, shape)}, stats dict: bytes, seconds, gib_per_s, method, shards,
/// alloc_seconds / read_seconds and from_cache_bytes as `iopath load`
/// reports them; read_bytes (from the device), copied_bytes (from the page
/// cache), mapped_bytes (views of the files, `method="map"`) and populate
/// (how those were made resident)), buffers from `pool` when given. `iopath.load_safetensors`
/// turns it into numpy or torch views.
#[pyfunction]
#[pyo3(signature = (path, heap = "auto", method = "auto", buffer_size = 32 << 20, progress = false, shards_at_once = iopath_heap::DEFAULT_SHARDS_AT_ONCE, pool = None))]
#[allow(clippy::too_many_arguments)]
fn load_safetensors_raw<'py>(
    py: Python<'py>,
    path: PathBuf,
    heap: &str,
    method: &str,
    buffer_size: usize,
    progress: bool,
    shards_at_once: usize,
    pool: Option<PyRef<'_, PyPool>>,
) -> PyResult<(Vec<PyBuffer>, Bound<'py, PyDict>, Bound<'py, PyDict>)> {
    if shards_at_once == 0 {
        return Err(PyValueError::new_err("shards_at_once must be at least 1"));
    }
    let opts = options(method, buffer_size)?;
    let heap = LoadHeap::new(heap, pool.as_deref())?;
    let mut show = progress_printer(progress);
    let t = py
        .allow_threads(|| {
            iopath_heap::load_checkpoint(&path, heap.get(), &opts, shards_at_once, &mut show)
        })
        .map_err(to_py)?;
    let tensors = PyDict::new(py);
    for (name, x) in &t.tensors {
        tensors.set_item(
            name,
            (
                x.buffer_index,
                x.offset,
                x.len,
                x.dtype.to_string(),
                x.shape.clone(),
            ),
        )?;
    }
    let stats = PyDict::new(py);
    stats.set_item("bytes", t.stats.bytes)?;
    stats.set_item("seconds", t.stats.elapsed.as_secs_f64())?;
    stats.set_item("gib_per_s", t.stats.gib_per_s())?;
    stats.set_item("method", t.stats.method.name())?;
    stats.set_item("heap", heap.get().name())?;
    stats.set_item("alloc_seconds", t.stats.alloc_time.as_secs_f64())?;
    stats.set_item("read_seconds", t.stats.read_time.as_secs_f64())?;
    stats.set_item("shards", t.shards.len())?;
    stats.set_item("metadata", t.metadata.clone())?;
    stats.set_item("from_cache_bytes", t.stats.from_cache)?;
    stats.set_item("copied_bytes", t.stats.from_cache)?;
    stats.set_item("read_bytes", t.stats.bytes - t.stats.from_cache)?;
    stats.set_item("mapped_bytes", t.stats.mapped)?;
    stats.set_item("populate", t.stats.populate)?;
    let buffers = t
        .buffers
        .into_iter()
        .map(|buf| PyBuffer {
            filled: buf.len(),
            buf,
        })
        .collect();
    Ok((buffers, tensors, stats))
}

/// Tensors served to other processes: `handle` is the string they pass
/// to `attach_raw`; `close()` (or dropping the object) stops serving.
#[pyclass(module = "iopath", name = "Share", frozen)]
struct PyShare {
    share: Mutex<Option<iopath_heap::Share>>,
    handle: String,
}

#[pymethods]
impl PyShare {
    /// Serves `buffers` and `tensors`, a list of (name, buffer index,
    /// offset, length, dtype, shape), with `metadata`.
    #[new]
    #[pyo3(signature = (buffers, tensors, metadata = None))]
    #[allow(clippy::type_complexity)]
    fn new(
        buffers: Vec<PyRef<'_, PyBuffer>>,
        tensors: Vec<(String, usize, usize, usize, String, Vec<usize>)>,
        metadata: Option<std::collections::BTreeMap<String, String>>,
    ) -> PyResult<Self> {
        let buffers = buffers.iter().map(|b| b.buf.clone()).collect();
        let tensors = tensors
            .into_iter()
            .map(|(name, buffer, offset, len, dtype, shape)| SharedTensor {
                name,
                buffer,
                offset,
                len,
                dtype,
                shape,
            })
            .collect();
        let share = iopath_heap::Share::serve(buffers, tensors, metadata.unwrap_or_default())
            .map_err(to_py)?;
        Ok(PyShare {
            handle: share.handle(),
            share: Mutex::new(Some(share)),
        })
    }

    /// The string other processes pass to `iopath.attach`.
    #[getter]
    fn handle(&self) -> String {
        self.handle.clone()
    }

    /// Stops serving; processes already attached keep their views.
    fn close(&self, py: Python<'_>) {
        let taken = iopath_sys::lock(&self.share).take();
        py.allow_threads(move || drop(taken));
    }

    fn __repr__(&self) -> String {
        format!("<iopath.Share {}>", self.handle)
    }
}

/// Attaches to a share: (buffers, {name: (buffer index, offset, length,
/// dtype, shape)}, metadata), every tensor checked to lie in its buffer.
/// `timeout` (seconds, more than 0) bounds the whole exchange.
#[pyfunction]
#[pyo3(signature = (handle, timeout = iopath_heap::DEFAULT_ATTACH_TIMEOUT.as_secs_f64()))]
fn attach_raw<'py>(
    py: Python<'py>,
    handle: &str,
    timeout: f64,
) -> PyResult<(Vec<PyBuffer>, Bound<'py, PyDict>, Bound<'py, PyDict>)> {
    let timeout = std::time::Duration::try_from_secs_f64(timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "timeout={timeout}: give a number of seconds more than 0"
            ))
        })?;
    let a = py
        .allow_threads(|| iopath_heap::attach(handle, timeout))
        .map_err(to_py)?;
    let tensors = PyDict::new(py);
    for t in &a.tensors {
        tensors.set_item(
            &t.name,
            (t.buffer, t.offset, t.len, t.dtype.clone(), t.shape.clone()),
        )?;
    }
    let metadata = PyDict::new(py);
    for (k, v) in &a.metadata {
        metadata.set_item(k, v)?;
    }
    let buffers = a
        .buffers
        .into_iter()
        .map(|buf| PyBuffer {
            filled: buf.len(),
            buf,
        })
        .collect();
    Ok((buffers, tensors, metadata))
}

/// The native module.
#[pymodule]
fn _iopath(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBuffer>()?;
    m.add_class::<PyPool>()?;
    m.add_class::<PyShare>()?;
    m.add_function(wrap_pyfunction!(attach_raw, m)?)?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(load_safetensors_raw, m)?)?;
    Ok(())
}
