"""Self-supervised pre-training: the paper's masked patch prediction."""

from vitlab.selfsup.mpp import MaskedPatchPredictor, MPPConfig, corrupt_patches, mean_color_targets

__all__ = ["MPPConfig", "MaskedPatchPredictor", "corrupt_patches", "mean_color_targets"]
