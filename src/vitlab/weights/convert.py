"""`vitlab convert` and `vitlab info` as library functions: any readable format in, a chosen format out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..errors import WeightsError
from ..models.config import BiTConfig, ViTConfig
from ..progress import progress
from .load import detect_format, load, read_checkpoint, weights_path

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
    raise ValueError(f"cannot tell the output format from {str(dst)!r}; pass --to {'|'.join(TARGETS)}")


def write(
    model: nn.Module, dst: str | Path, fmt: str, source: str | Path | None = None, card: bool | None = None,
    **options: Any,
) -> Path | None:
    """Write `model` as `fmt`. Folder exports (timm hub folders, HF) always hold a model card (README.md);
    `card=True` also writes `<dst stem>.md` beside a file export. Returns that card's path, if written."""
    if fmt == "vitlab":
        from .io import save

        resize = getattr(model, "eval_resize", None)  # how the run evaluated: kept through conversions
        save(model, dst, meta={"eval_resize": resize} if resize else None)
    elif fmt == "jax-npz":
        from .jax_npz import write_jax_npz

        write_jax_npz(model, dst, **options)
    elif fmt == "bit-npz":
        from .bit_npz import write_bit_npz

        write_bit_npz(model, dst, gn_4d=options.get("gn_4d", False))
    elif fmt == "hf":
        from .hf import write_hf

        write_hf(model, dst, source)
    else:
        from .timm import write_timm

        write_timm(model, dst, source)
    if card and not is_folder_export(dst, fmt):
        from .card import write_card

        return write_card(model, fmt, dst, source)
    return None


def is_folder_export(dst: str | Path, fmt: str) -> bool:
    """HF exports are folders; timm ones unless the path names a state-dict file."""
    from .files import PICKLE_SUFFIXES

    return fmt == "hf" or (fmt == "timm" and Path(dst).suffix not in (".safetensors", *PICKLE_SUFFIXES))


def convert(
    src: str | Path,
    dst: str | Path,
    to: str | None = None,
    image_size: int | None = None,
    num_classes: int | None = None,
    arch: str | None = None,
    card: bool | None = None,
    **options: Any,
) -> str:
    """Read `src` (any format, a run directory too), optionally resize/re-head, write `dst`; returns the format
    written. Folder exports get a model card naming `src`; `card=True` adds one beside a file export."""
    fmt = target_format(dst, to)
    file = source_file(src)  # the weights file it means, named as the card's source
    if Path(dst).resolve() in (Path(src).resolve(), file.resolve()):
        raise ValueError("destination is the source; write to a new path")
    with progress(total=2, desc=f"convert {file.name}", unit="phase") as bar:  # read, then write
        model = load(file, image_size=image_size, num_classes=num_classes, arch=arch)
        bar.update(1)
        if fmt == "jax-npz" and isinstance(model.config, BiTConfig):
            fmt = "bit-npz"  # the official .npz of a BiT is big_transfer's layout
        write(model, dst, fmt, source=file, card=card, **options)
        bar.update(1)
    return fmt


def source_file(src: str | Path) -> Path:
    """The weights a `convert` / `info` argument means: a published checkpoint's name its file in the download
    cache (vitlab.hub), a run or checkpoint directory its model.safetensors, anything else itself."""
    from ..hub import resolve_path

    return weights_path(resolve_path(src))


def describe(path: str | Path, arch: str | None = None) -> dict[str, Any]:
    """What `vitlab info` prints: the format, the inferred architecture, sizes and class names."""
    file = source_file(path)
    fmt = detect_format(file)
    ck = read_checkpoint(file, arch)
    cfg = ck.config
    from .validate import check_values

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
