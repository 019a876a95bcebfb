"""Reading and writing weights in every supported format: `read_weights` (a WeightsRecord: config and state dict),
`detect_format` and the error every reader raises; a model from weights is `vitlab.load`. The format modules are
private: `read_weights` decides the format once."""

from vitlab.errors import WeightsError
from vitlab.lazy import lazy_names

# read on first use: a format reader imports the package, so the package may not import the readers eagerly
_LAZY = {"read_weights": "load", "detect_format": "load", "WeightsRecord": "record",
         "to_timm_state_dict": "timm", "to_timm_bit_state_dict": "timm_bit"}


__getattr__ = lazy_names(__name__, _LAZY, globals())


__all__ = ["WeightsError", "WeightsRecord", "detect_format", "read_weights", "to_timm_bit_state_dict",
           "to_timm_state_dict"]
