"""Every training setting, declared once: `TrainConfig`'s fields, each with its type, default, range or choices,
help, group, flag spelling and verbs (a `Setting` in the field's metadata), and the few settings that are flags
only (`--epochs`, the architecture flags). Everything else is read from here: the flags of `vitlab train` /
`finetune` (vitlab.cli.train), the checks of every value however it arrived (vitlab.train.config.validate),
`vitlab.fit`'s keywords and their did-you-mean, a `--config` file's keys, the CLI reference page, and the words a
message uses for a setting (`Setting.spelled`: the flag on the command line, the keyword in Python).

To add a setting: a field here with its `setting(...)`, and the code that uses it. Torch-free: `vitlab --help`
builds the parsers from this module.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from vitlab.constants import (
    DATA_SOURCES,
    EVAL_RESIZE_HELP,
    FREEZE_CHOICES,
    PRECISION_HELP,
    setting_words,
)
from vitlab.errors import setting as spell
from vitlab.ranges import (
    BATCH_SIZE,
    BELOW_ONE,
    CLASS_COUNT,
    EPOCHS,
    FRACTION,
    IMAGE_SIZE,
    LEARNING_RATE,
    MAX_COUNT,
    MAX_RANDAUG_OPS,
    MAX_WIDTH,
    MAX_WORKERS,
    MODEL_SIZES,
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    PROBABILITY,
    SEED,
    Range,
    float_range,
    int_range,
)
from vitlab.train.recipes import DEFAULT_RECIPE, FINETUNE_PRESETS, RECIPES, describe

VERBS = ("train", "finetune")
PROTOCOL = "fine-tuning protocol (paper Appendix B.1.1, Table 4)"
# The flag groups of `--help`, in order (None: the verb's own options, first).
GROUPS = (None, "data", "model", "optimisation", "fine-tuning tools", "tracking", "run", PROTOCOL)


@dataclass(frozen=True)
class Setting:
    """One training setting as every reader needs it. `name` is the TrainConfig field, the `vitlab.fit` keyword and
    the config.json key; `flag` the command line's spelling after `--` where it differs from the name with dashes
    (None: no flag); `aliases` more spellings of that flag. `range` (each element's, for a tuple) or `choices`
    bound the value; `parse` names a flag parser of its own ("device", "precision", "words", "learning rates",
    "resume") for a value that is neither. `shape` says what a tuple's elements must be together, `rule` checks it.
    `model_field`: an architecture flag's field in model_args. `type` and `default` come from the field."""

    help: str | Callable[[str], str] = ""  # a callable takes the verb
    group: str | None = None
    range: Range | None = None
    choices: tuple[str, ...] | None = None
    flag: str | None = ""  # "": the name with dashes
    aliases: tuple[str, ...] = ()
    verbs: tuple[str, ...] = VERBS
    metavar: str | None = None
    nargs: int | str | None = None
    const: Any = None
    parse: str | None = None
    negation: str | None = None  # a switch's `--no-…` flag and its help
    shape: str | None = None
    rule: Callable[[Any], bool] | None = None
    model_field: str | None = None
    after: str | None = None  # a flag-only setting: the setting its flag follows in --help
    name: str = ""
    type: Any = None
    default: Any = None

    @property
    def option(self) -> str | None:
        """The flag as typed (`--wd`), or None for a setting without one."""
        if self.flag is None:
            return None
        return "--" + (self.flag or self.name.replace("_", "-"))

    @property
    def keyword(self) -> str:
        """The setting as `vitlab.fit` takes it (an architecture flag's own name: heads)."""
        return self.name

    def spelled(self, value: Any = None) -> str:
        """The setting (with `value`) as the caller spells it: its flag on the command line (the spelling that is
        its name, where one is: --ema, not --ema-decay), its keyword inside a `vitlab.errors.keyword_errors` call
        (`--wd 0.1` / `weight_decay=0.1`)."""
        own = self.name.replace("_", "-")
        flag = own if self.option is None or own in self.aliases else self.option[2:]
        return spell(self.name, flag, value)

    def help_for(self, verb: str) -> str:
        return self.help(verb) if callable(self.help) else self.help


def setting(default: Any = dataclasses.MISSING, *, factory: Callable[[], Any] | None = None, **declared: Any) -> Any:
    """A TrainConfig field declared with its Setting (the keywords of `Setting`)."""
    meta = {"setting": Setting(**declared)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _min_max(v: Any) -> bool:
    return v[0] <= v[1]


def _increasing(v: Any) -> bool:
    return all(a < b for a, b in zip(v, v[1:], strict=False))


def _preset_help(verb: str) -> str:
    return ("per-dataset settings over the recipe (flags still win): "
            + "; ".join(describe(name) for name in FINETUNE_PRESETS).replace("%", "%%"))


_RGB = "three numbers (R, G, B)"
_MIN_MAX = "MIN MAX with MIN <= MAX"
_BETA = "a Beta(α, α) parameter; 0: off"


@dataclass(frozen=True)
class TrainConfig:
    """A run's settings, each declared with its range, help and flag (module doc)."""

    recipe: str = setting(
        "demo", choices=tuple(sorted(RECIPES)),
        help=lambda verb: (f"the paper's settings to start from (default {DEFAULT_RECIPE[verb]}; `vitlab recipes` "
                           "lists their values and sources)"))
    # data
    data: str = setting("digits", help=DATA_SOURCES, group="data")  # an embedded dataset or an image folder …
    val_fraction: float | None = setting(None, range=FRACTION, group="data",
                                         help="hold out this fraction of train for validation")
    strict: bool = setting(False, group="data", help="unreadable images are fatal")
    num_classes: int | None = setting(None, range=CLASS_COUNT, group="data",
                                      help="expected class count (checked against the data)")
    workers: int | None = setting(None, range=int_range(0, MAX_WORKERS, note="0: load in the training process"),
                                  group="data", help="data-loading processes (default: CPUs - 1; on CPU at most 8)")
    # model
    model: str = setting("ViT-B/16", group="model", help="variant name, e.g. ViT-B/16 (`vitlab models`)")
    model_args: dict[str, Any] = setting(factory=dict, flag=None)  # config overrides: depth, width, num_heads, …
    init: str | None = setting(None, verbs=("finetune",), metavar="WEIGHTS",
                               help="weights file or folder to start from (required; --resume of a run may leave it "
                                    "out: the run records it)")
    image_size: int = setting(224, range=IMAGE_SIZE, group="model", help="training resolution")
    dropout: float | None = setting(None, range=BELOW_ONE, group="model",  # None: the model's (init weights) value
                                    help="dropout after the position embedding and each Dense (fine-tuning: the "
                                         "official model config's)")
    representation_size: int | None = setting(
        None, range=int_range(0, MAX_WIDTH, note="0: none"), group="model", metavar="N",
        help="`pre_logits` Dense(N) + tanh before the head of a model built from scratch (0: none; pre-training "
             "recipes: the model's width)")
    mean: tuple[float, float, float] | None = setting(None, range=float_range(-10.0, 10.0), shape=_RGB, nargs=3,
                                                      group="model",
                                                      help="input mean (default: what the weights expect)")
    std: tuple[float, float, float] | None = setting(None, range=float_range(0.0, 10.0, low_open=True), shape=_RGB,
                                                     nargs=3, group="model", help="input std")
    # optimisation
    optimizer: Literal["adam", "sgd"] = setting(
        "adam", choices=setting_words("optimizer"), group="optimisation",
        help="adam (decoupled weight decay, i.e. AdamW; pre-training) or sgd with momentum (fine-tuning); adamw is "
             "accepted and recorded as adam")
    lr: float = setting(1e-3, range=LEARNING_RATE, group="optimisation", help="base learning rate")
    weight_decay: float = setting(0.0, range=LEARNING_RATE, flag="wd", group="optimisation",  # on kernels only
                                  help="decoupled weight decay")
    betas: tuple[float, float] = setting((0.9, 0.999), range=BELOW_ONE, shape="two numbers", nargs=2,
                                         group="optimisation", help="Adam betas")
    momentum: float = setting(0.9, range=BELOW_ONE, group="optimisation", help="SGD momentum")
    warmup: int = setting(0, range=NON_NEGATIVE_INT, group="optimisation", help="linear warm-up steps")
    decay: Literal["linear", "cosine", "step"] = setting(
        "linear", choices=setting_words("decay"), group="optimisation",
        help="after warm-up: linear (to --linear-end), cosine (to 0), or step (x0.1 at --lr-drops)")
    linear_end: float = setting(0.0, range=LEARNING_RATE, group="optimisation",  # vit_jax `linear_end`
                                help="LR at the end of linear decay (official pre-training: 1e-5)")
    lr_drops: tuple[float, ...] = setting(
        (0.3, 0.6, 0.9), range=FRACTION, shape="increasing fractions", rule=_increasing, nargs="*", metavar="F",
        group="optimisation",
        help="step decay: fractions of --steps after which the LR drops x0.1 (BiT-HyperRule 0.3 0.6 0.9)")
    grad_clip: float = setting(1.0, range=float_range(0.0, 1e6, note="0: off"), flag="clip", group="optimisation",
                               help="global gradient-norm clipping (0: off)")
    objective: Literal["classify", "mpp"] = setting(
        "classify", choices=setting_words("objective"), group="optimisation",
        help="classify (default) or mpp: masked patch prediction, self-supervised (recipe mpp)")
    mpp_target: Literal["mean-color", "mean-color-4x4", "pixels"] = setting(
        "mean-color", choices=setting_words("mpp_target"), group="optimisation",
        help="mpp: 3-bit mean colour (paper), its 4x4 downsized variant, or L2 on the pixels")
    loss: Literal["softmax", "sigmoid"] = setting(
        "softmax", choices=setting_words("loss"), group="optimisation",
        help="softmax cross-entropy, or sigmoid cross-entropy summed over classes (upstream pre-training)")
    head_bias_init: float = setting(0.0, range=float_range(-100.0, 100.0), metavar="B", group="optimisation",
                                    help="initial classifier bias of a model built from scratch (pre-training "
                                         "recipes: -10)")
    label_smoothing: float = setting(0.0, range=BELOW_ONE, group="optimisation",
                                     help="label smoothing in [0, 1) (the paper: 0)")
    batch_size: int = setting(4096, range=BATCH_SIZE, group="optimisation",
                              help="global batch size (all processes, all accumulation steps)")
    accum: int = setting(1, range=BATCH_SIZE, group="optimisation", help="gradient accumulation steps")
    steps: int = setting(1000, range=POSITIVE_INT, group="optimisation", help="optimiser steps")
    ema: float | None = setting(None, range=FRACTION, flag="ema-decay", aliases=("ema",), metavar="D",
                                group="fine-tuning tools",
                                help="EMA of the weights (timm ModelEmaV3): validation, best.safetensors and "
                                     "model.safetensors hold them, e.g. 0.9998")
    ema_warmup: bool = setting(False, group="fine-tuning tools",
                               help="warm the EMA decay up as timm does: min(D, 1 - k^(-2/3)) at update k")
    # fine-tuning tools (vitlab.train.optim, vitlab.train.finetune)
    layer_decay: float | None = setting(
        None, range=float_range(0.0, 1.0, low_open=True), metavar="F", group="fine-tuning tools",
        help="layer-wise lr decay (BEiT/MAE/timm): the head at --lr, block i of L at lr * F^(L - i), the embeddings "
             "at lr * F^(L + 1); e.g. 0.75")
    freeze: str | None = setting(
        None, choices=FREEZE_CHOICES, group="fine-tuning tools",
        help="backbone: train the classifier only (head, and pre_logits if any), a linear probe; the backbone runs "
             "without dropout")
    lora_rank: int = setting(
        0, range=int_range(0, MAX_COUNT, note="0: off"), flag="lora", metavar="RANK", group="fine-tuning tools",
        help="LoRA adapters of this rank on the blocks' Linear layers, via peft (pip install 'vitlab[lora]'); the "
             "head trains too, the rest is frozen; saved weights are merged")
    lora_alpha: float | None = setting(None, range=float_range(0.0, 1e6, low_open=True), metavar="A",
                                       group="fine-tuning tools",
                                       help="LoRA alpha: the adapters are scaled by A / RANK (default RANK: scale 1)")
    lora_targets: tuple[str, ...] = setting(
        ("qkv",), parse="words", metavar="qkv,proj,...", group="fine-tuning tools",
        help="the Linear layers of each block LoRA adapts: qkv, proj, fc1, fc2 (default qkv)")
    mixup: float = setting(0.0, range=float_range(0.0, 100.0, note=_BETA), metavar="ALPHA", group="optimisation",
                           help="MixUp: λ ~ Beta(α, α) per step (BiT-HyperRule: 0.1 above 20k images); 0: off")
    cutmix: float = setting(
        0.0, range=float_range(0.0, 100.0, note=_BETA), metavar="ALPHA", group="optimisation",
        help="CutMix: a box of 1 - λ of the image from another, λ ~ Beta(α, α), labels mixed by its pixels (DeiT: "
             "1.0); with --mixup, each step is one of the two at random; 0: off")
    randaug_ops: int = setting(0, range=int_range(0, MAX_RANDAUG_OPS, note="0: off"), metavar="N",
                               group="optimisation",
                               help="RandAugment: operations per image (AugReg, DeiT: 2; torchvision's RandAugment); "
                                    "0: off")
    randaug_magnitude: float = setting(
        0.0, range=float_range(0.0, 20.0, note="TF's RandAugment levels: 10 is the operations' maximum"),
        metavar="M", group="optimisation",
        help="RandAugment level on TF's 0-10 scale, to 20 (AugReg 0/10/15/20, DeiT 9)")
    randaug_mstd: float = setting(0.0, range=float_range(0.0, 20.0), metavar="STD", group="optimisation",
                                  help="per-image standard deviation of the RandAugment level (DeiT: 0.5)")
    random_erasing: float = setting(0.0, range=PROBABILITY, metavar="P", group="optimisation",
                                    help="probability of replacing one random box of the image with noise (DeiT: "
                                         "0.25)")
    drop_path_rate: float | None = setting(
        None, range=BELOW_ONE, metavar="RATE", group="model",
        help="stochastic depth: the last block's residual branches are dropped with this probability, linearly less "
             "in earlier blocks (DeiT: 0.1; AugReg: 0 or 0.1)")
    # fine-tuning protocol (paper Appendix B.1.1, Table 4): vitlab.train.recipes and vitlab.train.sweep
    preset: str | None = setting(None, choices=tuple(FINETUNE_PRESETS), verbs=("finetune",), group=PROTOCOL,
                                 help=_preset_help)
    lr_sweep: tuple[float, ...] = setting(
        (), range=float_range(0.0, 100.0, low_open=True), shape="learning rates", parse="learning rates",
        metavar="LR,LR,...", verbs=("finetune",), group=PROTOCOL,
        help="fine-tune once per learning rate on train minus the dev split, choose the best on dev, report its test "
             "(val split) accuracy; writes sweep.json and sweep.png in --out")
    dev_fraction: float | None = setting(
        None, range=FRACTION, verbs=("finetune",), group=PROTOCOL,
        help="share of each training class held out as the sweep's dev split (paper: 0.02 CIFAR, 0.1 Pets/Flowers, "
             "0.01 ImageNet)")
    refit: bool = setting(False, verbs=("finetune",), group=PROTOCOL,
                          help="after the sweep, fine-tune the chosen lr on all of train (the paper's final runs)")
    # augmentation (official vit_jax input_pipeline: inception crop 5%-100% + flip)
    crop_scale: tuple[float, float] = setting(
        (0.05, 1.0), range=float_range(0.0, 1.0, low_open=True), shape=_MIN_MAX, rule=_min_max, nargs=2,
        metavar=("MIN", "MAX"), group="data", help="inception-crop area range")
    crop_ratio: tuple[float, float] = setting((3 / 4, 4 / 3), range=float_range(0.0, 100.0, low_open=True),
                                              shape=_MIN_MAX, rule=_min_max, flag=None)
    flip: bool = setting(True, group="data", help="random horizontal flip",
                         negation="no random horizontal flip")
    train_crop: str = setting(
        "inception", choices=setting_words("train_crop"), group="data",
        help="inception: TF's sample_distorted_bounding_box (official code); inception-subpixel: uniform area, "
             "fractional boxes (tiny images); resize-random-crop: BiT-HyperRule")
    train_resize: str = setting(
        "pil", choices=setting_words("train_resize"), group="data",
        help="what resamples the training crop: pil (default) or tensor (torch's uint8 kernel: within one grey level "
             "of PIL; speed: BENCHMARKS.md)")
    # official (whole image to S×S), big_vision (short side 8/7·S, central crop), resize-short-crop (short side S,
    # central crop); timm:INTERPOLATION:CROP_PCT when the initial weights record it
    eval_resize: str = setting("official", choices=setting_words("eval_resize"), group="data",
                               help=EVAL_RESIZE_HELP)
    # run
    out: str = setting("runs/run", group="run", help="run directory (default runs/<recipe>-<time>)")
    resume: bool = setting(
        False, parse="resume", nargs="?", const=True, metavar="auto", group="run",
        help="continue the run in --out (refused if it holds none: a typo in --out starts nothing); --resume auto: "
             "continue it, or start it when there is none (supervisors, make demo)")
    seed: int = setting(0, range=SEED, group="run",
                        help="seed of the initialisation, data order and augmentation (default 0)")
    device: str = setting("auto", parse="device", group="run",
                          help="auto, cpu, cuda, cuda:N (default auto: CUDA when available)")
    compile: bool = setting(False, group="run", help="torch.compile the model")
    precision: str = setting(  # resolved before the run
        "auto", parse="precision", group="run",
        help=PRECISION_HELP + "; bf16 trains under autocast with float32 weights and optimizer state. Recorded in "
                              "config.json; --resume keeps the run's")
    attention: str = setting(  # resolved with the precision
        "auto", choices=setting_words("attention"), group="run",
        help="how training computes a ViT's attention: flash (torch's fused kernel), matmul (explicit matmuls, "
             "softmax in the compute precision: a faster backward where measured so) or auto (default: matmul in "
             "bf16 on CPUs and shapes where it was measured faster, else flash; see BENCHMARKS.md, 'Training "
             "attention'). Inference always uses flash. Recorded in config.json")
    fsdp: bool = setting(False, group="run", help="shard parameters (FSDP2) instead of DDP")
    async_save: bool = setting(False, group="run", help="write sharded checkpoints (--fsdp, several processes) "
                               "in the background while training goes on; other runs write them in place")
    eval_every: int = setting(0, range=int_range(0, MAX_COUNT, note="0: at the end"), group="run",
                              help="evaluate every N steps (0: at the end)")
    eval_batch_size: int = setting(256, range=BATCH_SIZE, group="run",
                                   help="images per evaluation batch (default 256)")
    fewshot_every: int = setting(0, range=int_range(0, MAX_COUNT, note="0: off"), group="run",
                                 help="5-shot linear accuracy of the representation every N steps (the paper's "
                                      "pre-training signal)")
    save_every: int = setting(0, range=int_range(0, MAX_COUNT, note="0: with every evaluation"), group="run",
                              help="checkpoint every N steps (default: with evaluations)")
    keep_last: int = setting(2, range=int_range(1, 1_000_000), group="run", help="step checkpoints to keep")
    log_every: int = setting(10, range=POSITIVE_INT, group="run",
                             help="steps between training log lines and metrics.jsonl records")
    tensorboard: bool = setting(
        False, flag="tb", group="tracking",
        help="write TensorBoard events into RUN/tensorboard (pip install 'vitlab[tb]'); off unless given; recorded "
             "in config.json, so --resume goes on writing them")
    wandb_project: str | None = setting(
        None, flag="wandb", nargs="?", const="vitlab", metavar="PROJECT", group="tracking",
        help="also log to Weights & Biases (offline unless WANDB_MODE says otherwise; pip install 'vitlab[wandb]'); "
             "recorded in config.json, --resume continues the W&B run")

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _architecture(name: str, model_field: str) -> Setting:
    return Setting(name=name, type=int, range=MODEL_SIZES[model_field], model_field=model_field, group="model",
                   after="model", help=f"override the variant's {name.replace('_', '-')}")


# The settings that are flags only, no TrainConfig field: the run's length in epochs (steps, from the data) and the
# architecture flags (each sets a model_args field).
FLAG_ONLY: tuple[Setting, ...] = (
    Setting(name="epochs", type=float, range=EPOCHS, metavar="N", group="optimisation", after="steps",
            help="the run's length in passes over the training set: steps = N × training images / batch (rounded "
                 "up); the recipe's warm-up keeps its share; instead of --steps"),
    _architecture("depth", "depth"), _architecture("width", "width"), _architecture("heads", "num_heads"),
    _architecture("mlp_dim", "mlp_dim"),
)


def _declared() -> dict[str, Setting]:
    hints = typing.get_type_hints(TrainConfig)
    out = {}
    for f in dataclasses.fields(TrainConfig):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        out[f.name] = dataclasses.replace(f.metadata["setting"], name=f.name, type=hints[f.name], default=default)
    return out | {s.name: s for s in FLAG_ONLY}


# Every setting by name (TrainConfig fields first, in their order, then FLAG_ONLY).
SETTINGS: dict[str, Setting] = _declared()
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainConfig))
# An architecture flag's model_args field -> its setting's name (num_heads -> heads).
MODEL_FIELDS: dict[str, str] = {s.model_field: s.name for s in FLAG_ONLY if s.model_field}


def spelled(name: str, value: Any = None) -> str:
    """Setting `name` as the caller spells it (Setting.spelled); a name declared nowhere as it is."""
    return SETTINGS[name].spelled(value) if name in SETTINGS else spell(name, None, value)


def flag_settings(verb: str) -> list[Setting]:
    """The settings `vitlab VERB` takes as flags, by --help group, in declaration order within a group."""
    order = [s for s in SETTINGS.values() if not s.after]
    for s in FLAG_ONLY:
        order.insert(max(i for i, t in enumerate(order) if t.name in (s.after, *(u.name for u in FLAG_ONLY
                                                                             if u.after == s.after))) + 1, s)
    taken = [s for s in order if s.option and verb in s.verbs]
    return sorted(taken, key=lambda s: GROUPS.index(s.group))


def named_by_flag(text: str) -> Setting | None:
    """The setting a flag's spelling (`wd`, `ema-decay`, `ema_decay`) names when that is not its own name."""
    word = text.replace("_", "-")
    for s in SETTINGS.values():
        if s.option and word in (s.option[2:], *s.aliases) and word != s.name.replace("_", "-"):
            return s
    return None
