"""Constants more than one layer uses, defined once: the input normalisations published weights expect, the
evaluation resizes (vitlab's by name and timm's transform in one spelling), training crops and fine-tuning freezes by
name and big_vision's resize-before-crop rule (data/transforms.py applies them, models/timm_compat.py describes them
to timm, model cards state them, the command line offers them as choices). A bottom module because the data, model
and weights layers may not import each other, and `vitlab --help` reads it without importing torch."""

from __future__ import annotations

import math

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
# How a ViT's attention computes (vitlab.models.attention): torch's fused kernel, or explicit matmuls.
ATTENTION_FORMS = ("flash", "matmul")
SETTING_CHOICES: dict[str, tuple[str, ...]] = {
    "optimizer": ("adam", "sgd"), "decay": ("linear", "cosine", "step"), "loss": ("softmax", "sigmoid"),
    "objective": ("classify", "mpp"), "mpp_target": ("mean-color", "mean-color-4x4", "pixels"),
    "train_crop": TRAIN_CROPS, "train_resize": TRAIN_RESIZES, "eval_resize": EVAL_RESIZES,
    "attention": ("auto", *ATTENTION_FORMS),
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


# Where bf16 was measured to gain on a CPU that computes it natively, per use: `auto` picks bf16 for a model that
# meets every bound of any one region (vitlab.runtime.precision; the measurements in BENCHMARKS.md, "bf16 on a CPU
# that computes it natively"). Bounds are least values: the model's width, a ViT's tokens per image (prefix
# included) and head dim; a model without attention (a BiT) is bound by its width alone.
BF16_GAINS: dict[str, tuple[dict[str, int], ...]] = {
    "infer": ({"width": 160}, {"width": 128, "tokens": 50}),
    "train": ({"width": 256, "head_dim": 64}, {"width": 160, "head_dim": 64, "tokens": 50},
              {"width": 64, "tokens": 197}),
}
SHAPE_WORDS = {"width": "width {}", "head_dim": "head dim {}", "tokens": "{} tokens per image"}  # as messages say them
# Where `--attention auto` trains with explicit bf16 matmuls (vitlab.models.attention, "matmul") instead of torch's
# flash kernel: a region names the CPU flag it needs and the least tokens per image, head dim and batch; bf16 only.
# The region: every shape measured with avx512_bf16 (which the AMX Xeons have too), from 17 tokens, head dim 32 and
# batch 8, where the form trains as well as flash (BENCHMARKS.md "Training attention": the demo, a fine-tune and a
# 1,000-step ViT-S/16 at 224 px).
MATMUL_ATTENTION_GAINS: tuple[dict[str, int | str], ...] = (
    {"cpu_flag": "avx512_bf16", "tokens": 17, "head_dim": 32, "batch": 8},
)

# Where `compile auto` compiles an inference run (vitlab.runtime.compiling): a region names the precision the session
# computes in on a CPU, the least model width and the least number of images the run will process. The count is
# the measured crossing (images after which frozen compiling has repaid its seconds, cache warm) doubled, since a
# cold Inductor cache compiles about twice as long (BENCHMARKS.md "Frozen compiled inference"). Shapes not listed
# are unmeasured and stay eager.
COMPILE_PAYS_OFF: tuple[dict[str, int | str], ...] = ({"precision": "bf16", "width": 768, "images": 2_600},)


def bf16_gains_text(use: str) -> str:
    """`BF16_GAINS[use]` in words, for the help: "width >= 160, or width >= 128 and >= 50 tokens per image"."""
    return ", or ".join(" and ".join(SHAPE_WORDS[key].format(f">= {least}") for key, least in region.items())
                        for region in BF16_GAINS[use])

# timm's evaluation transform as an eval resize: "timm:INTERPOLATION:CROP_PCT[:squash]" (timm_resize parses it).
TIMM_RESIZE_PREFIX = "timm:"
TIMM_INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "lanczos", "box", "hamming")
TIMM_CROP_MODES = ("center", "squash")
# timm's crop_pct: the central crop's share of the side the image is resized to (published weights: 0.875 to 1).
# Below 0.5 the resize reaches more than twice the model's side: a tampered setting, not a preprocessing.
TIMM_CROP_PCT = (0.5, 1.0)


def resize_before_crop(size: int) -> int:
    """The side an image is resized to before a central crop of `size` (big_vision: resize_small(256) then
    central_crop(224); transfer: 448 then 384). Other sizes keep the ratio 8/7."""
    return 448 if size == 384 else round(size * 8 / 7)


