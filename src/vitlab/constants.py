"""The evaluation resizes by name and big_vision's resize-before-crop rule, defined once: data/transforms.py
applies them, models/timm_compat.py describes them to timm (pretrained_cfg), model cards state them. A bottom
module because the data and model layers may not import each other."""

from __future__ import annotations

EVAL_RESIZES = ("official", "big_vision", "resize-short-crop")
FEWSHOT_RESIZE = "fewshot"  # big_vision common_fewshot; an eval resize may be used for few-shot instead


def resize_before_crop(size: int) -> int:
    """The side an image is resized to before a central crop of `size` (big_vision: resize_small(256) then
    central_crop(224); transfer: 448 then 384). Other sizes keep the ratio 8/7."""
    return 448 if size == 384 else round(size * 8 / 7)
