"""Sharded checkpoints, bf16, torch tensors and shares between processes."""

import hashlib
import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import iopath

try:
    import ml_dtypes
except ImportError:  # the tests install it; the library does without
    ml_dtypes = None


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, shape, bytes)}, written in this order."""
    header, off = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, data in tensors.values():
            f.write(data)


def bf16_bytes(a):
    """float32 values -> their bfloat16 bytes (truncated)."""
    return (np.asarray(a, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


@pytest.fixture
def sharded(tmp_path):
    """A 3-shard checkpoint with its index: (directory, {name: (dtype, shape, bytes)})."""
    rng = np.random.default_rng(3)
    want, weight_map = {}, {}
    for s in range(3):
        file = f"model-{s + 1:05d}-of-00003.safetensors"
        shard = {}
        for t in range(4):
            n = 50 + 97 * t + s
            name = f"layers.{s}.w{t}"
            if t % 2 == 0:
                vals = rng.standard_normal(n).astype(np.float32)
                shard[name] = ("BF16", (n,), bf16_bytes(vals))
            else:
                shard[name] = ("F32", (n // 2, 2), rng.standard_normal(n // 2 * 2).astype("<f4").tobytes())
        shard[f"layers.{s}.big"] = ("F16", (512, 600), rng.standard_normal(512 * 600).astype("<f2").tobytes())
        write_safetensors(tmp_path / file, shard)
        for name in shard:
            weight_map[name] = file
        want.update(shard)
    with open(tmp_path / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": 1}, "weight_map": weight_map}, f)
    return tmp_path, want


def test_a_directory_or_its_index_loads_every_shard_into_one_dict(sharded):
    d, want = sharded
    for path in (d, d / "model.safetensors.index.json", str(d)):
        got, stats = iopath.load_safetensors(path, buffer_size=256 << 10, with_stats=True)
        assert sorted(got) == sorted(want)
        for name, (dtype, shape, data) in want.items():
            assert got[name].tobytes() == data, name
            assert got[name].shape == shape, name
        assert stats["shards"] == 3
        assert stats["bytes"] == sum(len(v[2]) for v in want.values())
        assert stats["metadata"]["total_size"] == "1"
    one = iopath.load_safetensors(d / "model-00002-of-00003.safetensors")
    assert sorted(one) == sorted(n for n in want if n.startswith("layers.1."))


@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed")
def test_bf16_comes_as_ml_dtypes_bfloat16(sharded):
    d, want = sharded
    got = iopath.load_safetensors(d)
    a = got["layers.0.w0"]
    assert a.dtype == np.dtype(ml_dtypes.bfloat16)
    raw = np.frombuffer(want["layers.0.w0"][2], dtype="<u2")
    expect = (raw.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(a.astype(np.float32), expect)


def test_no_ml_dtypes_import_without_a_tensor_that_needs_it(tmp_path):
    # Importing ml_dtypes takes most of a second: a checkpoint of F32 and
    # I64 tensors loads without it (BF16 brings it: the test above).
    from safetensors.numpy import save_file

    plain = tmp_path / "plain.safetensors"
    save_file({"w": np.arange(1024, dtype=np.float32), "n": np.arange(8, dtype=np.int64)}, str(plain))
    code = textwrap.dedent(
        """
        import sys, iopath
        t = iopath.load_safetensors(sys.argv[1])
        print(sorted(str(a.dtype) for a in t.values()), "ml_dtypes" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code, str(plain)], capture_output=True, check=True, text=True)
    assert out.stdout.split("]")[1].strip() == "False", out.stdout
    assert out.stdout.startswith("['float32', 'int64']"), out.stdout


def test_bf16_without_ml_dtypes_is_raw_uint16(sharded):
    d, want = sharded
    code = textwrap.dedent(
        """
        import sys
        sys.modules["ml_dtypes"] = None   # as if it were not installed
        import iopath
        a = iopath.load_safetensors(sys.argv[1])["layers.2.w2"]
        sys.stdout.write(f"{a.dtype} {a.shape} ")
        sys.stdout.flush()
        sys.stdout.buffer.write(a.tobytes())
        """
    )
    out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, check=True).stdout
    dtype, shape, data = want["layers.2.w2"]
    head = f"uint16 {shape} ".encode()
    assert out.startswith(head), out[:40]
    assert out[len(head):] == data


def test_numpy_never_imports_torch(sharded):
    d, _ = sharded
    code = "import sys, iopath; iopath.load_safetensors(sys.argv[1]); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, check=True, text=True)
    assert out.stdout.strip() == "False"


def torch_or_skip():
    try:
        import torch

        return torch
    except ImportError:
        if os.environ.get("IOPATH_REQUIRE_TORCH") == "1":
            pytest.fail("IOPATH_REQUIRE_TORCH=1 but torch is not installed")
        pytest.skip("torch is not installed (scripts/python-env leaves it out: see README)")


