"""Checkpoints into models: ``load_into`` fills a ``torch.nn.Module``,
``from_pretrained`` builds a transformers model around it.

    files --load_safetensors(framework="pt")--> {name: tensor over a heap buffer}
          --load_into--> module's parameters and buffers (assigned, not copied)
    config.json --transformers, on the meta device--> model --load_into--> tied,
          non-persistent buffers rebuilt, eval(): what from_pretrained returns

torch and transformers are imported inside the functions, never when
iopath is imported.
"""

import copy
import json
import os
import threading

#: load_safetensors' options, which from_pretrained takes beside
#: transformers' own keyword arguments.
LOAD_OPTIONS = ("heap", "method", "buffer_size", "progress", "shards_at_once", "pool")


def checkpoint_directory(path):
    """The directory holding the checkpoint ``path`` names: ``path`` itself
    for a directory, else the directory of the file (a ``.safetensors``
    file or an index). Raises ``FileNotFoundError`` for a path that is none
    of those."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return path
    if os.path.isfile(path):
        return os.path.dirname(os.path.abspath(path))
    raise FileNotFoundError(
        f"{path}: no such checkpoint: looked for a safetensors file, a directory "
        "or an index (*.safetensors.index.json)"
    )


def _fit(torch, tensor, ref):
    """``tensor`` as ``ref`` holds its values: itself (no copy) where the
    dtype, device and layout already match, else one copy that converts
    (as ``load_state_dict``'s ``copy_`` would). A ``ref`` on the meta
    device takes the tensor's device."""
    device = tensor.device if ref.is_meta else ref.device
    same_layout = ref.is_meta or ref.numel() <= 1 or ref.stride() == tensor.stride()
    if tensor.dtype == ref.dtype and tensor.device == device and same_layout:
        return tensor
    if same_layout:
        return tensor.to(device=device, dtype=ref.dtype)
    out = torch.empty_strided(ref.size(), ref.stride(), dtype=ref.dtype, device=device)
    out.copy_(tensor)
    return out


def _slots(module, name):
    """(the dict holding parameter or buffer ``name``, its key there)."""
    owner, _, attr = name.rpartition(".")
    sub = module.get_submodule(owner) if owner else module
    if attr in sub._parameters:
        return sub._parameters, attr
    return sub._buffers, attr


def assign(module, tensors, strict=True):
    """Makes ``tensors`` ({name: tensor}) ``module``'s parameters and
    buffers, as ``module.load_state_dict(tensors, strict, assign=True)``
    does, with three differences: each tensor is first converted to the
    dtype, device and layout of what it replaces (one copy, only where they
    differ; a meta parameter takes the tensor's device); parameters the
    module shares under several names stay shared (given the last of those
    names the checkpoint holds, as copies into a shared tensor would leave
    it); and on any error the module is left as it was. Returns
    ``load_state_dict``'s result (``missing_keys``, ``unexpected_keys``)."""
    import torch

    own = module.state_dict(keep_vars=True)
    prepared = {}
    failed = []
    for name, t in tensors.items():
        ref = own.get(name)
        if ref is None or ref.shape != t.shape:
            prepared[name] = t  # load_state_dict reports it
            continue
        try:
            prepared[name] = _fit(torch, t, ref)
        except Exception as ex:
            # The message load_state_dict gives when its copy_ fails.
            failed.append(
                f'While copying the parameter named "{name}", whose dimensions in the model are '
                f"{ref.size()} and whose dimensions in the checkpoint are {t.size()}, "
                f"an exception occurred : {ex.args}."
            )
            prepared[name] = ref
    # Names under which one tensor is shared: a tie to keep.
    shared = {}
    for name, ref in own.items():
        shared.setdefault(id(ref), []).append(name)
    ties = [names for names in shared.values() if len(names) > 1]

    saved = [(m, dict(m._parameters), dict(m._buffers)) for m in module.modules()]
    try:
        result = module.load_state_dict(prepared, strict=strict, assign=True)
        if failed:
            raise RuntimeError(
                "Error(s) in loading state_dict for {}:\n\t{}".format(type(module).__name__, "\n\t".join(failed))
            )
    except BaseException:
        for m, params, buffers in saved:
            m._parameters.update(params)
            m._buffers.update(buffers)
        raise
    for names in ties:
        loaded = [n for n in names if n in prepared]
        if loaded:
            slots, key = _slots(module, loaded[-1])
            value = slots[key]
            for n in names:
                slots, key = _slots(module, n)
                slots[key] = value
    return result


def load_into(module, path, strict=True, **load_kwargs):
    """Fills ``module``'s (any ``torch.nn.Module``'s) parameters and
    buffers from the checkpoint at ``path``: a ``.safetensors`` file, a
    directory, or a ``*.safetensors.index.json``, loaded by
    ``load_safetensors(path, framework="pt", **load_kwargs)``.

    Names are ``load_state_dict``'s (``module.state_dict()``'s keys). Each
    tensor is assigned, not copied: the parameter becomes a view of the
    heap buffer (or, with ``method="map"``, of the file) where its dtype,
    device and layout match the one it replaces, and one converted copy
    where they differ (a bf16 checkpoint into a float32 module); a module
    built on the meta device takes the checkpoint's tensors as they are.
    Parameters shared under several names (tied weights) stay shared.

    Returns ``load_state_dict``'s result: a named tuple of
    ``missing_keys`` and ``unexpected_keys``. A shape that does not fit,
    or with ``strict=True`` a missing or unexpected name, raises the
    ``RuntimeError`` that ``load_state_dict`` raises (naming the tensor),
    and leaves the module as it was.
    """
    from . import load_safetensors

    checkpoint_directory(path)
    tensors = load_safetensors(path, framework="pt", **load_kwargs)
    return assign(module, tensors, strict)


def _model_class(cls, directory, kwargs):
    """(model class, config, the model's own kwargs) for ``cls``, an Auto
    class or a model class, from the directory's config.json, as
    ``cls.from_pretrained`` finds them."""
    if hasattr(cls, "_model_mapping"):  # AutoModel, AutoModelForCausalLM, ...
        from transformers import AutoConfig
        from transformers.models.auto.auto_factory import _get_model_class

        config, model_kwargs = AutoConfig.from_pretrained(directory, return_unused_kwargs=True, **kwargs)
        return _get_model_class(config, cls._model_mapping), config, model_kwargs
    config, model_kwargs = cls.config_class.from_pretrained(directory, return_unused_kwargs=True, **kwargs)
    return cls, config, model_kwargs


def _shards(path, directory):
    """(shard files, the index's sharded metadata or None), as transformers
    reads them to find a checkpoint's dtype."""
    index = path if str(path).endswith(".json") else None
    if os.path.isdir(path):
        found = [f for f in sorted(os.listdir(directory)) if f.endswith(".safetensors.index.json")]
        index = os.path.join(directory, found[0]) if found else None
    if index is None:
        if os.path.isfile(path):
            return [os.fspath(path)], None
        files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
        return [os.path.join(directory, f) for f in files], None
    with open(index) as f:
        body = json.load(f)
    weight_map = body.get("weight_map", {})
    meta = dict(body.get("metadata") or {})
    meta.update(all_checkpoint_keys=list(weight_map), weight_map=weight_map)
    files = sorted(set(weight_map.values()))
    return [os.path.join(directory, f) for f in files], meta


def from_pretrained(cls, path, dtype=None, **kwargs):
    """The transformers model ``cls.from_pretrained(path, dtype=dtype,
    **kwargs)`` returns, its weights loaded by iopath: ``cls`` is an Auto
    class (``AutoModelForCausalLM``, ...) or a model class, ``path`` a
    checkpoint directory (its ``config.json`` beside the weights), a
    ``.safetensors`` file or an index in it.

    As transformers does: the config is read (``kwargs`` override it, and
    ``dtype=None`` is ``"auto"``: the config's dtype), the model is built
    on the meta device (while iopath loads the checkpoint, on a thread of
    its own), its weights are the checkpoint's tensors
    (``load_into``: views of iopath's buffers where their dtype is the
    model's), weights the model ties are tied, non-persistent buffers
    (rotary ``inv_freq``, ...) and weights missing from the checkpoint are
    initialised by transformers' own code, the generation config is read,
    and the model is put in eval mode. ``load_safetensors``' options
    (``method``, ``heap``, ``pool``, ``buffer_size``, ``shards_at_once``,
    ``progress``) may be given among ``kwargs``. ``method`` is ``"map"``
    unless given: tensors the page cache holds are views of their files,
    as transformers' own loader maps them (and, as there, a later write
    to a file shows through), and the rest are read into heap buffers.

    A checkpoint whose names need transformers' renaming (another model's
    prefix, legacy names, fused experts) or whose model keeps some weights
    in float32 is loaded through transformers' own conversion, from the
    same iopath tensors. A config transformers cannot build raises
    transformers' error.
    """
    import transformers
    from transformers import modeling_utils as mu
    from transformers.utils.generic import ContextManagers

    from . import load_safetensors

    if not hasattr(mu, "LoadStateDictInfo"):
        raise ImportError(
            f"iopath.from_pretrained follows transformers 5's loading steps; "
            f"transformers {transformers.__version__} is installed"
        )
    directory = checkpoint_directory(path)
    load_kwargs = {k: kwargs.pop(k) for k in LOAD_OPTIONS if k in kwargs}
    load_kwargs.setdefault("method", "map")
    use_kernels = kwargs.pop("use_kernels", None)
    from_auto = hasattr(cls, "_model_mapping")
    model_class, config, model_kwargs = _model_class(cls, directory, kwargs)
    if "attn_implementation" in kwargs:
        config._attn_implementation = kwargs["attn_implementation"]
        model_kwargs.pop("attn_implementation", None)
    files, sharded = _shards(path, directory)
    config, dtype = mu._get_dtype("auto" if dtype is None else dtype, files, config, sharded, None, True, None)
    config.name_or_path = directory

    # The load runs while the model is built: the loader releases the GIL
    # for its reads and copies, and the build is Python.
    loaded = {}

    def load():
        try:
            loaded["tensors"] = load_safetensors(path, framework="pt", **load_kwargs)
        except BaseException as e:
            loaded["error"] = e

    loader = threading.Thread(target=load, name="iopath-load")
    loader.start()
    try:
        config = copy.deepcopy(config)
        with ContextManagers(model_class.get_init_context(dtype, False, False, False, config)):
            model = model_class(config, **model_kwargs)
            mu.patch_output_recorders(model)
    finally:
        loader.join()
    if "error" in loaded:
        raise loaded["error"]
    tensors = loaded["tensors"]
    dtype_plan = model._get_dtype_plan(dtype)
    expected = model.state_dict()
    if dtype_plan or any(name not in expected for name in tensors):
        # Names or dtypes only transformers' conversion knows: its own load
        # of the same tensors.
        del model
        model = model_class.from_pretrained(
            None, config=config, state_dict=tensors, dtype=dtype, use_kernels=use_kernels, **model_kwargs
        )
        model.config.name_or_path = directory
    else:
        result = assign(model, tensors, strict=False)
        missing = set(result.missing_keys)
        for name in expected:
            if name not in missing:
                # What transformers marks on a weight it loaded, so that its
                # initialisation leaves it alone.
                model.get_parameter_or_buffer(name)._is_hf_initialized = True
        info = mu.LoadStateDictInfo(
            missing_keys=missing,
            unexpected_keys=set(result.unexpected_keys),
            mismatched_keys=set(),
            error_msgs=[],
            conversion_errors={},
            skipped_pp_keys=set(),
        )
        load_config = mu.LoadStateDictConfig(
            pretrained_model_name_or_path=directory, sharded_metadata=sharded, dtype=dtype, dtype_plan=dtype_plan
        )
        model._finalize_model_loading(model, load_config, info)
        model.eval()
        if not mu._kernels_enabled():
            use_kernels = False
        elif use_kernels is None:
            use_kernels = True
        model.set_use_kernels(use_kernels, None, None, None)
    if model.can_generate() and hasattr(model, "adjust_generation_fn"):
        model.adjust_generation_fn(
            None, from_auto, None, directory, None, False, None, True, None, "main", "", None
        )
    return model
