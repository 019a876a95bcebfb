"""Architecture descriptions: frozen dataclasses that fully determine a model.

`save` stores `config.to_dict()` in the file's metadata and `load` rebuilds the model from it, so every field
that changes the computation lives here and nothing else does.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from vitlab.constants import OFFICIAL_MEAN, OFFICIAL_STD
from vitlab.models.limits import check_limits
from vitlab.ranges import is_int

PosEmbedKind = Literal["none", "learned", "2d", "relative"]
Classifier = Literal["token", "gap"]
GeluKind = Literal["exact", "tanh"]



def _pair(v: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """An image size as (height, width). Only integers: "224" would otherwise be read as the pair (2, 2)."""
    if is_int(v):
        return (int(v), int(v))
    if isinstance(v, tuple | list) and len(v) == 2 and all(is_int(x) for x in v):
        return (int(v[0]), int(v[1]))
    raise ValueError(f"image_size must be an integer or two integers (height, width), got {v!r}")


def _normalize_common_fields(cfg: Any) -> None:
    """Accept lists/ints/dicts (from JSON or users) and store tuples and dataclasses, so equal configs compare equal;
    refuse sizes, class counts and normalisations no model can have."""
    object.__setattr__(cfg, "image_size", _pair(cfg.image_size))
    for name in ("mean", "std"):  # three numbers, one per RGB channel
        try:
            object.__setattr__(cfg, name, tuple(float(v) for v in getattr(cfg, name)))
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be 3 numbers (R, G, B), got {getattr(cfg, name)!r}") from None
    if min(cfg.image_size) < 1:
        raise ValueError(f"image_size must be positive, got {cfg.image_size[0]}x{cfg.image_size[1]}")
    if not isinstance(cfg.num_classes, int) or cfg.num_classes < 0:
        raise ValueError(f"num_classes must be an integer >= 0 (0: no classifier), got {cfg.num_classes}")
    if len(cfg.mean) != 3 or len(cfg.std) != 3:
        raise ValueError(f"mean and std need 3 values (RGB), got {len(cfg.mean)} and {len(cfg.std)}")
    if not all(math.isfinite(v) for v in cfg.mean) or not all(math.isfinite(v) and v > 0 for v in cfg.std):
        raise ValueError(f"mean must be finite and std positive, got mean {cfg.mean} and std {cfg.std}")


def check_ranges(cfg: Any, positive: tuple[str, ...] = (), unit: tuple[str, ...] = ()) -> None:
    """ValueError naming the first field outside its range: `positive` integers >= 1, `unit` floats in [0, 1)."""
    for name in positive:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name in unit:
        value = getattr(cfg, name)
        if not (isinstance(value, int | float) and 0.0 <= value < 1.0):
            raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    if isinstance(getattr(cfg, "resnet", None), dict):
        object.__setattr__(cfg, "resnet", ResNetConfig(**cfg.resnet))


@dataclass(frozen=True)
class ResNetConfig:
    """The hybrid stem: the official vit_jax `models_resnet.py` ResNet (post-activation v1.5 bottlenecks,
    GroupNorm + weight standardisation, JAX "SAME" padding). Not BiT: see BiTConfig."""

    layers: tuple[int, ...] = (3, 4, 6, 3)  # bottleneck units per stage; () = root only
    width_factor: float = 1  # any float, as in the official code: the root width is int(64 · width_factor)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(int(n) for n in self.layers))
        wf = float(self.width_factor)
        if not (math.isfinite(wf) and int(64 * wf) >= 1):
            raise ValueError(f"width_factor must give a root width int(64·wf) of at least 1, got {self.width_factor}")
        object.__setattr__(self, "width_factor", int(wf) if wf.is_integer() else wf)  # 1.0 and 1 compare equal

    @property
    def root_width(self) -> int:
        return int(64 * self.width_factor)

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
    """A Vision Transformer, optionally with a ResNet stem (hybrid). Fields follow paper Section 3.1, Table 1."""

    image_size: tuple[int, int] = (224, 224)  # native size: the position embedding's grid
    patch_size: int = 16  # on the input, or on the stem's feature map for hybrids
    width: int = 768  # D
    depth: int = 12  # L
    mlp_dim: int = 3072  # hidden width of each block's MLP
    num_heads: int = 12  # attention heads; width must divide by it
    num_classes: int = 1000  # 0: no classifier, forward returns the representation
    classifier: Classifier = "token"  # "token": the class token's output; "gap": the mean of the patch tokens
    representation_size: int | None = None  # `pre_logits` Dense + tanh before the head
    pos_embed: PosEmbedKind = "learned"  # "learned" (the paper's 1-D), "2d", "relative" or "none" (Appendix D.4)
    gelu: GeluKind = "exact"  # "tanh" for official JAX checkpoints
    ln_eps: float = 1e-6  # LayerNorm epsilon (official checkpoints: 1e-6)
    qkv_bias: bool = True  # bias on the query, key and value projections
    in_chans: int = 3  # input channels
    dropout: float = 0.0  # dropout after the embedding and in each MLP
    attn_dropout: float = 0.0  # dropout on the attention weights
    drop_path_rate: float = 0.0  # stochastic depth of the last block; linear from 0 at the first (timm, DeiT)
    resnet: ResNetConfig | None = None  # hybrid stem
    # After the paper (timm's options of the same meaning; the defaults are the paper's ViT):
    reg_tokens: int = 0  # register tokens after the class token (Darcet et al. 2024; timm reg_tokens, DINOv2)
    class_token: bool | None = None  # None: a class token exactly when classifier == "token"; True with "gap":
    # timm's class_token=True, global_pool="avg" (the mean skips the prefix tokens)
    pos_embed_prefix: bool = True  # the position embedding covers the prefix tokens (False: timm no_embed_class)
    fc_norm: bool = False  # LayerNorm after pooling instead of on the tokens (timm fc_norm, its "avg" default)
    layer_scale: float | None = None  # LayerScale on both residual branches, initialised to this (timm init_values)
    dynamic_img_pad: bool = False  # inputs not divisible by the patch size are zero-padded right and bottom (timm's)
    mean: tuple[float, float, float] = OFFICIAL_MEAN  # input normalisation the weights expect
    std: tuple[float, float, float] = OFFICIAL_STD  # with mean: x_normalised = (x - mean) / std
    name: str = ""  # the variant's name ("ViT-B/16"), or "" for a custom architecture

    def __post_init__(self) -> None:
        _normalize_common_fields(self)
        check_ranges(self, positive=("patch_size", "width", "depth", "mlp_dim", "num_heads", "in_chans"),
                     unit=("dropout", "attn_dropout", "drop_path_rate"))
        check_limits(self)
        if self.representation_size is not None:
            check_ranges(self, positive=("representation_size",))
        if not (math.isfinite(self.ln_eps) and self.ln_eps > 0):
            raise ValueError(f"ln_eps must be a positive number, got {self.ln_eps}")
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
        self._check_after_paper_fields()
        h, w = self.image_size
        if h % self.total_stride or w % self.total_stride:
            raise ValueError(
                f"image size {h}x{w} is not divisible by the effective patch size {self.total_stride}; "
                f"use a multiple of {self.total_stride}"
            )

    def _check_after_paper_fields(self) -> None:
        if isinstance(self.reg_tokens, bool) or not isinstance(self.reg_tokens, int) or not 0 <= self.reg_tokens <= 256:
            raise ValueError(f"reg_tokens must be an integer from 0 to 256, got {self.reg_tokens!r}")
        if self.class_token is not None and not isinstance(self.class_token, bool):
            raise ValueError(f"class_token must be True, False or None, got {self.class_token!r}")
        if self.class_token == (self.classifier == "token"):  # one spelling per model: the derived value is None
            object.__setattr__(self, "class_token", None)
        if self.classifier == "token" and self.class_token is False:
            raise ValueError("classifier='token' needs a class token; use classifier='gap' without one")
        if self.layer_scale is not None and not (isinstance(self.layer_scale, int | float) and
                                                 math.isfinite(self.layer_scale)):
            raise ValueError(f"layer_scale must be a number (the LayerScale init) or None, got {self.layer_scale!r}")
        if self.dynamic_img_pad is True and self.resnet is not None:
            raise ValueError("dynamic_img_pad pads the pixels to a multiple of the patch size: a ViT option, not a "
                             "hybrid's (pad or crop the input to a multiple of the effective patch size instead)")
        for name in ("pos_embed_prefix", "fc_norm", "dynamic_img_pad"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    def after_paper_features(self) -> list[str]:
        """The features this architecture uses that the paper's ViT (and so the official .npz and HF formats)
        lacks, described for an error message; [] for the paper's ViT."""
        found = [f"{self.reg_tokens} register tokens"] if self.reg_tokens else []
        found += ["a class token with average pooling"] if self.classifier == "gap" and self.has_class_token else []
        found += ["no position-embedding entries for the prefix tokens"] if not self.pos_embed_prefix else []
        found += ["a LayerNorm after pooling (fc_norm)"] if self.fc_norm else []
        return found + (["layer scale"] if self.layer_scale is not None else [])

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
        """Tokens before the patches: the class token (if any), then the registers."""
        return int(self.has_class_token) + self.reg_tokens

    @property
    def has_class_token(self) -> bool:
        return self.classifier == "token" if self.class_token is None else self.class_token

    @property
    def pos_prefix_tokens(self) -> int:
        """Prefix tokens that have a position-embedding entry (all of them, or none with pos_embed_prefix=False)."""
        return self.num_prefix_tokens if self.pos_embed_prefix else 0

    def replace(self, **changes: Any) -> ViTConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        # Fields added after the paper are written only when they differ from the paper's ViT, so that the files
        # of ordinary models stay readable by earlier vitlab versions.
        d = _tuples_to_lists(dataclasses.asdict(self))
        for name, default in _AFTER_PAPER_DEFAULTS.items():
            if d[name] == default:
                del d[name]
        return {"arch": "vit", **d}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


