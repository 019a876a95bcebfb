"""`vitlab convert` and `vitlab info` as library functions: any readable format in, a chosen format out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..models.config import BiTConfig, ViTConfig
from .errors import WeightsError
from .load import detect_format, load, read_checkpoint

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


def write(model: nn.Module, dst: str | Path, fmt: str, **options: Any) -> None:
    if fmt == "vitlab":
        from .io import save

        save(model, dst)
    elif fmt == "jax-npz":
        from .jax_npz import write_jax_npz

        write_jax_npz(model, dst, **options)
    elif fmt == "bit-npz":
        from .bit_npz import write_bit_npz

        write_bit_npz(model, dst, gn_4d=options.get("gn_4d", False))
    elif fmt == "hf":
        from .hf import write_hf

        write_hf(model, dst)
    else:
        from .timm import write_timm

        write_timm(model, dst)


def convert(
    src: str | Path,
    dst: str | Path,
    to: str | None = None,
    image_size: int | None = None,
    num_classes: int | None = None,
    arch: str | None = None,
    **options: Any,
) -> str:
    """Read `src` (any format), optionally resize/re-head, write `dst`; returns the format written."""
    fmt = target_format(dst, to)
    if Path(dst).resolve() == Path(src).resolve():
        raise ValueError("destination is the source; write to a new path")
    model = load(src, image_size=image_size, num_classes=num_classes, arch=arch)
    if fmt == "jax-npz" and isinstance(model.config, BiTConfig):
        fmt = "bit-npz"  # the official .npz of a BiT is big_transfer's layout
    write(model, dst, fmt, **options)
    return fmt


def describe(path: str | Path, arch: str | None = None) -> dict[str, Any]:
    """What `vitlab info` prints: the format, the inferred architecture, sizes and class names."""
    fmt = detect_format(path)
    ck = read_checkpoint(path, arch)
    cfg = ck.config
    info: dict[str, Any] = {
        "path": str(path),
        "format": fmt,
        "name": cfg.name or "(custom)",
        "params": sum(t.numel() for t in ck.state_dict.values()),
        "tensors": len(ck.state_dict),
        "config": cfg.to_dict(),
    }
    if isinstance(cfg, ViTConfig):
        info["grid"] = list(cfg.grid_size())
    names = ck.meta.get("class_names")
    if names:
        info["class_names"] = names[:10] + (["…"] if len(names) > 10 else [])
    return info


__all__ = ["TARGETS", "WeightsError", "convert", "describe", "target_format", "write"]
