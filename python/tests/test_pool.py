"""iopath.Pool: buffers reused across loads, never under a live tensor or a peer."""

import gc
import hashlib
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import iopath
from test_models import torch_or_skip, write_safetensors

#: Small buffers, so one model makes several: the big tensor gets one of
#: its own, the small ones share the others.
BUF = 256 << 10


def model(path, seed):
    """A safetensors file whose layout depends on nothing but its names and
    shapes (the same for every seed) and whose bytes depend on `seed`:
    {name: bytes}."""
    rng = np.random.default_rng(seed)
    tensors = {
        "embed": ("F32", (1000, 3), rng.standard_normal(3000).astype("<f4").tobytes()),
        "big": ("F16", (512, 600), rng.standard_normal(512 * 600).astype("<f2").tobytes()),
        "norm": ("BF16", (4096,), rng.integers(0, 1 << 16, 4096, dtype="<u2").tobytes()),
        "bytes": ("I8", (300_000,), rng.integers(-128, 128, 300_000, dtype="i1").tobytes()),
        "head": ("F64", (20_000,), rng.standard_normal(20_000).astype("<f8").tobytes()),
    }
    write_safetensors(path, tensors)
    return {name: data for name, (_, _, data) in tensors.items()}


def as_bytes(t):
    return np.ascontiguousarray(t).reshape(-1).view("u1").tobytes()


def check(got, want):
    assert sorted(got) == sorted(want)
    for name, data in want.items():
        assert as_bytes(got[name]) == data, name


@pytest.fixture
def two(tmp_path):
    """Two models of one layout and different bytes: ((path, bytes), (path, bytes))."""
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    return (a, model(a, 1)), (b, model(b, 2))


def test_a_second_load_reuses_every_buffer_and_is_byte_exact(two):
    (a, want_a), (b, want_b) = two
    pool = iopath.Pool()
    first = iopath.load_safetensors(a, pool=pool, buffer_size=BUF)
    check(first, want_a)
    made = pool.made
    assert made >= 3 and pool.reused == 0
    assert pool.free_bytes == 0, "every buffer is in use"
    del first
    gc.collect()
    assert pool.free_bytes == pool.kept_bytes > 0
    second, stats = iopath.load_safetensors(b, pool=pool, buffer_size=BUF, with_stats=True)
    assert (pool.reused, pool.made) == (made, made), "no new buffer"
    check(second, want_b)
    assert stats["heap"] == "memfd"
    # A third load of the first model, over the second's buffers, torch-free.
    del second
    third = iopath.load_safetensors(a, pool=pool, buffer_size=BUF)
    check(third, want_a)
    assert (pool.reused, pool.made) == (2 * made, made)


def test_a_live_tensor_keeps_its_buffer_out_of_the_next_load(two):
    (a, want_a), (b, want_b) = two
    pool = iopath.Pool()
    first = iopath.load_safetensors(a, pool=pool, buffer_size=BUF)
    made = pool.made
    big, embed = first["big"], first["embed"][1:]  # a view of a view keeps it too
    del first
    gc.collect()
    second = iopath.load_safetensors(b, pool=pool, buffer_size=BUF)
    check(second, want_b)
    # The two buffers still referenced were made again, the others reused.
    assert pool.made - made == 2 and pool.reused == made - 2
    assert as_bytes(big) == want_a["big"], "the live tensor's buffer was not overwritten"
    assert as_bytes(embed) == want_a["embed"][12:]
    assert big.ctypes.data != second["big"].ctypes.data
    # Once released, they are free for the load after.
    del big, embed, second
    gc.collect()
    assert pool.free_bytes == pool.kept_bytes
    iopath.load_safetensors(a, pool=pool, buffer_size=BUF)
    assert pool.made - made == 2, "nothing made: every buffer was free"


