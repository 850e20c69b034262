"""load_into (any torch module) and from_pretrained (transformers), against
torch's load_state_dict and transformers' own from_pretrained."""

import json
import os
import subprocess
import sys

import pytest

import iopath


def need(name):
    """The module `name` (torch or transformers), or a skip; a failure
    under IOPATH_REQUIRE_TORCH=1, where both must be installed."""
    try:
        return __import__(name)
    except ImportError:
        if os.environ.get("IOPATH_REQUIRE_TORCH") == "1":
            pytest.fail(f"IOPATH_REQUIRE_TORCH=1 but {name} is not installed")
        pytest.skip(f"{name} is not installed (scripts/test-python installs it under CI)")


@pytest.fixture
def torch():
    return need("torch")


@pytest.fixture
def transformers():
    need("torch")
    return need("transformers")


def in_iopath_buffer(t):
    """Whether tensor `t`'s bytes lie in a buffer iopath loaded (no copy)."""
    start = t.data_ptr()
    return any(b.address <= start < b.address + len(b) for b in iopath._buffers.values())


def small_net(torch, seed):
    """A module with parameters, persistent buffers (BatchNorm's), a
    non-persistent buffer and two Linear layers sharing one weight."""
    torch.manual_seed(seed)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(16, 16)
            self.norm = torch.nn.BatchNorm1d(16)
            self.b = torch.nn.Linear(16, 16, bias=False)
            self.b.weight = self.a.weight
            self.register_buffer("scale", torch.full((16,), 2.0), persistent=False)

        def forward(self, x):
            return self.b(self.norm(self.a(x))) * self.scale

    net = Net()
    with torch.no_grad():
        net.norm.running_mean.uniform_()
        net.norm.running_var.uniform_(0.5, 1.5)
        net.norm.num_batches_tracked.fill_(7)
    return net.eval()


def save(torch, state, path):
    """A state dict into a safetensors file, ties kept once (as transformers
    writes them)."""
    from safetensors.torch import save_file

    seen, out = set(), {}
    for k, v in state.items():
        if v.data_ptr() not in seen:
            seen.add(v.data_ptr())
            out[k] = v.detach().contiguous()
    save_file(out, str(path))
    return out


def snapshot(module):
    """(every parameter and buffer by name, their bytes): what 'left as it
    was' compares."""
    tensors = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(dict(module.named_buffers(remove_duplicate=False)))
    return {k: (v, v.detach().clone()) for k, v in tensors.items()}


def assert_unchanged(torch, module, before):
    after = snapshot(module)
    assert sorted(after) == sorted(before)
    for k, (obj, value) in before.items():
        assert after[k][0] is obj, k
        assert torch.equal(after[k][1], value), k


def test_load_into_assigns_views_of_the_buffers(torch, tmp_path):
    src = small_net(torch, 1)
    written = save(torch, src.state_dict(), tmp_path / "net.safetensors")
    assert "b.weight" not in written  # the tie is saved once
    net = small_net(torch, 2)
    result = iopath.load_into(net, tmp_path / "net.safetensors", strict=False)
    assert result.missing_keys == ["b.weight"] and result.unexpected_keys == []
    assert result == small_net(torch, 3).load_state_dict(written, strict=False)
    for k, v in src.state_dict().items():
        got = net.get_parameter(k) if k in dict(net.named_parameters(remove_duplicate=False)) else net.get_buffer(k)
        assert torch.equal(got, v), k
        assert in_iopath_buffer(got), k  # assigned, not copied
    assert isinstance(net.a.weight, torch.nn.Parameter) and net.a.weight.requires_grad
    assert net.b.weight is net.a.weight  # still tied
    assert torch.equal(net.scale, torch.full((16,), 2.0))  # not persistent: untouched
    x = torch.randn(4, 16)
    assert torch.equal(net(x), src(x))


def test_load_into_converts_dtype_with_one_copy_and_fills_a_meta_module(torch, tmp_path):
    src = small_net(torch, 1)
    save(torch, {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in src.state_dict().items()},
         tmp_path / "bf16.safetensors")
    net = small_net(torch, 2)
    iopath.load_into(net, tmp_path / "bf16.safetensors", strict=False)
    assert net.a.weight.dtype == torch.float32
    assert torch.equal(net.a.weight, src.a.weight.to(torch.bfloat16).float())
    assert not in_iopath_buffer(net.a.weight)  # converted: a copy
    assert net.norm.num_batches_tracked.dtype == torch.int64 and in_iopath_buffer(net.norm.num_batches_tracked)
    with torch.device("meta"):
        meta = small_net(torch, 3)
    meta.to(torch.bfloat16)
    iopath.load_into(meta, tmp_path / "bf16.safetensors", strict=False)
    assert meta.a.weight.device.type == "cpu" and meta.a.weight.dtype == torch.bfloat16
    assert in_iopath_buffer(meta.a.weight) and meta.b.weight is meta.a.weight
    assert torch.equal(meta.norm.running_var, src.norm.running_var.to(torch.bfloat16))


