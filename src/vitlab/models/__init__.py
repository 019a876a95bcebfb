"""Model families (ViT and its hybrids, BiT), their configs, the named-variant table and their analytic cost. The
configs, the table and the cost are plain data, importable without torch; the model classes are read on first
use, so that `vitlab --help` and `vitlab models` do not pay for torch."""

from vitlab.lazy import lazy_names
from vitlab.models.config import BiTConfig, ResNetConfig, ViTConfig, config_from_dict
from vitlab.models.flops import count_macs, count_parameters
from vitlab.models.registry import build_model, describe_architecture, model_config, variant_names

_LAZY = {"BiT": "bit", "VisionTransformer": "vit", "attend": "attention", "set_attention_form": "attention",
         "eval_resize_of": "timm_compat", "memory_plan": "memory"}


__getattr__ = lazy_names(__name__, _LAZY, globals())


__all__ = [
    "BiT", "BiTConfig", "ResNetConfig", "ViTConfig", "VisionTransformer", "build_model", "config_from_dict",
    "attend", "count_macs", "count_parameters", "describe_architecture", "eval_resize_of", "memory_plan",
    "model_config", "set_attention_form", "variant_names",
]
