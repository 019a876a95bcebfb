"""`vitlab convert` and `vitlab info` as library functions: any readable format in, a chosen format out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from vitlab.errors import WeightsError
from vitlab.files.outputs import TEXT, Kind, check_output, check_output_folder
from vitlab.models.config import BiTConfig, ViTConfig
from vitlab.progress import progress
from vitlab.weights.bit_npz import write_bit_npz
from vitlab.weights.card import CARD, write_card
from vitlab.weights.hf import write_hf
from vitlab.weights.hf_folder import HF_FILES
from vitlab.weights.jax_npz import write_jax_npz
from vitlab.weights.load import detect_format, load, read_weights
from vitlab.weights.locate import locate
from vitlab.weights.tensors import PICKLE_SUFFIXES, is_onnx_path
from vitlab.weights.timm import HUB_FILES, write_timm
from vitlab.weights.validate import check_values
from vitlab.weights.vitlab_format import WEIGHTS_KIND, save

CARD_KIND = Kind("vitlab", TEXT)  # a model card beside a file export (card.write_card's mark)

TARGETS = ("vitlab", "jax-npz", "bit-npz", "timm", "hf")


def target_format(dst: str | Path, to: str | None) -> str:
    """The output format: --to if given, else from the destination's suffix (.safetensors, .npz)."""
    if to is not None:
        if to not in TARGETS:
            raise ValueError(f"unknown target format {to!r}; choose one of {', '.join(TARGETS)}")
        return to
    suffix = Path(dst).suffix
    if suffix == ".safetensors":
        return "vitlab"
    if suffix == ".npz":
        return "jax-npz"
    if is_onnx_path(dst):
        raise ValueError(f"{dst}: convert writes weights; an ONNX graph is what vitlab export writes (vitlab "
                         f"export WEIGHTS {dst})")
    raise ValueError(f"cannot tell the output format from {str(dst)!r}; pass --to {'|'.join(TARGETS)}")


def write(
    model: nn.Module, dst: str | Path, fmt: str, source: str | Path | None = None, card: bool | None = None,
    force: bool = False, inputs: tuple[str | Path, ...] = (), **options: Any,
) -> Path | None:
    """Write `model` as `fmt`, the one dispatch over the writers ("jax-npz" of a BiT means big_transfer's .npz).
    Folder exports (timm hub folders, HF) always hold a model card (README.md); `card=True` also writes
    `<dst stem>.md` beside a file export. Returns that card's path, if written. What is at `dst` (and the
    card's path) is held to the output rule first (`check_outputs`; never one of `inputs`)."""
    check_outputs(dst, fmt, card, force, inputs)
    is_bit = isinstance(model.config, BiTConfig)
    if fmt == "vitlab":
        resize = getattr(model, "eval_resize", None)  # how the run evaluated: kept through conversions
        save(model, dst, meta={"eval_resize": resize} if resize else None, force=force, inputs=inputs)
    elif fmt == "bit-npz" or (fmt == "jax-npz" and is_bit):  # the official .npz of a BiT: big_transfer's layout
        write_bit_npz(model, dst, gn_4d=options.get("gn_4d", False))
    elif fmt == "jax-npz":
        write_jax_npz(model, dst, **options)
    elif fmt == "hf":
        write_hf(model, dst, source)  # the HF format holds ViTs and BiTs (config.json model_type)
    else:
        write_timm(model, dst, source)
    if card and not is_folder_export(dst, fmt):
        return write_card(model, fmt, dst, source)
    return None


def check_outputs(dst: str | Path, fmt: str, card: bool | None = None, force: bool = False,
                  inputs: tuple[str | Path, ...] = ()) -> None:
    """OutputRefused (one line) unless `dst` may be written (outputs.check_output, weights): weights vitlab wrote
    or none; a folder export's folder absent, empty or an earlier export (its README.md card marked as vitlab's);
    never one of `inputs`, a run's files, a device, FIFO, socket or link. `force` lets a regular file (or an
    export folder's files) of anyone's go, but never an input or a run's file."""
    if is_folder_export(dst, fmt):
        check_output_folder(dst, HF_FILES if fmt == "hf" else HUB_FILES, CARD, force, inputs=inputs)
        return
    check_output(dst, force, kind=WEIGHTS_KIND, inputs=inputs)
    if card:
        check_output(Path(dst).with_suffix(".md"), force, kind=CARD_KIND, inputs=inputs)


def is_folder_export(dst: str | Path, fmt: str) -> bool:
    """HF exports are folders; timm ones unless the path names a state-dict file."""
    return fmt == "hf" or (fmt == "timm" and Path(dst).suffix not in (".safetensors", *PICKLE_SUFFIXES))


def convert(
    src: str | Path,
    dst: str | Path,
    to: str | None = None,
    image_size: int | None = None,
    num_classes: int | None = None,
    arch: str | None = None,
    card: bool | None = None,
    force: bool = False,
    **options: Any,
) -> str:
    """Read `src` (any format, a run directory too), optionally resize/re-head, write `dst`; returns the format
    written. Folder exports get a model card naming `src`; `card=True` adds one beside a file export. `dst` is
    held to the output rule before anything is read (`check_outputs`; `force`: replace a file of anyone's)."""
    fmt = target_format(dst, to)
    file = locate(src)  # the weights file it means, named as the card's source
    check_outputs(dst, fmt, card, force, (src, file))  # before minutes of reading
    with progress(total=2, desc=f"convert {file.name}", unit="phase") as bar:  # read, then write
        model = load(file, image_size=image_size, num_classes=num_classes, arch=arch)
        bar.update(1)
        if fmt == "jax-npz" and isinstance(model.config, BiTConfig):
            fmt = "bit-npz"  # what was written: the official .npz of a BiT is big_transfer's layout
        write(model, dst, fmt, source=file, card=card, force=force, inputs=(src, file), **options)
        bar.update(1)
    return fmt


def describe(path: str | Path, arch: str | None = None) -> dict[str, Any]:
    """What `vitlab info` prints: the format, the inferred architecture, sizes and class names."""
    file = locate(path)
    fmt = detect_format(file)
    ck = read_weights(file, arch)
    cfg = ck.config
    check_values(file, ck.state_dict, ck.meta.get("class_names"), cfg.num_classes)  # what loading would refuse
    info: dict[str, Any] = {"path": str(path)}
    if file != Path(path):  # a run or checkpoint directory: say which file it means
        info["file"] = str(file)
    info |= {
        "format": fmt,
        "name": cfg.name or "(custom)",
        "params": sum(t.numel() for t in ck.state_dict.values()),
        "tensors": len(ck.state_dict),
        "config": cfg.to_dict(),
    }
    if ck.meta.get("eval_resize"):
        info["eval_resize"] = ck.meta["eval_resize"]
    if isinstance(cfg, ViTConfig):
        info["grid"] = list(cfg.grid_size())
    names = ck.meta.get("class_names")
    if names:
        info["class_names"] = names[:10] + (["…"] if len(names) > 10 else [])
    return info


__all__ = ["TARGETS", "WeightsError", "convert", "describe", "target_format", "write"]