def load_state_dict_error(module, state, strict=True):
    with pytest.raises(RuntimeError) as e:
        module.load_state_dict(state, strict=strict)
    return str(e.value)


def test_load_into_errors_are_load_state_dicts_and_leave_the_module(torch, tmp_path):
    src = small_net(torch, 1)
    state = dict(src.state_dict())
    # A shape that does not fit: an error even with strict=False.
    bad = save(torch, dict(state, **{"norm.running_mean": torch.zeros(17)}), tmp_path / "shape.safetensors")
    net = small_net(torch, 2)
    before = snapshot(net)
    for strict in (True, False):
        want = load_state_dict_error(small_net(torch, 2), bad, strict)
        assert "size mismatch for norm.running_mean" in want
        with pytest.raises(RuntimeError) as e:
            iopath.load_into(net, tmp_path / "shape.safetensors", strict=strict)
        assert str(e.value) == want
        assert_unchanged(torch, net, before)
    # A missing name and an extra one.
    odd = {k: v for k, v in state.items() if k != "a.bias"}
    odd["c.weight"] = torch.ones(3)
    odd = save(torch, odd, tmp_path / "names.safetensors")
    want = load_state_dict_error(small_net(torch, 2), odd)
    assert 'Missing key(s) in state_dict: "a.bias"' in want and 'Unexpected key(s) in state_dict: "c.weight"' in want
    with pytest.raises(RuntimeError) as e:
        iopath.load_into(net, tmp_path / "names.safetensors")
    assert str(e.value) == want
    assert_unchanged(torch, net, before)
    got = iopath.load_into(net, tmp_path / "names.safetensors", strict=False)
    assert got == small_net(torch, 2).load_state_dict(odd, strict=False)
    assert got.missing_keys == ["a.bias", "b.weight"] and got.unexpected_keys == ["c.weight"]


def test_load_into_paths(torch, tmp_path):
    src = small_net(torch, 1)
    state = save(torch, src.state_dict(), tmp_path / "x.bin")  # not a checkpoint's name
    (tmp_path / "x.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"no such checkpoint: looked for a safetensors file, a directory or an index"):
        iopath.load_into(small_net(torch, 2), tmp_path / "x.safetensors")
    # Two shards and their index: the directory or the index.
    from safetensors.torch import save_file

    names = sorted(state)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: state[k] for k in part}, str(tmp_path / file))
        weight_map.update(dict.fromkeys(part, file))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for path in (tmp_path, tmp_path / "model.safetensors.index.json"):
        net = small_net(torch, 2)
        iopath.load_into(net, path, strict=False, method="map")
        assert torch.equal(net.a.weight, src.a.weight) and torch.equal(net.norm.running_var, src.norm.running_var)


def tiny_llama(transformers, torch, path, seed=0, base=False, **save):
    """A small Llama-style model written by transformers' save_pretrained:
    bf16, tied embeddings, sharded with an index (unless one shard)."""
    cfg = transformers.LlamaConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    cls = transformers.LlamaModel if base else transformers.LlamaForCausalLM
    model = cls(cfg).to(torch.bfloat16)
    model.save_pretrained(path, **save)
    return path


