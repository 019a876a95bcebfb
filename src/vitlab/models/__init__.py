from vitlab.models.bit import BiT
from vitlab.models.config import BiTConfig, ResNetConfig, ViTConfig, config_from_dict
from vitlab.models.flops import count_macs
from vitlab.models.registry import build_model, describe_architecture, model_config, variant_names
from vitlab.models.vit import VisionTransformer

__all__ = [
    "BiT", "BiTConfig", "ResNetConfig", "ViTConfig", "VisionTransformer",
    "build_model", "config_from_dict", "count_macs", "describe_architecture", "model_config", "variant_names",
]