def test_framework_pt_gives_zero_copy_torch_tensors(sharded):
    torch = torch_or_skip()
    d, want = sharded
    got = iopath.load_safetensors(d, framework="pt")
    names = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}
    for name, (dtype, shape, data) in want.items():
        t = got[name]
        assert isinstance(t, torch.Tensor)
        assert t.dtype == names[dtype], name
        assert tuple(t.shape) == shape, name
        assert t.view(torch.uint8).numpy().tobytes() == data, name
        assert t.data_ptr() % t.element_size() == 0
    # A view of an iopath buffer: a write through the tensor shows in it.
    t = got["layers.0.w1"]
    (buf,) = [b for b in iopath._buffers.values() if b.address <= t.data_ptr() < b.address + len(b)]
    off = t.data_ptr() - buf.address
    byte = (memoryview(buf)[off] + 1) % 256
    t.view(torch.uint8)[0, 0] = byte
    assert memoryview(buf)[off] == byte


def test_float8_in_torch_and_numpy(tmp_path):
    vals = bytes(range(0, 256, 3))
    path = tmp_path / "f8.safetensors"
    write_safetensors(path, {"e4m3": ("F8_E4M3", (len(vals),), vals), "e5m2": ("F8_E5M2", (len(vals),), vals)})
    got = iopath.load_safetensors(path)
    assert got["e4m3"].tobytes() == vals
    if ml_dtypes is not None:
        assert got["e4m3"].dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    torch = torch_or_skip()
    got = iopath.load_safetensors(path, framework="pt")
    assert got["e4m3"].dtype == torch.float8_e4m3fn
    assert got["e5m2"].dtype == torch.float8_e5m2
    assert got["e5m2"].view(torch.uint8).numpy().tobytes() == vals


def test_bad_shards_fail_the_whole_load_naming_the_shard(sharded):
    d, _ = sharded
    second = d / "model-00002-of-00003.safetensors"
    whole = second.read_bytes()
    second.write_bytes(whole[:-10])
    with pytest.raises(ValueError, match=r"shard 2 of 3 \(.*model-00002-of-00003.safetensors\): .*the tensors' data ends"):
        iopath.load_safetensors(d)
    second.write_bytes(struct.pack("<Q", 1 << 62) + b"{}")
    with pytest.raises(ValueError, match=r"shard 2 of 3 .*header length 4611686018427387904 is over the limit"):
        iopath.load_safetensors(d)
    second.unlink()
    with pytest.raises(ValueError, match=r"the index names shard model-00002-of-00003.safetensors \(5 tensors\), which does not exist"):
        iopath.load_safetensors(d)
    second.write_bytes(whole)
    (d / "model.safetensors.index.json").unlink()
    (d / "extra.safetensors").write_bytes((d / "model-00003-of-00003.safetensors").read_bytes())
    with pytest.raises(ValueError, match=r'tensor "layers.2.w0" is in two shards: extra.safetensors and model-00003'):
        iopath.load_safetensors(d)
    with pytest.raises(ValueError, match="framework='tf'"):
        iopath.load_safetensors(d, framework="tf")


ATTACH = textwrap.dedent(
    """
    import hashlib, json, sys
    import iopath
    handle, framework = sys.argv[1], sys.argv[2]
    try:
        got = iopath.attach(handle, framework=framework)
    except ValueError as e:
        print(json.dumps({"error": str(e)}))
        sys.exit(0)
    out = {}
    for name, t in got.items():
        if framework == "pt":
            import torch
            b = t.view(torch.uint8).numpy().tobytes()
        else:
            b = t.tobytes()
        out[name] = [str(t.dtype), list(t.shape), hashlib.sha256(b).hexdigest()]
    # Zero copy: a byte written here shows in the sharer.
    if framework == "numpy":
        got["layers.1.big"].reshape(-1).view("u1")[0] = 0x5A
    print(json.dumps(out))
    """
)


