"""The numerics an official `.npz` cannot say, recorded beside its tensors so that vitlab reads them back.

The official code computes with tanh-approximated GELU and LayerNorm eps 1e-6, and its files hold tensors only.
A timm or Hugging Face ViT (exact GELU; transformers' eps 1e-12) exported to .npz would read back with the
official numerics: a 2.9e-4 relative change of the logits for ViT-S/16, silently. When a model's numerics differ
from the official ones, the writer adds one 0-d array per differing field under `vitlab/` ("vitlab/gelu": the
string "exact"; "vitlab/ln_eps": a float64). The official loader (vit_jax `load_pretrained`: extra keys are
logged and dropped) and timm's `_load_weights` (it reads the names it knows) ignore them; vitlab's reader applies
them. A file with official numerics gets no extra array: its layout stays exactly the official one.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from vitlab.errors import WeightsError
from vitlab.models.config import ViTConfig

OFFICIAL = {"gelu": "tanh", "ln_eps": 1e-6}
KEYS = {"gelu": "vitlab/gelu", "ln_eps": "vitlab/ln_eps"}
_FIX = "export the file again with vitlab, or delete the vitlab/ arrays to read it with the official numerics"


def numerics_arrays(config: ViTConfig) -> dict[str, np.ndarray]:
    """The `vitlab/` arrays recording the fields of `config` that differ from the official numerics."""
    out = {}
    if config.gelu != OFFICIAL["gelu"]:
        out[KEYS["gelu"]] = np.array(config.gelu)  # a 0-d unicode array: np.load reads it without pickle
    if config.ln_eps != OFFICIAL["ln_eps"]:
        out[KEYS["ln_eps"]] = np.array(config.ln_eps, dtype=np.float64)
    return out


def pop_numerics(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The recorded numerics as ViTConfig fields (removed from `arrays`), the official values for fields not
    recorded; WeightsError for a record that is not a valid value."""
    fields: dict[str, Any] = dict(OFFICIAL)
    if (gelu := arrays.pop(KEYS["gelu"], None)) is not None:
        if gelu.ndim != 0 or gelu.dtype.kind != "U" or str(gelu) not in ("exact", "tanh"):
            raise WeightsError(path, f"{KEYS['gelu']} is {_describe_array(gelu)}, expected 'exact' or 'tanh'", _FIX)
        fields["gelu"] = str(gelu)
    if (eps := arrays.pop(KEYS["ln_eps"], None)) is not None:
        if eps.ndim != 0 or eps.dtype.kind != "f" or not (math.isfinite(float(eps)) and float(eps) > 0):
            raise WeightsError(path, f"{KEYS['ln_eps']} is {_describe_array(eps)}, expected a positive float", _FIX)
        fields["ln_eps"] = float(eps)
    return fields


def _describe_array(a: np.ndarray) -> str:
    return f"{a.dtype} {a.shape}" if a.ndim else f"{a.item()!r} ({a.dtype})"
