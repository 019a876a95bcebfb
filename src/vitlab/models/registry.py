"""Named variants as a small table (paper Table 1 and the official vit_jax configs), decoded from names.

"ViT-B/16" = size B, patch 16; any patch size decodes ("ViT-B/14"). "-gap" selects the GAP classifier without
class token. Hybrids are listed explicitly because their names do not encode the patch size; BiT names decode as
"BiT-R<depth>x<width factor>" (big_transfer's naming). The table and the configs are plain data: this module
imports no torch until a model is built.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from vitlab.errors import by_surface, closest
from vitlab.models.config import BiTConfig, ModelConfig, ResNetConfig, ViTConfig
from vitlab.models.limits import check_blocks

if TYPE_CHECKING:
    from torch import nn

# size: (depth L, width D, mlp_dim, heads)
VIT_SIZES: dict[str, tuple[int, int, int, int]] = {
    "Ti": (12, 192, 768, 3),
    "S": (12, 384, 1536, 6),
    "B": (12, 768, 3072, 12),
    "L": (24, 1024, 4096, 16),
    "H": (32, 1280, 5120, 16),
}

RESNET_DEPTHS: dict[str, tuple[int, ...]] = {
    "26": (2, 2, 2, 2),
    "50": (3, 4, 6, 3),
    "101": (3, 4, 23, 3),
    "152": (3, 8, 36, 3),
    "200": (3, 24, 36, 3),
}

# hybrid name: (ViT size, ResNet stages, patch size on the stem's feature map)
HYBRIDS: dict[str, tuple[str, tuple[int, ...], int]] = {
    "R+ViT-Ti/16": ("Ti", (), 8),  # ResNet root only (stride 4), then 8×8 patches
    "R26+ViT-S/32": ("S", RESNET_DEPTHS["26"], 1),
    "R26+ViT-B/32": ("B", RESNET_DEPTHS["26"], 1),
    "R50+ViT-B/16": ("B", (3, 4, 9), 1),  # the paper's R50: stage 4 dropped, 9 units in stage 3
    "R50+ViT-L/32": ("L", RESNET_DEPTHS["50"], 1),
}

LISTED_VITS = ["Ti/16", "S/16", "S/32", "B/8", "B/16", "B/32", "L/16", "L/32", "H/14"]
# big_transfer's released BiT-S/BiT-M models and the paper's Table 6 (R50x2, R152x1, R200x3)
LISTED_BITS = ["R50x1", "R50x2", "R50x3", "R101x1", "R101x3", "R152x1", "R152x2", "R152x4", "R200x3"]

# Overrides that leave the architecture the named one (head size, input size, regularisation, normalisation, BiT's
# weight-standardisation eps: the numerics of the weights' source, 1e-10 big_transfer's, 1e-8 timm's).
_NAME_KEEPING = {"num_classes", "image_size", "dropout", "attn_dropout", "drop_path_rate", "mean", "std", "name",
                 "ws_eps"}  # fmt: skip

_VIT_NAME = re.compile(r"^ViT-(Ti|S|B|L|H)/(\d+)(-gap)?$")
_BIT_NAME = re.compile(r"^BiT-R(26|50|101|152|200)x(\d+)$")


def variant_names() -> list[str]:
    """Every named variant: the ViTs of paper Table 1 and the official configs, their GAP versions, the
    hybrids, the BiT ResNetV2s."""
    vits = [f"ViT-{v}" for v in LISTED_VITS]
    return vits + [f"{v}-gap" for v in vits] + list(HYBRIDS) + [f"BiT-{b}" for b in LISTED_BITS]


def unknown_model(name: str, also: Iterable[str] = ()) -> str:
    """The one line for a name that is no variant: the listed name it most likely misspells (among the variants
    and `also`, the other names the caller accepts, e.g. timm's)."""
    guess = closest(name, [*variant_names(), *also])
    hint = f"did you mean {guess!r}? " if guess else ""
    lists = by_surface("`vitlab models`", "vitlab.list_models()")
    return f"unknown model {name!r}; {hint}{lists} lists the names" + ("" if guess else " (e.g. 'ViT-B/16')")


def model_config(name: str, /, **overrides: Any) -> ModelConfig:
    """The config for a variant name; keyword overrides replace fields (num_classes, image_size, …)."""
    if name in HYBRIDS:
        size, layers, patch = HYBRIDS[name]
        cfg: ModelConfig = _vit(size, patch, name).replace(resnet=ResNetConfig(layers=layers))
    elif m := _VIT_NAME.match(name):
        size, patch, gap = m.groups()
        cfg = _vit(size, int(patch), name)
        if gap:
            cfg = cfg.replace(classifier="gap")
    elif m := _BIT_NAME.match(name):
        depth, wf = m.groups()
        cfg = BiTConfig(layers=RESNET_DEPTHS[depth], width_factor=int(wf), name=name)
    else:
        raise ValueError(unknown_model(name))
    if not overrides:
        return cfg
    if set(overrides) - _NAME_KEEPING:  # e.g. depth=2: no longer the named variant
        overrides = {"name": "", **overrides}
    return cfg.replace(**overrides)


def _vit(size: str, patch: int, name: str) -> ViTConfig:
    depth, width, mlp, heads = VIT_SIZES[size]
    return ViTConfig(patch_size=patch, width=width, depth=depth, mlp_dim=mlp, num_heads=heads, name=name)


def describe_architecture(config: ModelConfig) -> str:
    """A name for an architecture that is not a listed variant, saying what it is: "ViT/4 (depth 4, width 128,
    4 heads, MLP 256)" rather than the variant it was derived from."""
    if isinstance(config, ViTConfig):
        stem = f"R{sum(config.resnet.layers) * 3 + 2}+" if config.resnet is not None and config.resnet.layers else (
            "R+" if config.resnet is not None else "")
        gap = ", GAP" if config.classifier == "gap" else ""
        return (f"{stem}ViT/{config.total_stride} (depth {config.depth}, width {config.width}, {config.num_heads} "
                f"heads, MLP {config.mlp_dim}{gap})")
    return f"BiT ResNetV2 (units per stage {list(config.layers)}, width ×{config.width_factor})"


def vitlab_name(config: ViTConfig) -> str:
    """The registry name ("ViT-B/16", "R50+ViT-B/16") when the architecture is one, else ""."""
    size = next((s for s, dims in VIT_SIZES.items()
                 if dims == (config.depth, config.width, config.mlp_dim, config.num_heads)), None)  # fmt: skip
    if size is None:
        return ""
    if config.resnet is None:
        return f"ViT-{size}/{config.patch_size}" + ("-gap" if config.classifier == "gap" else "")
    hybrid = (size, config.resnet.layers, config.patch_size)
    match = [n for n, spec in HYBRIDS.items() if spec == hybrid and config.resnet.width_factor == 1]
    return match[0] if match and config.classifier == "token" else ""


def bit_name(config: BiTConfig) -> str:
    """The registry name ("BiT-R50x1") of a BiT config whose stages and width are a listed variant, else ""."""
    depth = next((d for d, layers in RESNET_DEPTHS.items() if layers == config.layers), None)
    name = f"BiT-R{depth}x{config.width_factor}"
    return name if depth is not None and name in variant_names() and config.in_chans == 3 else ""


# What a variant's name fixes about its weights' shapes and computation; representation layer, GELU form,
# LayerNorm epsilon, head size, resolution and regularisation are not in the name.
_NAMED_FIELDS = {ViTConfig: ("patch_size", "width", "depth", "mlp_dim", "num_heads", "classifier", "pos_embed",
                             "qkv_bias", "in_chans", "resnet"),
                 BiTConfig: ("layers", "width_factor", "in_chans")}


def architecture_differences(expected: ModelConfig, got: ModelConfig) -> list[str]:
    """How `got` differs from the architecture `expected` describes ("depth 4, not 12"); [] when they are the
    same network (a head, a resolution or a representation layer of its own do not count)."""
    if type(expected) is not type(got):
        kinds = {ViTConfig: "a ViT", BiTConfig: "a BiT ResNetV2"}
        return [f"{kinds[type(got)]}, not {kinds[type(expected)]}"]
    return [f"{name} {getattr(got, name)}, not {getattr(expected, name)}" for name in _NAMED_FIELDS[type(expected)]
            if getattr(got, name) != getattr(expected, name)]


def build_model(config: ModelConfig) -> nn.Module:
    """The model a config describes, freshly initialised. The model classes are imported here, not at the top, so
    that the table above is read (`vitlab --help`, `vitlab models`) without importing torch."""
    from vitlab.models.bit import BiT
    from vitlab.models.vit import VisionTransformer

    check_blocks(config)  # before a million blocks are built
    return VisionTransformer(config) if isinstance(config, ViTConfig) else BiT(config)
