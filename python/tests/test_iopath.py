"""iopath's Python bindings against the reference loader, safetensors.numpy."""

import mmap
import os
import socket
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import iopath


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A safetensors file of mixed dtypes and sizes, one larger than 1 MiB."""
    rng = np.random.default_rng(7)
    tensors = {}
    dtypes = [np.float32, np.float16, np.int64, np.uint8, np.int8, np.float64, np.int32, np.bool_]
    for i in range(60):
        dt = dtypes[i % len(dtypes)]
        shape = (1 + i % 7, 3 + (i * 13) % 101)
        if dt is np.bool_:
            a = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(dt, np.integer):
            a = rng.integers(0, 100, size=shape).astype(dt)
        else:
            a = rng.standard_normal(size=shape).astype(dt)
        tensors[f"layer{i}.w"] = a
    tensors["big"] = rng.standard_normal(size=(600, 700)).astype(np.float32)
    tensors["empty"] = np.zeros((0, 5), dtype=np.float32)
    # pytest's temporary directory: /tmp, a disk file system (ext4) here.
    path = str(tmp_path_factory.mktemp("model") / "model.safetensors")
    save_file(tensors, path, metadata={"format": "np"})
    return path


@pytest.mark.parametrize("method", ["auto", "direct", "uring", "buffered"])
def test_every_tensor_matches_safetensors_numpy(model, method):
    want = load_file(model)
    got, stats = iopath.load_safetensors(model, method=method, buffer_size=256 << 10, with_stats=True)
    assert sorted(got) == sorted(want)
    for name, ref in want.items():
        a = got[name]
        assert a.dtype == ref.dtype, name
        assert a.shape == ref.shape, name
        assert a.tobytes() == ref.tobytes(), name
        assert a.ctypes.data % a.dtype.itemsize == 0, f"{name} misaligned"
    assert stats["bytes"] == sum(r.nbytes for r in want.values())
    assert stats["method"] in ("uring", "direct", "buffered")
    assert stats["alloc_seconds"] > 0 and stats["read_seconds"] > 0
    assert stats["seconds"] >= stats["read_seconds"]


def test_arrays_are_views_that_keep_their_buffers_alive(model):
    got = iopath.load_safetensors(model)
    a = got.pop("big")
    del got
    import gc

    gc.collect()
    ref = load_file(model)["big"]
    assert not a.flags.owndata
    assert a.tobytes() == ref.tobytes()


def test_load_gives_buffers_with_the_buffer_protocol_and_fds(tmp_path):
    data = os.urandom(3 * (1 << 20) + 123)
    path = str(tmp_path / "blob.bin")
    with open(path, "wb") as f:
        f.write(data)
    bufs = iopath.load(path, buffer_size=1 << 20)
    assert [b.filled for b in bufs] == [1 << 20] * 3 + [123]
    joined = b"".join(bytes(memoryview(b)[: b.filled]) for b in bufs)
    assert joined == data
    assert np.frombuffer(bufs[0], dtype=np.uint8)[:16].tobytes() == data[:16]
    # Writable and zero-copy: a write through one view shows in another.
    m = memoryview(bufs[1])
    m[0] = (m[0] + 1) % 256
    assert memoryview(bufs[1])[0] == m[0]
    # heap="auto" (the default) takes the best heap this kernel has.
    assert bufs[0].fileno() >= 0 and bufs[0].kind in ("memfd", "udmabuf", "dma-heap")
    mine = iopath.load(path, heap="memfd", buffer_size=1 << 20)
    assert mine[0].kind == "memfd"
    assert b"".join(bytes(memoryview(b)[: b.filled]) for b in mine) == data
    with pytest.raises(ValueError, match="unknown heap `nosuch`"):
        iopath.load(path, heap="nosuch")


def test_fd_hand_off_to_a_second_process(model):
    got = iopath.load_safetensors(model)
    bufs, table, _ = iopath.load_safetensors_raw(model)
    index, offset, length, dtype, shape = table["big"]
    buf = bufs[index]
    want = load_file(model)["big"].tobytes()
    child = textwrap.dedent(
        """
        import mmap, socket, sys
        s = socket.socket(fileno=int(sys.argv[1]))
        msg, fds, _, _ = socket.recv_fds(s, 64, 1)
        off, length, size = map(int, msg.decode().split())
        m = mmap.mmap(fds[0], size, mmap.MAP_SHARED, mmap.PROT_READ)
        sys.stdout.buffer.write(m[off:off + length])
        """
    )
    parent, kid = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    p = subprocess.Popen(
        [sys.executable, "-c", child, str(kid.fileno())],
        pass_fds=[kid.fileno()],
        stdout=subprocess.PIPE,
    )
    kid.close()
    socket.send_fds(parent, [f"{offset} {length} {len(buf)}".encode()], [buf.fileno()])
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0
    assert out == want
    assert got["big"].tobytes() == want


def test_truncated_file_and_hostile_header_raise(model, tmp_path):
    d = str(tmp_path)
    with open(model, "rb") as f:
        whole = f.read()
    cut = os.path.join(d, "cut.safetensors")
    with open(cut, "wb") as f:
        f.write(whole[: len(whole) - 1000])
    with pytest.raises(ValueError, match="the tensors' data ends at byte"):
        iopath.load_safetensors(cut)
    hostile = os.path.join(d, "hostile.safetensors")
    with open(hostile, "wb") as f:
        f.write(struct.pack("<Q", 1 << 62) + b"{}")
    with pytest.raises(ValueError, match="header length 4611686018427387904 is over the limit"):
        iopath.load_safetensors(hostile)
    with pytest.raises(ValueError, match="unknown transfer method"):
        iopath.load_safetensors(model, method="teleport")
    with pytest.raises(OSError, match="No such file"):
        iopath.load(os.path.join(d, "missing.bin"))


def test_progress_only_when_asked(model, capfd):
    got = iopath.load_safetensors(model, buffer_size=256 << 10)
    assert capfd.readouterr().err == ""
    iopath.load_safetensors(model, buffer_size=256 << 10, progress=True)
    err = capfd.readouterr().err
    total = sum(a.nbytes for a in got.values()) >> 20
    lines = err.split("\n")
    assert len(lines) == 2 and lines[1] == "", repr(err)
    steps = lines[0].split("\r")
    assert steps[0] == "" and len(steps) > 2, repr(err)
    assert steps[-1] == f"iopath: {total} / {total} MiB (100%)", repr(err)


def test_memoryview_holds_only_the_filled_bytes(tmp_path):
    one = tmp_path / "one.bin"
    one.write_bytes(b"\x5a")
    (b,) = iopath.load(str(one))
    assert b.filled == 1 and len(b) >= 4096
    assert bytes(memoryview(b)) == b"\x5a"
    assert np.frombuffer(b, dtype=np.uint8).tobytes() == b"\x5a"
    data = os.urandom(10 << 20)
    ten = tmp_path / "ten.bin"
    ten.write_bytes(data)
    bufs = iopath.load(str(ten), buffer_size=4 << 20)
    assert [len(memoryview(x)) for x in bufs] == [4 << 20, 4 << 20, 2 << 20]
    assert b"".join(bytes(memoryview(x)) for x in bufs) == data
