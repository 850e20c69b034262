"""vLLM's load format ``iopath``: a model's safetensors weights loaded by
iopath, then handed to the model's own ``load_weights`` as vLLM's default
loader hands them.

    vllm serve DIR --load-format iopath
    LLM(model=DIR, load_format="iopath")
    LLM(..., load_format="iopath", model_loader_extra_config={"method": "auto"})

iopath's wheel names ``register`` as a ``vllm.general_plugins`` entry
point, so every vLLM process registers the format before it loads a
model. vLLM is imported only by ``register``.
"""

import dataclasses
import os
import time

#: model_loader_extra_config keys this loader takes: load_safetensors'
#: options. vLLM's default loader's own keys are refused with them.
OPTIONS = ("method", "heap", "buffer_size", "shards_at_once")


def weights(folder, files, options):
    """(name, tensor) for every tensor of ``files`` (safetensors files in
    ``folder``), loaded by iopath: the whole directory in one load when
    ``files`` are all its checkpoint's shards, else file by file. Each
    tensor is given up once yielded, so a buffer is freed as soon as the
    model has copied everything out of it."""
    from . import load_safetensors

    names = {os.path.basename(f) for f in files}
    everything = {f for f in os.listdir(folder) if f.endswith(".safetensors")}
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        import json

        with open(index) as f:
            everything = set(json.load(f).get("weight_map", {}).values())
    paths = [folder] if names == everything else sorted(files)
    for path in paths:
        tensors = load_safetensors(path, framework="pt", **options)
        for name in list(tensors):
            yield name, tensors.pop(name)


def register():
    """Registers the load format ``iopath`` with vLLM (its
    ``vllm.general_plugins`` entry point); returns the loader class."""
    from vllm.logger import init_logger
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.weight_utils import filter_safetensors_files_by_weight_name

    # Under vLLM's logger, so the line shows with its own.
    logger = init_logger("vllm.iopath")

    class IopathModelLoader(DefaultModelLoader):
        """vLLM's default loader, safetensors only, its weights read by
        iopath (``method="map"`` unless ``model_loader_extra_config`` says
        otherwise: cached shards are views of their files, as the default
        loader maps them, and the rest is read with direct I/O)."""

        def __init__(self, load_config):
            extra = dict(load_config.model_loader_extra_config or {})
            self.options = {k: extra.pop(k) for k in OPTIONS if k in extra}
            self.options.setdefault("method", "map")
            # The default loader, told "safetensors", finds the files.
            super().__init__(dataclasses.replace(load_config, load_format="safetensors", model_loader_extra_config=extra))

        def _get_weights_iterator(self, source):
            folder, files, use_safetensors, _ = self._prepare_weights(
                source.model_or_path,
                source.subfolder,
                source.revision,
                source.fall_back_to_pt,
                source.allow_patterns_overrides,
            )
            if not use_safetensors:
                raise RuntimeError(f"load format iopath: no *.safetensors weights in {folder}")
            if getattr(source, "is_unused_weight", None) is not None:
                # Shards holding only weights the model does not use, left out
                # as the default loader leaves them.
                files = filter_safetensors_files_by_weight_name(files, source.is_unused_weight)
            if self.counter_before_loading_weights == 0.0:
                self.counter_before_loading_weights = time.perf_counter()
            logger.info("iopath loads %d safetensors file(s) from %s (%s)", len(files), folder, self.options)
            return ((source.prefix + name, t) for name, t in weights(folder, files, self.options))

    return register_model_loader("iopath")(IopathModelLoader)