def test_a_live_torch_tensor_keeps_its_buffer_out_of_the_next_load(two):
    torch = torch_or_skip()
    (a, want_a), (b, want_b) = two
    pool = iopath.Pool()
    first = iopath.load_safetensors(a, pool=pool, buffer_size=BUF, framework="pt")
    made = pool.made
    big = first["big"]
    del first
    gc.collect()
    second = iopath.load_safetensors(b, pool=pool, buffer_size=BUF, framework="pt")
    assert pool.made - made == 1 and pool.reused == made - 1
    assert big.view(torch.uint8).numpy().tobytes() == want_a["big"]
    assert second["big"].view(torch.uint8).numpy().tobytes() == want_b["big"]


def test_a_buffer_whose_fd_was_asked_for_is_never_reused(two):
    (a, want_a), _ = two
    pool = iopath.Pool()
    bufs = iopath.load(a, pool=pool, buffer_size=BUF)
    n = len(bufs)
    fd = bufs[0].fileno()
    assert fd >= 0
    del bufs
    gc.collect()
    assert pool.free_bytes == pool.kept_bytes  # the exported one is let go
    again = iopath.load(a, pool=pool, buffer_size=BUF)
    assert (pool.reused, pool.made) == (n - 1, n + 1)
    assert b"".join(bytes(memoryview(x)) for x in again) == a.read_bytes()


HOLD = textwrap.dedent(
    """
    import hashlib, json, sys
    import iopath
    got = iopath.attach(sys.argv[1])
    digest = lambda: {n: hashlib.sha256(t.tobytes()).hexdigest() for n, t in got.items()}
    print(json.dumps(digest()), flush=True)
    sys.stdin.readline()  # the sharer reloads meanwhile
    print(json.dumps(digest()), flush=True)
    """
)


def test_buffers_another_process_attached_to_are_never_reused(two):
    (a, want_a), (b, want_b) = two
    hashes = {n: hashlib.sha256(d).hexdigest() for n, d in want_a.items()}
    pool = iopath.Pool()
    first = iopath.load_safetensors(a, pool=pool, buffer_size=BUF)
    made = pool.made
    share = iopath.share(first)
    peer = subprocess.Popen(
        [sys.executable, "-c", HOLD, share.handle], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert json.loads(peer.stdout.readline()) == hashes
        share.close()
        del first
        gc.collect()
        # The peer still maps every buffer: none is free, none kept.
        assert (pool.free_bytes, pool.kept_bytes) == (0, 0)
        second = iopath.load_safetensors(b, pool=pool, buffer_size=BUF)
        check(second, want_b)
        assert (pool.reused, pool.made) == (0, 2 * made)
        out, _ = peer.communicate("go\n", timeout=120)
        assert json.loads(out) == hashes, "the peer's tensors were not overwritten"
        assert peer.returncode == 0
    finally:
        peer.kill()
    # A share nobody attached to exports nothing: its buffers come back.
    del second
    gc.collect()
    third = iopath.load_safetensors(a, pool=pool, buffer_size=BUF)
    iopath.share(third).close()
    del third
    gc.collect()
    iopath.load_safetensors(b, pool=pool, buffer_size=BUF)
    assert pool.reused == 2 * made


def test_pool_arguments(two):
    (a, want_a), _ = two
    pool = iopath.Pool(heap="memfd", capacity=0)
    assert pool.capacity == 0
    t = iopath.load_safetensors(a, pool=pool, buffer_size=BUF)
    check(t, want_a)
    del t
    gc.collect()
    assert pool.kept_bytes == 0, "over capacity: nothing kept"
    with pytest.raises(ValueError, match='heap="memfd" with pool'):
        iopath.load_safetensors(a, heap="memfd", pool=pool)
    with pytest.raises(ValueError, match="bigheap"):
        iopath.Pool(heap="bigheap")
    with pytest.raises(ValueError, match="loading needs"):
        iopath.Pool(capacity=1 << 60)
    unbounded = iopath.Pool()
    assert unbounded.capacity is None
    assert "iopath.Pool memfd, 0 bytes kept" in repr(unbounded)
