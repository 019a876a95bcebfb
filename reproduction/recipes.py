"""Pre-processing and regularisation fitted to the data and the model size, as data with their reasons."""

from __future__ import annotations

from typing import Any

# 8×8-pixel digits upsampled to 32 px: a 5% inception crop of them is a blur and digits are not mirror-symmetric
# (the demo recipe's reasoning), so crops keep half the area, with sub-pixel boxes, and no flip.
DIGITS_PREPROCESSING = {"train_crop": "inception-subpixel", "crop_scale": [0.5, 1.0], "flip": False}


# Pre-training at this scale (Steiner et al. 2021, "How to train your ViT?": small models on small data want light
# augmentation and regularisation). Crops keep at least half the image (a 5 % crop of a 32-px fractal or glyph is a
# shapeless texture while validation sees the whole image), no dropout, weight decay 0.05 instead of the paper's
# i1k 0.1 and 0.3. Probes before the pilot's design found these; its ablation (experiments/pilot.py) tests each factor.
PRETRAIN_SMALL = {"train_crop": "inception-subpixel", "crop_scale": [0.5, 1.0], "dropout": 0.0, "weight_decay": 0.05}


# Fractal instances are drawn flipped already (a flip is one more instance of the category); a flipped glyph is
# another glyph, so stroke and font glyphs are not flipped, as digits are not.
SOURCE_PREPROCESSING = {"fractal": {"flip": True}, "strokes": {"flip": False}, "fonts": {"flip": False}}


def source_preprocessing(data: str) -> dict[str, Any]:
    """The pre-processing a pre-training source's kind asks for ('strokes:64:1024' -> strokes')."""
    return SOURCE_PREPROCESSING[data.split(":")[0]]


# The pilot's recipe ablation (experiments/pilot.py): overrides of PRETRAIN_SMALL, one factor at a time from the
# paper's i1k recipe (crops 5-100 %, dropout 0.1, weight decay 0.3). The pilot's rule picks one per source (best
# upstream top-1); `Scale.recipe` names the one the full experiments pre-train their source with.
ABLATION = {
    "paper i1k": {"crop_scale": [0.05, 1.0], "dropout": 0.1, "weight_decay": 0.3},
    "object-keeping crops": {"crop_scale": [0.5, 1.0], "dropout": 0.1, "weight_decay": 0.3},
    "light regularisation": {"crop_scale": [0.05, 1.0], "dropout": 0.0, "weight_decay": 0.05},
    "both (PRETRAIN_SMALL)": {},
}

