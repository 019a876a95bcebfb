"""Constants more than one layer uses, defined once: the input normalisations published weights expect, the
evaluation resizes, training crops and fine-tuning freezes by name and big_vision's resize-before-crop rule
(data/transforms.py applies them, models/timm_compat.py describes them to timm, model cards state them, the command
line offers them as choices). A bottom module because the data, model and weights layers may not import each other,
and `vitlab --help` reads it without importing torch."""

from __future__ import annotations

# Pixel normalisation the official weights expect: x/255 mapped to [-1, 1] == (x - 0.5) / 0.5.
OFFICIAL_MEAN = (0.5, 0.5, 0.5)
OFFICIAL_STD = (0.5, 0.5, 0.5)
# torchvision's ImageNet statistics: timm's and transformers' default for ImageNet-trained weights.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# BitImageProcessor's class defaults (OpenAI CLIP's statistics), for a preprocessor_config.json without them.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

EVAL_RESIZES = ("official", "big_vision", "resize-short-crop")
FEWSHOT_RESIZE = "fewshot"  # big_vision common_fewshot; an eval resize may be used for few-shot instead
TRAIN_CROPS = ("inception", "inception-subpixel", "resize-random-crop")
TRAIN_RESIZES = ("pil", "tensor")  # what resamples a training crop: PIL, or torch's uint8 kernel
FREEZE_CHOICES = ("backbone",)  # backbone: everything but the classifier (head, and pre_logits when there is one)
# Training settings whose value is one of a few words: TrainConfig is checked against them, the flags offer them.
SETTING_CHOICES: dict[str, tuple[str, ...]] = {
    "optimizer": ("adam", "sgd"), "decay": ("linear", "cosine", "step"), "loss": ("softmax", "sigmoid"),
    "objective": ("classify", "mpp"), "mpp_target": ("mean-color", "mean-color-4x4", "pixels"),
    "train_crop": TRAIN_CROPS, "train_resize": TRAIN_RESIZES, "eval_resize": EVAL_RESIZES,
}
# Other spellings a setting accepts for one of its words, replaced by that word as the settings are read (so a run
# records one spelling): vitlab's adam already decouples weight decay, which is what other libraries call AdamW.
SETTING_ALIASES: dict[str, dict[str, str]] = {"optimizer": {"adamw": "adam"}}


def setting_words(key: str) -> tuple[str, ...]:
    """Every word setting `key` accepts: its choices, then their other spellings."""
    return SETTING_CHOICES[key] + tuple(SETTING_ALIASES.get(key, ()))


def canonical_setting(key: str, value: object) -> object:
    """`value` of setting `key` in the one spelling a run records (`adamw` -> `adam`); anything else unchanged."""
    return SETTING_ALIASES.get(key, {}).get(value, value) if isinstance(value, str) else value


def resize_before_crop(size: int) -> int:
    """The side an image is resized to before a central crop of `size` (big_vision: resize_small(256) then
    central_crop(224); transfer: 448 then 384). Other sizes keep the ratio 8/7."""
    return 448 if size == 384 else round(size * 8 / 7)