def timm_resize(eval_resize: str) -> tuple[str, float, str] | None:
    """(interpolation, crop_pct, crop_mode) of an eval resize spelled "timm:INTERPOLATION:CROP_PCT" (crop_mode
    "center") or "timm:INTERPOLATION:CROP_PCT:squash", as timm's pretrained cfg states them; None for vitlab's own
    resizes. One spelling, parsed here only, so that it travels as the string every eval resize is (checkpoint
    meta, ONNX metadata, cards); ValueError for a malformed one."""
    if not eval_resize.startswith(TIMM_RESIZE_PREFIX):
        return None
    parts = eval_resize[len(TIMM_RESIZE_PREFIX):].split(":")
    interpolation, pct, mode = [*parts, "center"] if len(parts) == 2 else parts if len(parts) == 3 else ["", "", ""]
    try:
        crop_pct = float(pct)
    except ValueError:
        crop_pct = math.nan
    if interpolation not in TIMM_INTERPOLATIONS or mode not in TIMM_CROP_MODES or not (
            TIMM_CROP_PCT[0] <= crop_pct <= TIMM_CROP_PCT[1]):
        raise ValueError(f"eval resize {eval_resize!r} is not timm:INTERPOLATION:CROP_PCT[:squash] with an "
                         f"interpolation of {', '.join(TIMM_INTERPOLATIONS)} and {TIMM_CROP_PCT[0]:g} <= CROP_PCT <= "
                         f"{TIMM_CROP_PCT[1]:g} "
                         "(e.g. timm:bicubic:0.9)")
    return interpolation, crop_pct, mode


def timm_resize_name(interpolation: str, crop_pct: float, crop_mode: str = "center") -> str:
    """The eval resize of timm's transform fields: "official" for (bilinear, 1.0, squash), which is that same
    resize of the whole image, else "timm:INTERPOLATION:CROP_PCT" (":squash" added for that crop mode)."""
    if (interpolation, float(crop_pct), crop_mode) == ("bilinear", 1.0, "squash"):
        return "official"
    name = f"{TIMM_RESIZE_PREFIX}{interpolation}:{float(crop_pct)!r}" + (":squash" if crop_mode == "squash" else "")
    timm_resize(name)  # the same checks as a spelled one
    return name


def check_eval_resize(eval_resize: str, fewshot: bool = True) -> str:
    """`eval_resize` if it is one of EVAL_RESIZES (or FEWSHOT_RESIZE, where `fewshot`) or a timm spelling, else
    ValueError in one line naming the choices."""
    own = (*EVAL_RESIZES, FEWSHOT_RESIZE) if fewshot else EVAL_RESIZES
    if not isinstance(eval_resize, str) or (eval_resize not in own and timm_resize(eval_resize) is None):
        raise ValueError(f"unknown eval resize {eval_resize!r}; use one of {', '.join(own)} or timm's "
                         "timm:INTERPOLATION:CROP_PCT[:squash] (e.g. timm:bicubic:0.9)")
    return eval_resize


# Help phrases the training settings and other verbs' flags share (the command line reads them; no torch here).
DATA_SOURCES = ("embedded digits or mnist (NAME:K: K training images per class), "
                "fractal:C:N[:SEED] (FractalDB, C categories x N images), "
                "strokes:C:N[:SEED] (pen-stroke glyphs, C classes x N images), fonts:C:N[:SEED] (characters "
                "in matplotlib's fonts, C <= 76), an image folder "
                "root/[train|val]/<class>/, WebDataset shards (a folder with _info.json or of .tar files, or a "
                "pattern train-{000000..000099}.tar) or a Hugging Face dataset (save_to_disk folder or Parquet; "
                "append '#image=COL,label=COL' to pick columns)")
PRECISION_HELP = (f"auto (default: bf16 on CUDA, and on CPUs with AMX/AVX512-BF16 where it was measured to gain: in "
                  f"inference at {bf16_gains_text('infer')}; in training at {bf16_gains_text('train')}; else float32; "
                  "see docs/deployment.md, 'Precision'), fp32 or bf16")
EVAL_RESIZE_HELP = ("evaluation pre-processing: official (whole image to the input size, aspect ignored; vit_jax), "
                    "big_vision (short side to 8/7 of it: 256 for 224, 448 for 384; central crop), "
                    "resize-short-crop (short side to the input size, central crop)")