@dataclass(frozen=True)
class BiTConfig:
    """A BiT ResNetV2 classifier (Kolesnikov et al. 2020; the ViT paper's CNN baselines): pre-activation
    bottlenecks with GroupNorm and weight standardisation, final GN + ReLU, global mean pool, head."""

    layers: tuple[int, ...] = (3, 4, 6, 3)  # units per stage: R50 (3,4,6,3), R101 (3,4,23,3), R152 (3,8,36,3)
    width_factor: int = 1  # the "x1", "x3" of BiT-R50x3: root width 64·wf
    image_size: tuple[int, int] = (224, 224)  # a CNN takes any size; this is the size it was trained at
    num_classes: int = 1000
    in_chans: int = 3
    gn_eps: float = 1e-5
    ws_eps: float = 1e-10  # weight standardisation (w − mean) / sqrt(var + ws_eps): big_transfer 1e-10, timm 1e-8
    mean: tuple[float, float, float] = OFFICIAL_MEAN
    std: tuple[float, float, float] = OFFICIAL_STD
    name: str = ""

    def __post_init__(self) -> None:
        _normalize_common_fields(self)
        object.__setattr__(self, "layers", tuple(int(n) for n in self.layers))
        if not self.layers or min(self.layers) < 1:
            raise ValueError(f"BiT layers must be one or more positive unit counts per stage, got {self.layers}")
        check_ranges(self, positive=("width_factor", "in_chans"))
        check_limits(self)
        if not (self.gn_eps > 0 and self.ws_eps > 0):
            raise ValueError(f"gn_eps and ws_eps must be positive, got {self.gn_eps} and {self.ws_eps}")

    @property
    def root_width(self) -> int:
        return 64 * self.width_factor

    @property
    def out_channels(self) -> int:
        """Width of the representation: 4 · 64·wf · 2^(stages − 1) (2048·wf for four stages)."""
        return 4 * self.root_width * 2 ** (len(self.layers) - 1)

    def replace(self, **changes: Any) -> BiTConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {"arch": "bit-v2", **_tuples_to_lists(dataclasses.asdict(self))}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


