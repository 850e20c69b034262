"""iopath: load files and safetensors models into fd-backed shareable buffers.

    import iopath
    bufs = iopath.load("disk.img")                 # [iopath.Buffer], memoryview-able
    tensors = iopath.load_safetensors("model.safetensors")   # {name: numpy.ndarray}
    tensors = iopath.load_safetensors("llama/", framework="pt")  # sharded, torch
    share = iopath.share(tensors)                  # other processes:
    same = iopath.attach(share.handle)             # the same memory, no copy
    pool = iopath.Pool()                           # a server's reload:
    tensors = iopath.load_safetensors(path, pool=pool)  # buffers reused
    tensors = iopath.load_safetensors(path, method="map")  # cached: file views
    iopath.load_into(module, "llama/")             # any torch.nn.Module, assigned
    model = iopath.from_pretrained(AutoModelForCausalLM, "llama/")  # transformers

Arrays are zero-copy views over the heap buffers and keep them alive; a
buffer's ``fileno()`` can be sent to another process with
``socket.send_fds`` and mapped there, and ``share``/``attach`` do that for a
whole model.
"""

import bisect
import weakref

import numpy as np

from ._iopath import Buffer, Pool, Share, attach_raw, load, load_safetensors_raw

__all__ = [
    "Buffer",
    "Pool",
    "Share",
    "load",
    "load_safetensors",
    "share",
    "attach",
    "load_into",
    "from_pretrained",
    "DTYPES",
]

#: safetensors dtype -> numpy dtype (little-endian, as the format is).
#: With ``ml_dtypes`` installed, also BF16 and the F8 types, from the first
#: load into numpy arrays on (ml_dtypes is imported then, not before).
DTYPES = {
    "BOOL": np.dtype("bool"),
    "U8": np.dtype("<u1"),
    "I8": np.dtype("<i1"),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
}

#: Without ml_dtypes: what numpy lacks, as raw integers of the same width.
_RAW = {
    "BF16": np.dtype("<u2"),
    "F8_E4M3": np.dtype("u1"),
    "F8_E5M2": np.dtype("u1"),
    "F8_E8M0": np.dtype("u1"),
}

_ml_dtypes_added = False


def _numpy_dtypes(needed=True):
    """DTYPES, with ml_dtypes' types added the first time numpy arrays of
    them are made or named (`needed`): importing ml_dtypes takes about a
    second, which a load into torch, a load with no BF16 or F8 tensor, or a
    process that never makes an array, does not pay."""
    global _ml_dtypes_added
    if needed and not _ml_dtypes_added:
        _ml_dtypes_added = True
        try:
            import ml_dtypes
        except ImportError:
            return DTYPES
        for name, attr in [
            ("BF16", "bfloat16"),
            ("F8_E4M3", "float8_e4m3fn"),
            ("F8_E5M2", "float8_e5m2"),
            ("F8_E8M0", "float8_e8m0fnu"),
        ]:
            if hasattr(ml_dtypes, attr):
                DTYPES[name] = np.dtype(getattr(ml_dtypes, attr))
    return DTYPES


#: Every buffer handed out by a load or an attach, by id, while alive: what
#: ``share`` looks tensors up in.
_buffers = weakref.WeakValueDictionary()


def _torch_dtypes(torch):
    names = {
        "BOOL": "bool",
        "U8": "uint8",
        "I8": "int8",
        "I16": "int16",
        "U16": "uint16",
        "F16": "float16",
        "BF16": "bfloat16",
        "I32": "int32",
        "U32": "uint32",
        "F32": "float32",
        "F64": "float64",
        "I64": "int64",
        "U64": "uint64",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E5M2": "float8_e5m2",
        "F8_E8M0": "float8_e8m0fnu",
    }
    return {k: getattr(torch, v) for k, v in names.items() if hasattr(torch, v)}


