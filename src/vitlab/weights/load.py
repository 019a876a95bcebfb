"""`vitlab.load`: any supported file or folder -> a ready model, the architecture read from the file.

Format detection is one decision on what the path is (folder with config.json, zip of .npy arrays, safetensors,
torch pickle), not a chain of sniffers. A vitlab run directory (or one checkpoint directory of it) means the
weights it holds (`weights_path`): every reader (`vitlab.load`, `info`, `convert`, `eval`, hubconf) goes through
here. Resolution change and head replacement follow the official fine-tuning
rules (paper Section 3.2): the position embedding is resized bilinearly with corners aligned, class token kept; a
different class count drops `pre_logits` and attaches a zero-initialised head.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import torch
from torch import nn

from vitlab.errors import WeightsError, by_surface
from vitlab.files.reading import open_regular
from vitlab.files.rundir import is_sharded_checkpoint
from vitlab.hub import imagenet_classes, published_info
from vitlab.hub.cache import read_meta
from vitlab.models.config import BiTConfig, ModelConfig, ViTConfig
from vitlab.models.posembed import resample_1d, resample_pos_embed, resample_relative_table
from vitlab.models.registry import architecture_differences, build_model, describe_architecture, model_config
from vitlab.models.timm_compat import eval_resize_of
from vitlab.weights.arguments import check_load_sizes, check_source
from vitlab.weights.locate import locate_published, weights_path
from vitlab.weights.record import WeightsRecord
from vitlab.weights.tensors import PICKLE_SUFFIXES, check_weights_file, is_onnx_path, read_json
from vitlab.weights.validate import check_state_dict, check_values
from vitlab.weights.vitlab_format import is_vitlab_file, read_vitlab

FORMATS = ("vitlab", "jax-npz", "bit-npz", "timm", "hf")


def detect_format(path: str | Path) -> str:
    """One of FORMATS, from what the path is; WeightsError naming the fix otherwise."""
    path = weights_path(path)
    if not path.exists():
        raise WeightsError(path, "no such file or folder", "check the path")
    if path.is_dir():
        return "vitlab" if is_sharded_checkpoint(path) else _folder_format(path)
    check_weights_file(path)
    with open_regular(path) as f:
        magic = f.read(8)
    if magic[:2] == b"PK":
        return _zip_format(path)
    if path.suffix in PICKLE_SUFFIXES:
        return "timm"
    if is_onnx_path(path):
        raise WeightsError(path, "an ONNX file holds a graph to run, not weights to build a model from",
                           by_surface("serve it with `vitlab predict --weights FILE` or `vitlab eval --weights FILE`",
                                      "serve it with onnxruntime.InferenceSession (docs/deployment.md)")
                           + "; load the .safetensors it was exported from")
    if _is_image(magic):
        raise WeightsError(path, "an image, not weights", by_surface(
            "pass it to `vitlab predict --weights WEIGHTS`", "load weights, then vitlab.transforms(model)(path)"))
    return "vitlab" if is_vitlab_file(path) else "timm"  # a bare safetensors state dict


# The first bytes of the image files a user may pass by mistake (JPEG, PNG, GIF, WebP's RIFF): none can begin a
# safetensors file, whose first 8 bytes are its header's length (these would claim a header of 16 MB or more).
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"RIFF")


def _is_image(magic: bytes) -> bool:
    return magic.startswith(_IMAGE_MAGIC)


def _folder_format(path: Path) -> str:
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise WeightsError(path, "folder has no config.json",
                           "pass a file, a timm or HF folder, or a vitlab run directory")  # fmt: skip
    cfg = read_json(cfg_path)  # an object, or one line saying what it is instead
    if cfg.get("model_type") in ("vit", "bit"):
        return "hf"
    if "architecture" in cfg:
        return "timm"
    kind = cfg.get("model_type") or "unknown"
    raise WeightsError(cfg_path, f"unsupported model_type {kind!r}", "vitlab reads timm and HF 'vit' / 'bit' folders")


def _zip_format(path: Path) -> str:
    try:
        names = zipfile.ZipFile(path).namelist()
    except (zipfile.BadZipFile, OSError):
        raise WeightsError(path, "corrupt or truncated zip archive", "re-download or re-export the file") from None
    if any(n.endswith(".npy") for n in names):
        from vitlab.weights.bit_npz import is_bit_npz

        return "bit-npz" if is_bit_npz(names) else "jax-npz"  # big_transfer names everything resnet/…
    if any(n.endswith("data.pkl") for n in names):
        return "timm"  # torch.save's zip format: a state dict, read with weights_only=True
    raise WeightsError(path, "zip archive holds neither .npy arrays nor a torch state dict", "pass an official .npz")


def read_weights(path: str | Path, arch: str | None = None, use_ema: bool = False) -> WeightsRecord:
    """The file's config and tensors in vitlab's names (`use_ema`: a training checkpoint's EMA weights). A file the
    download cache recorded as a published checkpoint must hold the architecture its catalogue name promises."""
    path = weights_path(path)
    ck = _read_format(path, arch, use_ema)
    record = read_meta(path) if path.is_file() else None
    if record and isinstance(record.get("model"), str) and record["model"]:
        check_published(ck, path, record["model"], str(record.get("name") or record["model"]))
    return ck


def is_model_object(model: object) -> bool:
    """Whether `read_module` reads `model`: a vitlab model (it has a vitlab config) or a timm model."""
    return isinstance(model, nn.Module) and (isinstance(getattr(model, "config", None), ViTConfig | BiTConfig)
                                             or type(model).__module__.split(".")[0] == "timm")


def read_module(model: nn.Module) -> WeightsRecord:
    """The config and tensors of a model object (`is_model_object`), as a file's are read: a vitlab model by its
    config, a timm model through the timm reader (`read_timm_module`: WeightsError for what vitlab cannot
    represent). The tensors are the model's own (a model built from them copies them: `model_from_checkpoint`)."""
    if not is_model_object(model):
        raise TypeError(f"{type(model).__name__} is neither a vitlab model nor a timm model")
    config = getattr(model, "config", None)
    if isinstance(config, ViTConfig | BiTConfig):
        meta = {"class_names": list(model.class_names)} if getattr(model, "class_names", None) else {}
        if getattr(model, "eval_resize", None):
            meta["eval_resize"] = model.eval_resize
        if getattr(model, "dynamic_img_size", False):
            meta["dynamic_img_size"] = True
        state = model.state_dict()
        packed = [k for k, v in state.items() if not isinstance(v, torch.Tensor) or v.is_quantized]
        if packed:  # torch's dynamic int8 layers keep packed weights (and their dtype) in the state dict
            raise WeightsError(f"the {type(model).__name__} object", f"int8-quantized ({packed[0]} holds packed "
                               "int8 weights, not float tensors)", "pass the float model it was quantized from, and "
                               "quantize after training (--precision int8)")
        return WeightsRecord(config, {k: v.detach() for k, v in state.items()}, "vitlab", meta)
    from vitlab.weights.timm import read_timm_module

    return read_timm_module(model)


def check_published(ck: WeightsRecord, path: str | Path, model: str, name: str) -> None:
    """WeightsError when weights read for the published checkpoint `name` are not the architecture `model` it
    promises (a cache entry replaced by another file): a model must never be labelled what it is not."""
    try:
        promised = model_config(model)
    except ValueError:
        return  # a name this vitlab cannot decode promises nothing checkable
    differences = architecture_differences(promised, ck.config)
    if differences:
        got = ck.config.name or describe_architecture(ck.config)
        raise WeightsError(path, f"holds {got} ({'; '.join(differences[:3])}), but {name} is a {model}",
                           f"the cached file was replaced; delete it and run `vitlab download {name}`")


def _read_format(path: Path, arch: str | None, use_ema: bool = False) -> WeightsRecord:
    if is_sharded_checkpoint(path) and not use_ema:
        from vitlab.weights.sharded import read_sharded_checkpoint

        return read_sharded_checkpoint(path)
    fmt = detect_format(path)
    if fmt == "timm":
        from vitlab.weights.timm import read_timm

        return read_timm(path, arch=arch, use_ema=use_ema)
    if use_ema:
        raise WeightsError(path, f"holds no EMA weights ({fmt} weights are one set)",
                           "leave out use_ema / --use-ema (it picks a training checkpoint's EMA weights)")
    # A foreign format's reader is imported when a file of it is read: a run reading its own files needs none.
    if fmt == "jax-npz":
        from vitlab.weights.jax_npz import read_jax_npz

        return read_jax_npz(path)
    if fmt == "bit-npz":
        from vitlab.weights.bit_npz import read_bit_npz

        return read_bit_npz(path)
    if fmt == "hf":
        from vitlab.weights.hf import read_hf

        return read_hf(path)
    return read_vitlab(path)


def load(
    name_or_path: str | Path,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    arch: str | None = None,
    pretrained: str | bool | None = None,
    use_ema: bool = False,
) -> nn.Module:
    """A model in eval mode with the weights `name_or_path` means (a file, folder, run directory or published name,
    `weights.locate`). `image_size` resamples the position embedding, `num_classes` (if different from the
    file's) attaches a new zero-initialised head. `arch` names the architecture of a bare timm state dict when
    its shapes alone do not determine it; `pretrained` a published tag for a model name ("augreg-i21k", True: the
    default). A published checkpoint gets `model.hub_entry` (its catalogue record) and, for ImageNet-1k
    classifiers, `model.class_names`; weights without names get the class indices as text (and
    `model.unnamed_classes`). `use_ema`: a training checkpoint's EMA weights (timm's `state_dict_ema`), as timm's
    use_ema."""
    check_source(name_or_path)
    check_load_sizes(image_size, num_classes)
    entry, path = locate_published(name_or_path, pretrained)
    ck = read_weights(path, arch, use_ema)
    if entry is not None and entry.model and entry.repo is not None:  # files in vitlab's cache are checked on read
        check_published(ck, path, entry.model, entry.name)
    model = model_from_checkpoint(ck, path, image_size, num_classes, owned=True)
    info = published_info(entry, path)
    if info:
        model.hub_entry = info
        if info.get("classes") == "imagenet1k" and model.config.num_classes == 1000 and not getattr(
                model, "class_names", None):
            model.class_names = [name for _, name in imagenet_classes()]
    if not getattr(model, "class_names", None):  # so that model.class_names[i] always works
        model.class_names = [str(i) for i in range(model.config.num_classes)]
        model.unnamed_classes = True  # the names are the indices: a dataset's own names are not checked against them
    return model


def model_from_checkpoint(
    ck: WeightsRecord,
    path: str | Path,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    owned: bool = False,
) -> nn.Module:
    """`load` for weights already read (training reads a checkpoint once: its config decides settings first).
    `path` names the source in errors. The model's parameters take over the checkpoint's tensors only when the
    caller `owned` them (nobody else holds the WeightsRecord); otherwise they are copies, so that training one model
    (a sweep's first learning rate) cannot change the next one built from the same WeightsRecord."""
    config, state = ck.config, dict(ck.state_dict)
    if image_size is not None:
        config, state = change_image_size(config, state, image_size, path)
    if num_classes is not None and num_classes != config.num_classes:
        config, state = drop_head(config, state, num_classes)
        ck.meta.pop("class_names", None)
    with torch.device("meta"):  # no time spent initialising weights the file replaces (most of a large model's build)
        model = build_model(config)
    expected = model.state_dict()
    fresh = {k for k in expected if k.startswith("head.") and k not in state}  # the new zero-init head
    check_state_dict(path, {k: v.shape for k, v in expected.items() if k not in fresh}, state)
    check_values(path, state, ck.meta.get("class_names"), config.num_classes)
    # The model's dtype and a dense layout, as copying into initialised parameters gave (npz kernels are views).
    state = {k: _param_tensor(v, ck.state_dict.get(k), expected[k].dtype, owned) for k, v in state.items()}
    model.load_state_dict(state, strict=not fresh, assign=True)
    if fresh:
        model.reset_classifier(config.num_classes)  # a zero head on the loaded weights' device and dtype
    if ck.meta.get("class_names"):
        model.class_names = list(ck.meta["class_names"])
    if ck.meta.get("eval_resize"):  # how the run evaluated: `vitlab.transforms(model)` and exports repeat it
        model.eval_resize = ck.meta["eval_resize"]
    if ck.meta.get("dynamic_img_size") and hasattr(model, "dynamic_img_size"):  # a timm model built to take any size
        model.dynamic_img_size = True
    return model.eval()


def _param_tensor(tensor: torch.Tensor, original: torch.Tensor | None, dtype: torch.dtype, owned: bool
                  ) -> torch.Tensor:
    """A dense tensor of the model's dtype for a parameter; a copy when it would still share memory with a
    WeightsRecord the caller keeps."""
    out = tensor.to(dtype).contiguous()
    shared = original is not None and out.untyped_storage().data_ptr() == original.untyped_storage().data_ptr()
    return out.clone() if shared and not owned else out


def drop_head(config: ModelConfig, state: dict, num_classes: int) -> tuple[ModelConfig, dict]:
    """Fine-tuning rule: remove the whole head (representation layer too), the new one starts at zero."""
    state = {k: v for k, v in state.items() if not k.startswith(("head.", "pre_logits."))}
    if isinstance(config, ViTConfig):
        return config.replace(num_classes=num_classes, representation_size=None), state
    return config.replace(num_classes=num_classes), state


def change_image_size(
    config: ModelConfig, state: dict, image_size: int | tuple[int, int], path: str | Path
) -> tuple[ModelConfig, dict]:
    """Config and state dict for another native input size; the position embeddings are resampled."""
    try:
        new = config.replace(image_size=image_size)
    except ValueError as err:
        raise WeightsError(path, str(err), "choose an image size divisible by the effective patch size") from None
    if isinstance(config, BiTConfig):
        return new, state
    old_grid, new_grid = config.grid_size(), new.grid_size()
    state = dict(state)
    prefix = config.num_prefix_tokens
    if config.pos_embed == "learned" and "pos_embed" in state:
        state["pos_embed"] = resample_pos_embed(state["pos_embed"], new_grid, old_grid, config.pos_prefix_tokens)
    elif config.pos_embed == "2d":
        state["pos_embed_x"] = resample_1d(state["pos_embed_x"], new_grid[1])
        state["pos_embed_y"] = resample_1d(state["pos_embed_y"], new_grid[0])
    elif config.pos_embed == "relative":
        n_tokens = prefix + new_grid[0] * new_grid[1]
        for key in [k for k in state if k.endswith("attn.rel.embed")]:
            state[key] = resample_relative_table(state[key], n_tokens).contiguous()
    return new, state



def preprocessing(model_or_weights: nn.Module | str | Path) -> tuple[ModelConfig, str]:
    """(config, evaluation resize) of a model or of weights (a path, run directory or catalogue name): what
    `vitlab eval` pre-processes with. The resize is the one recorded with vitlab weights (how their run
    evaluated), else "official" (the whole image resized, as the official code evaluates)."""
    if isinstance(model_or_weights, nn.Module):
        config = getattr(model_or_weights, "config", None)
        if not isinstance(config, (ViTConfig, BiTConfig)):
            raise ValueError(f"{type(model_or_weights).__name__} is not a vitlab model (it has no vitlab config); "
                             "pass a vitlab model or a weights path")  # fmt: skip
        return config, eval_resize_of(model_or_weights)
    check_source(model_or_weights, "vitlab.transforms")
    entry, path = locate_published(model_or_weights)
    ck = read_weights(path)
    published = (published_info(entry, path) or {}).get("eval_resize")
    return ck.config, ck.meta.get("eval_resize") or published or "official"