def run_attach(handle, framework="numpy"):
    out = subprocess.run(
        [sys.executable, "-c", ATTACH, handle, framework], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_second_process_attaches_to_the_same_memory(sharded):
    d, want = sharded
    got = iopath.load_safetensors(d)
    share = iopath.share(got)
    assert share.handle.startswith("iopath-share:v1:")
    seen = run_attach(share.handle)
    assert sorted(seen) == sorted(want)
    for name, (dtype, shape, data) in want.items():
        assert seen[name][1] == list(shape), name
        assert seen[name][2] == hashlib.sha256(data).hexdigest(), name
    assert seen["layers.0.w0"][0] == str(got["layers.0.w0"].dtype)
    assert got["layers.1.big"].reshape(-1).view("u1")[0] == 0x5A
    share.close()
    stale = run_attach(share.handle)
    assert "it was closed, or the process that shared it exited" in stale["error"]


def test_wrong_handles_and_foreign_arrays_are_refused(sharded):
    d, _ = sharded
    got = iopath.load_safetensors(d)
    share = iopath.share(got)
    other = share.handle[:16] + "0" * 32 + share.handle[48:]
    assert "the handle is stale" in run_attach(other)["error"]
    assert "not an iopath share handle" in run_attach("model.safetensors")["error"]
    share.close()
    with pytest.raises(ValueError, match="not in a buffer iopath loaded"):
        iopath.share({"copy": got["layers.0.w1"].copy()})
    with pytest.raises(ValueError, match="cannot be shared: not contiguous"):
        iopath.share({"t": got["layers.0.w1"].T})


def test_attach_as_torch(sharded):
    torch_or_skip()
    d, want = sharded
    share = iopath.share(iopath.load_safetensors(d, framework="pt"))
    seen = run_attach(share.handle, "pt")
    assert seen["layers.0.w0"][0] == "torch.bfloat16"
    for name, (_, _, data) in want.items():
        assert seen[name][2] == hashlib.sha256(data).hexdigest(), name
    share.close()


def file_buffers():
    """The live buffers that are views of a file (method="map")."""
    return [b for b in iopath._buffers.values() if b.kind == "file"]


def test_map_views_cached_tensors_and_matches_safetensors_numpy(sharded):
    from safetensors.numpy import load_file

    d, want = sharded
    got, stats = iopath.load_safetensors(d, method="map", buffer_size=256 << 10, with_stats=True)
    total = sum(len(v[2]) for v in want.values())
    # Just written: every page cached, so every aligned tensor is a view.
    assert stats["mapped_bytes"] > total // 2
    assert stats["mapped_bytes"] + stats["read_bytes"] + stats["copied_bytes"] == total
    assert stats["bytes"] == stats["read_bytes"] + stats["copied_bytes"]
    assert stats["populate"] == "read faults"
    files = file_buffers()
    assert len(files) == 3
    for s in range(3):
        shard = d / f"model-{s + 1:05d}-of-00003.safetensors"
        peer = load_file(str(shard))
        for name, a in peer.items():
            assert got[name].tobytes() == a.tobytes(), name
            assert got[name].shape == a.shape, name
    # The big F16 tensor is a view of its file: in a file buffer, at its
    # offset in the file.
    big = got["layers.0.big"]
    (buf,) = [b for b in files if b.address <= big.ctypes.data < b.address + len(b)]
    assert len(buf) == os.path.getsize(d / "model-00001-of-00003.safetensors")
    # Copy-on-write: a write through the view never reaches the file.
    before = (d / "model-00001-of-00003.safetensors").read_bytes()
    big.reshape(-1).view("u1")[:4] = 0x77
    assert (d / "model-00001-of-00003.safetensors").read_bytes() == before
    with pytest.raises(ValueError, match='method="map" is for load_safetensors'):
        iopath.load(d / "model-00001-of-00003.safetensors", method="map")
    # Without "map", no tensor is a view of a file.
    del got, big, buf, files
    plain = iopath.load_safetensors(d)
    assert not file_buffers()
    assert plain["layers.0.big"].tobytes() == want["layers.0.big"][2]


def test_map_a_second_process_attaches_to_the_file_views(sharded):
    d, want = sharded
    got = iopath.load_safetensors(d, method="map")
    assert file_buffers()
    share = iopath.share(got)
    seen = run_attach(share.handle)
    assert sorted(seen) == sorted(want)
    for name, (dtype, shape, data) in want.items():
        assert seen[name][1] == list(shape), name
        assert seen[name][2] == hashlib.sha256(data).hexdigest(), name
    # The attacher's write (to layers.1.big, a view) stayed in its process.
    assert got["layers.1.big"].tobytes() == want["layers.1.big"][2]
    share.close()


def test_map_truncated_shards(sharded):
    d, want = sharded
    second = d / "model-00002-of-00003.safetensors"
    whole = second.read_bytes()
    second.write_bytes(whole[:-10])
    with pytest.raises(ValueError, match=r"shard 2 of 3 \(.*model-00002-of-00003.safetensors\): .*the tensors' data ends"):
        iopath.load_safetensors(d, method="map")
    second.write_bytes(whole)
    got = iopath.load_safetensors(d, method="map")
    assert got["layers.1.big"].tobytes() == want["layers.1.big"][2]
    # Cut under its views: the lost pages read as zeros, no SIGBUS.
    os.truncate(second, 0)
    assert not got["layers.1.big"].any()
    assert got["layers.0.big"].tobytes() == want["layers.0.big"][2]


def test_map_as_torch(sharded):
    torch = torch_or_skip()
    d, want = sharded
    got = iopath.load_safetensors(d, method="map", framework="pt")
    assert file_buffers()
    for name, (_, shape, data) in want.items():
        assert tuple(got[name].shape) == shape, name
        assert got[name].view(torch.uint8).numpy().tobytes() == data, name
