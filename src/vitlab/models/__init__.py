from vitlab.models.bit import BiT
from vitlab.models.config import BiTConfig, ResNetConfig, ViTConfig, config_from_dict
from vitlab.models.registry import build_model, create_model, list_models, model_config
from vitlab.models.vit import VisionTransformer

__all__ = [
    "BiT", "BiTConfig", "ResNetConfig", "ViTConfig", "VisionTransformer",
    "build_model", "config_from_dict", "create_model", "list_models", "model_config",
]
