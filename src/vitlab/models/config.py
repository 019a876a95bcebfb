"""Architecture descriptions: frozen dataclasses that fully determine a model.

`save` stores `config.to_dict()` in the file's metadata and `load` rebuilds the model from it, so every field
that changes the computation lives here and nothing else does.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

PosEmbedKind = Literal["none", "learned", "2d", "relative"]
Classifier = Literal["token", "gap"]
GeluKind = Literal["exact", "tanh"]

# Pixel normalisation the official weights expect: x/255 mapped to [-1, 1] == (x - 0.5) / 0.5.
OFFICIAL_MEAN = (0.5, 0.5, 0.5)
OFFICIAL_STD = (0.5, 0.5, 0.5)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _pair(v: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    return (int(v[0]), int(v[1]))


def _normalize_common_fields(cfg: Any) -> None:
    """Accept lists/ints/dicts (from JSON or users) and store tuples and dataclasses, so equal configs compare equal."""
    object.__setattr__(cfg, "image_size", _pair(cfg.image_size))
    object.__setattr__(cfg, "mean", tuple(float(v) for v in cfg.mean))
    object.__setattr__(cfg, "std", tuple(float(v) for v in cfg.std))
    if isinstance(cfg.resnet, dict):
        object.__setattr__(cfg, "resnet", ResNetConfig(**cfg.resnet))


@dataclass(frozen=True)
class ResNetConfig:
    """BiT ResNet (v1.5 bottlenecks, GroupNorm + weight standardisation, JAX "SAME" padding)."""

    layers: tuple[int, ...] = (3, 4, 6, 3)  # bottleneck units per stage; () = root only
    width_factor: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(int(n) for n in self.layers))

    @property
    def root_width(self) -> int:
        return 64 * self.width_factor

    @property
    def out_channels(self) -> int:
        if not self.layers:
            return self.root_width
        return 4 * self.root_width * 2 ** (len(self.layers) - 1)

    @property
    def reduction(self) -> int:
        """Total stride of the stem: 4 from the root, then 2 per stage after the first."""
        return 4 * 2 ** max(len(self.layers) - 1, 0)


@dataclass(frozen=True)
class ViTConfig:
    """A Vision Transformer, optionally with a ResNet stem (hybrid). Field names follow paper Section 3.1 and Table 1."""

    image_size: tuple[int, int] = (224, 224)  # native size: the position embedding's grid
    patch_size: int = 16  # on the input, or on the stem's feature map for hybrids
    width: int = 768  # D
    depth: int = 12  # L
    mlp_dim: int = 3072
    num_heads: int = 12
    num_classes: int = 1000  # 0: no classifier, forward returns the representation
    classifier: Classifier = "token"
    representation_size: int | None = None  # `pre_logits` Dense + tanh before the head
    pos_embed: PosEmbedKind = "learned"
    gelu: GeluKind = "exact"  # "tanh" for official JAX checkpoints
    ln_eps: float = 1e-6
    qkv_bias: bool = True
    in_chans: int = 3
    dropout: float = 0.0
    attn_dropout: float = 0.0
    resnet: ResNetConfig | None = None  # hybrid stem
    mean: tuple[float, float, float] = OFFICIAL_MEAN  # input normalisation the weights expect
    std: tuple[float, float, float] = OFFICIAL_STD
    name: str = ""

    def __post_init__(self) -> None:
        _normalize_common_fields(self)
        if self.width % self.num_heads:
            raise ValueError(f"width {self.width} is not divisible by num_heads {self.num_heads}")
        if self.pos_embed == "2d" and self.width % 2:
            raise ValueError("2-D position embeddings need an even width (D/2 for X and for Y)")
        if self.classifier not in ("token", "gap"):
            raise ValueError(f"classifier must be 'token' or 'gap', not {self.classifier!r}")
        if self.pos_embed not in ("none", "learned", "2d", "relative"):
            raise ValueError(f"pos_embed must be none, learned, 2d or relative, not {self.pos_embed!r}")
        if self.gelu not in ("exact", "tanh"):
            raise ValueError(f"gelu must be 'exact' or 'tanh', not {self.gelu!r}")
        h, w = self.image_size
        if h % self.total_stride or w % self.total_stride:
            raise ValueError(
                f"image size {h}x{w} is not divisible by the effective patch size {self.total_stride}; "
                f"use a multiple of {self.total_stride}"
            )

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def total_stride(self) -> int:
        """Input pixels per token side: patch size times the stem's downsampling."""
        return self.patch_size * (self.resnet.reduction if self.resnet else 1)

    def grid_size(self, image_size: tuple[int, int] | None = None) -> tuple[int, int]:
        h, w = image_size or self.image_size
        return (h // self.total_stride, w // self.total_stride)

    @property
    def num_prefix_tokens(self) -> int:
        return 1 if self.classifier == "token" else 0

    def replace(self, **changes: Any) -> ViTConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {"arch": "vit", **_plain(dataclasses.asdict(self))}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


@dataclass(frozen=True)
class BiTConfig:
    """A BiT ResNet classifier (the paper's CNN baseline): ResNet stages, GN+ReLU, global average pool, head."""

    resnet: ResNetConfig = field(default_factory=ResNetConfig)
    image_size: tuple[int, int] = (224, 224)
    num_classes: int = 1000
    in_chans: int = 3
    mean: tuple[float, float, float] = OFFICIAL_MEAN
    std: tuple[float, float, float] = OFFICIAL_STD
    name: str = ""

    def __post_init__(self) -> None:
        _normalize_common_fields(self)

    def replace(self, **changes: Any) -> BiTConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {"arch": "bit", **_plain(dataclasses.asdict(self))}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


ModelConfig = ViTConfig | BiTConfig


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    """Tuples become lists so the dict round-trips through JSON unchanged."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out[k] = _plain(v)
        elif isinstance(v, tuple):
            out[k] = list(v)
        else:
            out[k] = v
    return out


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """Inverse of `to_dict`; unknown keys are an error so that a newer file is not silently misread."""
    d = dict(d)
    arch = d.pop("arch", "vit")
    cls = {"vit": ViTConfig, "bit": BiTConfig}.get(arch)
    if cls is None:
        raise ValueError(f"unknown architecture {arch!r} in config (expected 'vit' or 'bit')")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown config fields {sorted(unknown)}; was the file written by a newer vitlab?")
    if d.get("resnet") is not None:
        d["resnet"] = ResNetConfig(**d["resnet"])
    return cls(**d)