def _views(buffers, table, framework):
    """{name: array or tensor}, each a view of its bytes in its buffer."""
    for b in buffers:
        _buffers[id(b)] = b
    views = [memoryview(b) for b in buffers]
    out = {}
    if framework == "numpy":
        dtypes = _numpy_dtypes(any(t[3] in _RAW for t in table.values()))
        for name, (index, offset, length, dtype, shape) in table.items():
            dt = dtypes.get(dtype) or _RAW.get(dtype)
            if dt is None:
                # Sub-byte types (F4, F6_*): their bytes.
                out[name] = np.frombuffer(views[index], dtype=np.uint8, count=length, offset=offset)
            else:
                a = np.frombuffer(views[index], dtype=dt, count=length // dt.itemsize, offset=offset)
                out[name] = a.reshape(shape)
    elif framework == "pt":
        import torch

        dtypes = _torch_dtypes(torch)
        for name, (index, offset, length, dtype, shape) in table.items():
            dt = dtypes.get(dtype)
            if dt is None:
                dt, shape = torch.uint8, [length]
            size = dt.itemsize
            if length == 0:
                out[name] = torch.empty(shape, dtype=dt)
            else:
                t = torch.frombuffer(views[index], dtype=dt, count=length // size, offset=offset)
                out[name] = t.view(shape)
    else:
        raise ValueError(f'framework={framework!r}: use "numpy" or "pt"')
    return out


def load_safetensors(
    path,
    framework="numpy",
    heap="auto",
    method="auto",
    buffer_size=32 << 20,
    with_stats=False,
    progress=False,
    shards_at_once=2,
    pool=None,
):
    """Loads a safetensors checkpoint into heap buffers: {name: tensor}.

    ``path`` is a ``.safetensors`` file, a directory (its
    ``*.safetensors.index.json``, else every ``*.safetensors`` file in it)
    or a ``model.safetensors.index.json``. Every shard is loaded, up to
    ``shards_at_once`` at a time, into one dict; a missing shard, a tensor
    in two shards, a truncated, hostile or changed shard fails the whole
    load with the shard's name, and nothing is kept.

    ``framework="numpy"`` (the default) gives ``numpy.ndarray``s: BF16 and
    the F8 types as ``ml_dtypes`` types (``bfloat16``, ``float8_e4m3fn``,
    ...) where ``ml_dtypes`` is installed, else as raw ``uint16`` (BF16) or
    ``uint8`` (F8) arrays of the same shape; F4 and F6 as their raw bytes.
    ``framework="pt"`` gives ``torch.Tensor``s with torch's own dtypes
    (``torch.bfloat16``, ``torch.float8_e4m3fn``, ...); torch is imported
    only then. Either way every tensor is a view (no copy) over the
    buffer that holds it, aligned for its dtype, keeping the buffer alive.

    With ``pool`` (an ``iopath.Pool``) the buffers come from the pool:
    those a previous load left free (every tensor over them released) are
    filled again as they are, pages in place, instead of allocated and
    faulted anew, which is what makes a second load of a model (a server's
    reload) fast. A buffer still referenced by a live tensor, array,
    memoryview or ``Buffer`` is never reused under it; one whose fd left
    the process (another process attached to a ``share`` of it, or
    ``Buffer.fileno()`` was called) is never reused at all. ``heap`` is
    then the pool's.

    ``method`` is how the bytes move: ``"auto"`` (the default: cached
    ranges copied out of the page cache while cold ones are read with
    direct I/O, which leaves them out of it), ``"buffered"``, ``"direct"``,
    ``"uring"``, ``"sendfile"``, ``"bounce"``, or ``"map"``: every tensor
    the page cache holds whole when the load starts becomes a view of its
    file instead of a copy (the file mapped private, copy-on-write; its
    pages made resident inside the load, so nothing is left to fault in),
    and the rest are read as ``"auto"`` reads them. ``"map"`` is what
    ``safetensors.torch.load_file`` does for a warm file, without its
    readahead for a cold one, and its views cost what that loader's do:
    they are the page cache's pages, so a later write to the file shows
    through them (a write through a view stays private), and a file
    truncated under them reads as zeros from there on. Mapped tensors can
    be shared like the others: an ``attach`` maps the same file, private
    too, so the page cache's pages are counted once however many processes
    map them, and writes are not seen across processes. The stats say
    ``mapped_bytes``, ``read_bytes`` (from the device) and
    ``copied_bytes`` (from the page cache), and ``populate``, how the
    mapped bytes were made resident (``"read faults"``: a read of every
    page; ``"MADV_POPULATE_READ"`` where the mapping could not be guarded
    against SIGBUS).

    With ``with_stats`` the result is ``(tensors, stats)``. The GIL is
    released while loading; ``progress=True`` shows progress on stderr.
    ``heap`` is ``"auto"`` (a dma-heap that direct I/O can fill, else
    udmabuf, else memfd; the stats say which), ``"memfd"``, ``"udmabuf"``
    or ``"dma-heap[:NAME]"``. Errors are raised as ``ValueError`` (bad
    input, a refused header or index) or ``OSError``, with the Rust
    message.
    """
    if framework not in ("numpy", "pt"):
        raise ValueError(f'framework={framework!r}: use "numpy" or "pt"')
    buffers, table, stats = load_safetensors_raw(
        str(path), heap, method, buffer_size, progress, shards_at_once, pool
    )
    out = _views(buffers, table, framework)
    return (out, stats) if with_stats else out


def _dtype_name(t):
    """The safetensors name of an array's or a tensor's element type."""
    if isinstance(t, np.ndarray):
        for name, dt in _numpy_dtypes().items():
            if dt == t.dtype:
                return name
        raise ValueError(f"dtype {t.dtype} has no safetensors name")
    import torch

    for name, dt in _torch_dtypes(torch).items():
        if dt == t.dtype:
            return name
    raise ValueError(f"dtype {t.dtype} has no safetensors name")


def _place(t):
    """(address, byte length) of a contiguous numpy array or torch tensor."""
    if isinstance(t, np.ndarray):
        if not t.flags.c_contiguous:
            raise ValueError("not contiguous")
        return t.ctypes.data, t.nbytes
    if type(t).__module__.startswith("torch"):
        if not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError("not a contiguous CPU tensor")
        return t.data_ptr(), t.numel() * t.element_size()
    raise ValueError(f"a {type(t).__name__}, not a numpy array or torch tensor")


def share(tensors, metadata=None):
    """Serves ``tensors`` (a dict from ``load_safetensors`` or ``attach``,
    numpy or torch) to other processes of this user: returns a ``Share``
    whose ``handle`` (a string) they pass to ``attach``. They map the same
    buffers (no read, no copy) until ``close()``; those attached keep their
    views after it. Every tensor must lie in a buffer iopath loaded.
    """
    live = sorted(_buffers.values(), key=lambda b: b.address)
    starts = [b.address for b in live]
    used = {}
    entries = []
    for name, t in tensors.items():
        try:
            addr, nbytes = _place(t)
        except ValueError as e:
            raise ValueError(f"tensor {name!r} cannot be shared: {e}") from None
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0 or addr + nbytes > live[i].address + len(live[i]):
            raise ValueError(
                f"tensor {name!r} is not in a buffer iopath loaded (a copy?): only "
                "tensors from load_safetensors or attach can be shared"
            )
        b = live[i]
        index = used.setdefault(id(b), (len(used), b))[0]
        shape = list(t.shape)
        entries.append((name, index, addr - b.address, nbytes, _dtype_name(t), shape))
    buffers = [b for _, b in sorted(used.values(), key=lambda x: x[0])]
    return Share(buffers, entries, {str(k): str(v) for k, v in (metadata or {}).items()})


def attach(handle, framework="numpy", timeout=30.0):
    """The tensors a ``share`` in another process serves, as views of the
    very same memory (mapped from its buffers' fds; nothing is read or
    copied), in ``framework`` as ``load_safetensors`` gives them. A wrong
    or stale handle raises ``ValueError``; so does anything received that
    does not check out (a tensor outside its buffer, an fd that is not the
    buffer named). Writes through the views are seen by every process,
    but for tensors loaded with ``method="map"``, views of a file mapped
    private in each process: their writes stay in the process.
    """
    buffers, table, _metadata = attach_raw(str(handle), timeout)
    return _views(buffers, table, framework)


# torch and transformers are imported only when these are called.
from .models import from_pretrained, load_into  # noqa: E402
