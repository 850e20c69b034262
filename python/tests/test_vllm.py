"""vLLM's load format iopath (iopath.vllm), where vLLM is installed: its
CPU build is a 6 GB virtualenv of its own (docs/python.md says how), so
these tests skip elsewhere, CI included."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (docs/python.md: vLLM)")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import iopath  # noqa: E402
import iopath.vllm  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A small Llama-style model written by transformers: bf16, tied
    embeddings, six shards and their index."""
    path = tmp_path_factory.mktemp("vllm") / "llama"
    cfg = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path, max_shard_size="600KB")
    assert (path / "model.safetensors.index.json").exists()
    return path


def test_the_entry_point_names_register():
    from importlib.metadata import entry_points

    eps = [e for e in entry_points(group="vllm.general_plugins") if e.name == "iopath"]
    assert [e.value for e in eps] == ["iopath.vllm:register"]


def test_the_loader_yields_every_tensor_as_safetensors_reads_it(checkpoint):
    from safetensors.torch import load_file
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    cls = iopath.vllm.register()
    for extra in ({}, {"method": "auto"}):
        loader = get_model_loader(LoadConfig(load_format="iopath", model_loader_extra_config=extra))
        assert type(loader) is cls
        assert loader.options["method"] == extra.get("method", "map")
        source = cls.Source(str(checkpoint), None, prefix="p.")
        got = dict(loader._get_weights_iterator(source))
        want = {}
        for f in sorted(checkpoint.glob("*.safetensors")):
            want.update(load_file(str(f)))
        assert sorted(got) == sorted("p." + k for k in want)
        for k, v in want.items():
            assert got["p." + k].dtype == v.dtype and torch.equal(got["p." + k], v), k
    with pytest.raises(ValueError, match="Unexpected extra config keys"):
        get_model_loader(LoadConfig(load_format="iopath", model_loader_extra_config={"nonsense": 1}))


GENERATE = textwrap.dedent(
    """
    import json, sys
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if __name__ == "__main__":
        llm = LLM(model=sys.argv[1], load_format=sys.argv[2], skip_tokenizer_init=True, dtype="bfloat16",
                  max_model_len=128, enforce_eager=True)
        prompts = [TokensPrompt(prompt_token_ids=[1, 17, 33, 300, 5]), TokensPrompt(prompt_token_ids=[9, 8, 7])]
        params = SamplingParams(max_tokens=12, temperature=0.0, detokenize=False, logprobs=3)
        outs = llm.generate(prompts, params)
        # The tokens, and each step's three likeliest with their log
        # probabilities: equal only if every weight is.
        print("TOKENS " + json.dumps([
            [list(o.outputs[0].token_ids),
             [sorted((t, lp.logprob) for t, lp in step.items()) for step in o.outputs[0].logprobs]]
            for o in outs
        ]))
    """
)


def generate(checkpoint, load_format, tmp_path):
    script = tmp_path / "generate.py"
    script.write_text(GENERATE)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, str(script), str(checkpoint), load_format], capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("TOKENS ")]
    return json.loads(line[len("TOKENS "):]), out.stdout + out.stderr


def test_vllm_generates_the_default_loaders_tokens(checkpoint, tmp_path):
    want, _ = generate(checkpoint, "auto", tmp_path)
    got, log = generate(checkpoint, "iopath", tmp_path)
    shards = len(list(checkpoint.glob("*.safetensors")))
    assert f"iopath loads {shards} safetensors file(s) from {checkpoint}" in log  # in vLLM's worker
    assert got == want
    assert len(got) == 2 and all(len(tokens) == len(steps) == 12 for tokens, steps in got)