ModelConfig = ViTConfig | BiTConfig
_AFTER_PAPER_DEFAULTS = {"reg_tokens": 0, "class_token": None, "pos_embed_prefix": True, "fc_norm": False,
                         "layer_scale": None, "dynamic_img_pad": False}


def _tuples_to_lists(value: Any) -> Any:
    """Tuples become lists, in nested dicts too, so the dict round-trips through JSON unchanged."""
    if isinstance(value, dict):
        return {k: _tuples_to_lists(v) for k, v in value.items()}
    return list(value) if isinstance(value, tuple) else value


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """Inverse of `to_dict`; unknown keys are an error so that a newer file is not silently misread."""
    d = dict(d)
    arch = d.pop("arch", "vit")
    if arch == "bit":  # a post-activation ResNet with a pooled head, not BiT: refused (CHANGELOG.md, 0.1.0)
        raise ValueError("architecture 'bit' is vitlab 0.1's post-activation ResNet, not BiT's ResNetV2, and is no "
                         "longer supported; load the original BiT weights (.npz, timm, HF) instead")
    cls = {"vit": ViTConfig, "bit-v2": BiTConfig}.get(arch)
    if cls is None:
        raise ValueError(f"unknown architecture {arch!r} in config (expected 'vit' or 'bit-v2')")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown config fields {sorted(unknown)}; was the file written by a newer vitlab?")
    if d.get("resnet") is not None:
        d["resnet"] = ResNetConfig(**d["resnet"])
    return cls(**d)


def _refuse_assignment(self: Any, name: str, value: Any) -> None:
    """A model's config describes its architecture and never changes; the refusal says how to get a changed copy,
    and what to wrap for transformers' Trainer, which sets `model.config.use_cache` in its constructor."""
    raise dataclasses.FrozenInstanceError(
        f"cannot assign to field {name!r}: a vitlab {type(self).__name__} is frozen (it describes the model's "
        "architecture; config.replace(...) gives a changed copy); for transformers' Trainer wrap the model in a module "
        "whose forward(pixel_values, labels) returns {'loss', 'logits'} (docs/coming-from-transformers.md)")


for _frozen in (ViTConfig, BiTConfig, ResNetConfig):
    _frozen.__setattr__ = _refuse_assignment  # type: ignore[method-assign]  # the dataclass's own, with the fix said
