"""iopath: load files and safetensors models into fd-backed shareable buffers.

    import iopath
    bufs = iopath.load("disk.img")                 # [iopath.Buffer], memoryview-able
    tensors = iopath.load_safetensors("model.safetensors")   # {name: numpy.ndarray}

Arrays are zero-copy views over the heap buffers and keep them alive; a
buffer's ``fileno()`` can be sent to another process with
``socket.send_fds`` and mapped there.
"""

import numpy as np

from ._iopath import Buffer, load, load_safetensors_raw

__all__ = ["Buffer", "load", "load_safetensors", "DTYPES"]

#: safetensors dtype -> numpy dtype (little-endian, as the format is).
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


def load_safetensors(
    path, heap="auto", method="auto", buffer_size=32 << 20, with_stats=False, progress=False
):
    """Loads a safetensors file into heap buffers and returns {name: ndarray}.

    Every array is a view (no copy) over the buffer that holds its tensor,
    aligned for its dtype. Dtypes numpy lacks (BF16, F8_*, F4, F6_*) come
    back as raw ``uint8`` arrays of their bytes. With ``with_stats`` the
    result is ``(tensors, stats)``. The GIL is released while loading;
    ``progress=True`` shows progress on stderr. ``heap`` is ``"auto"`` (a
    dma-heap that direct I/O can fill, else udmabuf, else memfd; the stats
    say which), ``"memfd"``, ``"udmabuf"`` or ``"dma-heap[:NAME]"``. Errors are raised as ``ValueError``
    (bad input, a refused header) or ``OSError`` with the Rust message.
    """
    buffers, table, stats = load_safetensors_raw(str(path), heap, method, buffer_size, progress)
    views = [memoryview(b) for b in buffers]
    out = {}
    for name, (index, offset, length, dtype, shape) in table.items():
        dt = DTYPES.get(dtype)
        if dt is None:
            out[name] = np.frombuffer(views[index], dtype=np.uint8, count=length, offset=offset)
        else:
            count = length // dt.itemsize
            out[name] = np.frombuffer(views[index], dtype=dt, count=count, offset=offset).reshape(shape)
    return (out, stats) if with_stats else out