def same_model(torch, got, want):
    """Every parameter and buffer (persistent or not) equal, same dtype,
    same training flag and ties; the logits of a batch equal."""
    assert type(got) is type(want)
    assert got.training is want.training is False
    assert got.dtype == want.dtype
    assert got.config.to_dict() == want.config.to_dict()
    assert got.generation_config.to_dict() == want.generation_config.to_dict()
    for named in ("named_parameters", "named_buffers"):
        g = dict(getattr(got, named)(remove_duplicate=False))
        w = dict(getattr(want, named)(remove_duplicate=False))
        assert sorted(g) == sorted(w), named
        for k in w:
            assert g[k].dtype == w[k].dtype and g[k].device == w[k].device, k
            assert torch.equal(g[k], w[k]), k
    tied_g = got.get_output_embeddings().weight is got.get_input_embeddings().weight
    tied_w = want.get_output_embeddings().weight is want.get_input_embeddings().weight
    assert tied_g == tied_w
    ids = torch.randint(0, got.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        a, b = got(ids).logits, want(ids).logits
    assert a.dtype == b.dtype and torch.equal(a, b)
    return tied_g


def test_from_pretrained_equals_transformers(transformers, torch, tmp_path):
    d = tiny_llama(transformers, torch, tmp_path / "llama", max_shard_size="100KB")
    files = sorted(os.listdir(d))
    assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) >= 3
    auto = transformers.AutoModelForCausalLM
    want = auto.from_pretrained(d, dtype=torch.bfloat16)
    got = iopath.from_pretrained(auto, d, dtype=torch.bfloat16)
    assert same_model(torch, got, want)  # tied, as transformers ties
    assert got.config.name_or_path == want.config.name_or_path == str(d)
    # The weights are iopath's buffers, not copies.
    assert in_iopath_buffer(got.model.layers[1].mlp.down_proj.weight)
    assert in_iopath_buffer(got.lm_head.weight)
    # The rotary inv_freq, a non-persistent buffer, rebuilt as transformers does.
    assert torch.equal(got.model.rotary_emb.inv_freq, want.model.rotary_emb.inv_freq)
    # A model class, the config's dtype, the index, method="auto" (copies).
    cls = transformers.LlamaForCausalLM
    same_model(torch, iopath.from_pretrained(cls, d), cls.from_pretrained(d))
    got = iopath.from_pretrained(cls, d / "model.safetensors.index.json", method="auto")
    same_model(torch, got, want)
    # float32 asked of a bf16 checkpoint: one converted copy per weight.
    got32 = iopath.from_pretrained(auto, d, dtype=torch.float32)
    same_model(torch, got32, auto.from_pretrained(d, dtype=torch.float32))
    assert not in_iopath_buffer(got32.lm_head.weight)


def test_from_pretrained_one_file_and_renamed_keys(transformers, torch, tmp_path):
    auto = transformers.AutoModelForCausalLM
    one = tiny_llama(transformers, torch, tmp_path / "one", seed=1)
    assert (one / "model.safetensors").exists()
    same_model(torch, iopath.from_pretrained(auto, one / "model.safetensors"), auto.from_pretrained(one))
    # A base model's checkpoint (no "model." prefix) into a causal LM: the
    # names transformers renames, loaded through its conversion.
    base = tiny_llama(transformers, torch, tmp_path / "base", seed=2, base=True, max_shard_size="100KB")
    with open(base / "config.json") as f:
        assert json.load(f)["architectures"] == ["LlamaModel"]
    same_model(torch, iopath.from_pretrained(auto, base, dtype=torch.bfloat16), auto.from_pretrained(base, dtype=torch.bfloat16))


def test_from_pretrained_bad_input(transformers, torch, tmp_path):
    auto = transformers.AutoModelForCausalLM
    with pytest.raises(FileNotFoundError, match="looked for a safetensors file, a directory or an index"):
        iopath.from_pretrained(auto, tmp_path / "nothing")
    d = tiny_llama(transformers, torch, tmp_path / "llama")
    # A config transformers cannot read, or cannot build a model of: its own error.
    config = json.loads((d / "config.json").read_text())

    def error(load):
        with pytest.raises(Exception) as e:
            load()
        return type(e.value), str(e.value)

    for bad in ({"model_type": "no-such-model"}, {"hidden_act": "no-such-activation"}):
        (d / "config.json").write_text(json.dumps(dict(config, **bad)))
        want = error(lambda: auto.from_pretrained(d))
        assert error(lambda: iopath.from_pretrained(auto, d)) == want
        assert "no-such" in want[1]
    # Weights that do not fit the config: load_state_dict's error, naming the tensor.
    (d / "config.json").write_text(json.dumps(dict(config, intermediate_size=96)))
    with pytest.raises(RuntimeError, match=r"size mismatch for model\.layers\.0\.mlp\.\w+_proj\.weight"):
        iopath.from_pretrained(auto, d)


def test_import_brings_neither_torch_nor_transformers():
    # Nor ml_dtypes (a second to import), until numpy arrays are made.
    code = "import sys, iopath; print(*(m in sys.modules for m in ('torch', 'transformers', 'ml_dtypes')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, text=True)
    assert out.stdout.split() == ["False", "False", "False"]
