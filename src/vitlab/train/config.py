"""Training configuration: one flat dataclass, every value checked against its range (declared in vitlab.ranges,
where the flags' parsers read it too; the recipes, plain dicts of values over it, are vitlab.train.recipes).

How a run's values are decided from defaults, recipe, initial weights, preset, config file and flags is
vitlab.train.resolve; the resolved config is what the run directory records (config.json) and what `--resume`
restores.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vitlab.constants import SETTING_CHOICES, TIMM_RESIZE_PREFIX, setting_words, timm_resize
from vitlab.errors import setting
from vitlab.ranges import EPOCHS, MODEL_FLAGS, MODEL_SIZES, SETTINGS, Range
from vitlab.runtime.precision import check_precision
from vitlab.train.finetune import tuning_problems


@dataclass(frozen=True)
class TrainConfig:
    recipe: str = "demo"
    # data
    data: str = "digits"  # an embedded dataset (digits, mnist) or an image folder
    val_fraction: float | None = None  # hold out this fraction of train as the validation split
    strict: bool = False  # unreadable images are fatal instead of skipped
    num_classes: int | None = None  # if set, must equal the dataset's class count
    workers: int | None = None  # DataLoader worker processes; None: the process's CPUs less one (CPU: at most 8)
    # model
    model: str = "ViT-B/16"
    model_args: dict[str, Any] = field(default_factory=dict)  # config overrides: depth, width, num_heads, …
    init: str | None = None  # weights to fine-tune from: anything vitlab.load reads
    image_size: int = 224
    dropout: float | None = None  # None: keep the model's (init weights) value
    representation_size: int | None = None  # `pre_logits` Dense + tanh width when built from scratch; 0: none
    mean: tuple[float, float, float] | None = None  # None: what the weights expect (official: 0.5)
    std: tuple[float, float, float] | None = None
    # optimisation
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0  # decoupled (AdamW-style: p -= lr * wd * p), on kernels only
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = 0.9
    warmup: int = 0  # linear warm-up steps
    decay: Literal["linear", "cosine", "step"] = "linear"
    linear_end: float = 0.0  # the LR linear decay ends at (vit_jax `linear_end`, 1e-5 in pre-training)
    lr_drops: tuple[float, ...] = (0.3, 0.6, 0.9)  # "step" decay: LR ×0.1 after these fractions of the steps
    grad_clip: float = 1.0  # global-norm clipping; 0: off
    objective: Literal["classify", "mpp"] = "classify"  # mpp: masked patch prediction (self-supervised)
    mpp_target: Literal["mean-color", "mean-color-4x4", "pixels"] = "mean-color"
    loss: Literal["softmax", "sigmoid"] = "softmax"
    head_bias_init: float = 0.0  # classifier bias of a model built from scratch (−10 for sigmoid pre-training)
    label_smoothing: float = 0.0
    batch_size: int = 4096  # global batch: over all processes and accumulation steps
    accum: int = 1  # gradient accumulation steps per optimiser step
    steps: int = 1000
    ema: float | None = None  # Polyak/EMA decay of the weights used for evaluation, e.g. 0.9999
    ema_warmup: bool = False  # timm ModelEmaV3's decay warm-up: min(ema, 1 - k^(-2/3)) at update k
    # fine-tuning tools (vitlab.train.optim, vitlab.train.finetune, vitlab.train.finetune)
    layer_decay: float | None = None  # layer-wise lr decay: block i trains at lr * d^(depth - i); None: off
    freeze: str | None = None  # "backbone": only the head trains (a linear probe)
    lora_rank: int = 0  # LoRA adapters of this rank via peft, the base weights frozen; 0: off
    lora_alpha: float | None = None  # LoRA's alpha (scale alpha / rank); None: the rank (scale 1)
    lora_targets: tuple[str, ...] = ("qkv",)  # the blocks' Linear layers LoRA adapts: qkv, proj, fc1, fc2
    mixup: float = 0.0  # MixUp α: λ ~ Beta(α, α) per step (BiT-HyperRule: 0.1 above 20k images); 0: off
    cutmix: float = 0.0  # CutMix α (DeiT: 1.0); with MixUp too, each step is one of the two with p = 1/2; 0: off
    randaug_ops: int = 0  # RandAugment: operations per image (AugReg, DeiT: 2); 0: off
    randaug_magnitude: float = 0.0  # RandAugment level on TF's 0-10 scale, to 20 (vitlab.data.augment)
    randaug_mstd: float = 0.0  # per-image std of that level (DeiT: 0.5)
    random_erasing: float = 0.0  # probability of erasing one box with noise (DeiT: 0.25); 0: off
    drop_path_rate: float | None = None  # stochastic depth of the last block (linear in depth); None: the model's
    # fine-tuning protocol (paper Appendix B.1.1, Table 4): vitlab.train.recipes and vitlab.train.sweep
    preset: str | None = None  # a per-dataset fine-tuning preset (a Table 4 row), applied over the recipe
    lr_sweep: tuple[float, ...] = ()  # fine-tune once per lr on train minus a dev split; the dev-best is chosen
    dev_fraction: float | None = None  # share of each training class held out as the sweep's dev split
    refit: bool = False  # after the sweep, fine-tune the chosen lr once more on all of train
    # augmentation (official vit_jax input_pipeline: inception crop 5%-100% + flip)
    crop_scale: tuple[float, float] = (0.05, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    train_crop: str = "inception"  # inception (TF's sampler), inception-subpixel, resize-random-crop (BiT)
    train_resize: str = "pil"  # what resamples the crop: pil, or tensor (torch's uint8 kernel, within 1 level)
    eval_resize: str = "official"  # official (whole image to S×S), big_vision (short side 8/7·S, central crop),
    # resize-short-crop (short side S, central crop); timm:INTERPOLATION:CROP_PCT when the initial weights record it
    # run
    out: str = "runs/run"
    resume: bool = False
    seed: int = 0
    device: str = "auto"  # auto, cpu, cuda, cuda:1
    compile: bool = False
    precision: str = "auto"  # auto, fp32 or bf16 (autocast, float32 master weights); resolved before the run
    fsdp: bool = False  # shard parameters with FSDP2 instead of replicating them with DDP
    eval_every: int = 0  # 0: only at the end
    eval_batch_size: int = 256
    fewshot_every: int = 0  # 5-shot linear accuracy of the representation every N steps and at the end; 0: off
    save_every: int = 0  # 0: with every evaluation
    keep_last: int = 2  # step checkpoints kept (best and final are extra)
    log_every: int = 10
    tensorboard: bool = False  # TensorBoard events in <out>/tensorboard (--tb); a resumed run keeps logging
    wandb_project: str | None = None  # a Weights & Biases run in this project (--wandb); None: off

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def validate(cfg: TrainConfig, recorded_in: str | Path | None = None) -> TrainConfig:
    """Every setting against its allowed range, before anything runs: a bad value is one line naming the flag,
    the value and the range, never a traceback minutes into a run. `recorded_in`: the file the values were read
    from (a stored run's config.json), which the line then names with the setting, not a flag no one passed."""
    name = _flag if recorded_in is None else _recorded
    for message in _setting_problems(cfg, name) + _rule_problems(cfg, name):
        if recorded_in is not None:
            message = (f"{recorded_in}: {message}; the file was edited, or written by another vitlab: put the run's "
                       f"value back, or start a new run with another {setting('out', value='DIR')}")
        raise ValueError(message)
    return cfg


# A setting's flag where its name differs from the field's (the others: the field with dashes).
FLAG_NAMES = {"weight_decay": "wd", "grad_clip": "clip", "lora_rank": "lora", "tensorboard": "tb",
              "wandb_project": "wandb"}
MODEL_FIELD_FLAGS = {field: dest for dest, field in MODEL_FLAGS.items()}  # model_args field -> its flag's name


def _flag(name: str) -> str:
    """A setting (or an architecture flag's name: heads) as the caller spells it: the command line's flag, or a
    vitlab.fit keyword (vitlab.errors.setting)."""
    return setting(name, FLAG_NAMES.get(name, name))


def _recorded(name: str) -> str:
    """A setting as a run's config.json spells it (an architecture flag's value lives in its model_args)."""
    return f"model_args {MODEL_FLAGS[name]}" if name in MODEL_FLAGS else name


# Tuple settings: their length and the rule between their elements (each element's range is in SETTINGS).
_SHAPES: dict[str, tuple[int | None, str, Any]] = {
    "betas": (2, "two numbers", None),
    "mean": (3, "three numbers (R, G, B)", None),
    "std": (3, "three numbers (R, G, B)", None),
    "crop_scale": (2, "MIN MAX with MIN <= MAX", lambda v: v[0] <= v[1]),
    "crop_ratio": (2, "MIN MAX with MIN <= MAX", lambda v: v[0] <= v[1]),
    "lr_drops": (None, "increasing fractions", lambda v: all(a < b for a, b in zip(v, v[1:], strict=False))),
    "lr_sweep": (None, "learning rates", None),
}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
# The flags that are no TrainConfig field, with their type and range: --epochs (the steps, from the data) and the
# architecture flags (model_args).
FLAG_ONLY: dict[str, tuple[type, Range]] = {"epochs": (float, EPOCHS),
                                            **{dest: (int, MODEL_SIZES[f]) for dest, f in MODEL_FLAGS.items()}}


def setting_problem(key: str, value: Any, label: str) -> str | None:
    """What is wrong with one setting's value on its own (its range in vitlab.ranges.SETTINGS, the one its flag parses
    with; its shape; its choices), as one line about `label` (the flag, the vitlab.fit keyword or the recorded
    setting); None when the value is allowed. `key` is a TrainConfig field or a FLAG_ONLY flag's name (epochs,
    depth, heads). The value is of the setting's type already (vitlab.train.config.type_problem)."""
    if key in FLAG_ONLY:
        allowed = FLAG_ONLY[key][1]
        return None if allowed.holds(value) else f"{label} must be {allowed.allowed()}, got {value!r}"
    if value is None and _DEFAULTS.get(key, ...) is None:
        return None
    if key in _SHAPES:
        length, what, rule = _SHAPES[key]
        allowed = SETTINGS[key]
        ok = (isinstance(value, tuple | list) and (length is None or len(value) == length)
              and all(allowed.holds(v) for v in value) and (rule is None or rule(value)))
        return None if ok else (f"{label} must be {what}, each {allowed.allowed()}, got "
                                f"{setting_text(tuple(value) if isinstance(value, list) else value)}")
    if key in SETTINGS:
        allowed = SETTINGS[key]
        return None if allowed.holds(value) else f"{label} must be {allowed.allowed()}, got {setting_text(value)}"
    if key == "eval_resize" and isinstance(value, str) and value.startswith(TIMM_RESIZE_PREFIX):
        try:  # timm's transform, as weights of a timm name record it (the flag offers vitlab's own resizes)
            timm_resize(value)
        except ValueError as err:
            return f"{label}: {err}"
        return None
    if key in SETTING_CHOICES and value not in setting_words(key):
        return f"unknown {label} {value!r}; use {', '.join(setting_words(key))}"
    if key == "precision":
        try:
            check_precision(value, "train")
        except ValueError as err:  # the flag's words, about `label`
            return label + str(err).removeprefix(setting("precision"))
    if key == "device" and not _valid_device(value):
        return f"unknown {label} {value!r}; use auto, cpu, cuda or cuda:N"
    return None


def _setting_problems(cfg: TrainConfig, name: Callable[[str], str]) -> list[str]:
    """Each setting on its own (setting_problem), so that a value from a --config file, a vitlab.fit keyword or a
    recorded run is held to what the flag accepts."""
    problems = [setting_problem(key, getattr(cfg, key), name(key)) for key in _DEFAULTS]
    problems += [setting_problem(MODEL_FIELD_FLAGS[key], value, name(MODEL_FIELD_FLAGS[key]))
                 for key, value in cfg.model_args.items() if key in MODEL_FIELD_FLAGS]
    return [p for p in problems if p]


COMMA_SETTINGS = frozenset({"lora_targets"})  # settings whose flag takes one comma-separated word


def flag_text(name: str, value: Any) -> str:
    """A setting with its value as the command line spells it: `--lora 8`, `--lora-targets qkv,fc2`,
    `--ema-warmup` (on), `no --ema-warmup` (off)."""
    if isinstance(value, bool):
        return _flag(name) if value else f"no {_flag(name)}"
    return f"{_flag(name)} {value_text(name, value)}"


def value_text(name: str, value: Any) -> str:
    """A setting's value as its flag takes it: `qkv,fc2` for a comma list, on/off for a switch."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if name in COMMA_SETTINGS and isinstance(value, tuple | list):
        return ",".join(map(str, value))
    return setting_text(value)


def setting_text(value: Any) -> str:
    """A setting's value as the command line spells it: floats in %g, tuples space-separated ("(none)" when
    empty), everything else as str."""
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:g}"
    if isinstance(value, tuple):
        return " ".join(setting_text(v) for v in value) or "(none)"
    return str(value)


def _rule_problems(cfg: TrainConfig, name: Callable[[str], str]) -> list[str]:
    """The settings against each other."""
    crop, resize = name("train_crop"), name("train_resize")
    checks = [
        (cfg.batch_size % max(cfg.accum, 1) == 0, f"{name('batch_size')} {cfg.batch_size} is not divisible by "
                                                   f"{name('accum')} {cfg.accum}"),
        (cfg.objective != "mpp" or not cfg.init, "masked patch prediction pre-trains; fine-tune with finetune"),
        (not (cfg.fewshot_every and cfg.fsdp), f"{name('fewshot_every')} runs on one process: use DDP, not "
                                               f"{name('fsdp')}"),
        (not (cfg.mixup and cfg.objective != "classify"), f"{name('mixup')} mixes labelled images: use it with "
                                                           "classify"),
        (not (cfg.cutmix and cfg.objective != "classify"), f"{name('cutmix')} mixes labelled images: use it with "
                                                            "classify"),
        (not (cfg.train_resize == "tensor" and cfg.train_crop == "inception-subpixel"),
         f"{resize} tensor resamples integer crop boxes, {crop} inception-subpixel draws fractional ones: use "
         f"{resize} pil or {crop} inception"),
    ]
    return [message for ok, message in checks if not ok] + tuning_problems(cfg)


def _valid_device(device: str) -> bool:
    return device in ("auto", "cpu", "cuda", "mps") or (device.startswith("cuda:") and device[5:].isdigit())


def config_from_json(path: str | Path) -> TrainConfig:
    """The config a run directory recorded; lists become tuples again."""
    return config_from_record(read_record(path))


def read_record(path: str | Path) -> dict[str, Any]:
    """A run's config.json as a mapping; ValueError naming the file when it holds none."""
    try:
        d = json.loads(Path(path).read_text())
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a run's settings; the file is damaged") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: holds a JSON {type(d).__name__}, not a run's settings (an object); the file is "
                         "damaged")
    return d


def config_from_record(record: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig of a run's recorded settings (its other keys ignored); lists become tuples again."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items() if k in known}  # `auto`: older runs
    # Runs recorded before these settings existed used the sub-pixel crop and short-side evaluation resize.
    return TrainConfig(**{"train_crop": "inception-subpixel", "eval_resize": "resize-short-crop", **d})


# --------------------------------------------------------------------------------------------------------------
# A `--config FILE` (a run's config.json, or JSON / YAML of TrainConfig fields) read as untrusted input, and
# the type check every layer of settings passes before any rule does arithmetic on it.
#
# A settings file is a few kilobytes of plain values: it is refused, in one line naming the file, when it is
# larger than MAX_BYTES, nested deeper than the parser can follow, or uses YAML aliases (`*name`: a 400-byte
# "billion laughs" file expands to 10^9 values). Values of the wrong type (`steps: "4"`, `steps: [1, 2]`) are
# refused by name before they reach the warm-up rule or the banner.

MAX_BYTES = 1 << 20  # a run's config.json is about 4 KB; a megabyte of settings is not a settings file


def parse_settings(path: str) -> Any:
    """The parsed content of a --config file (JSON, or YAML for .yaml / .yml); ValueError naming the file."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise ValueError(f"--config {path}: {size:,} bytes, more than a settings file holds (limit "
                             f"{MAX_BYTES:,}); pass a run's config.json or a short JSON / YAML file")
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"--config {path}: cannot read it ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise ValueError(f"--config {path}: not a text file (not UTF-8)") from None
    kind = "YAML" if p.suffix in (".yaml", ".yml") else "JSON"
    try:
        return _load_yaml(text) if kind == "YAML" else json.loads(text)
    except RecursionError:
        raise ValueError(f"--config {path}: nested too deeply to be a settings file") from None
    except _AliasError:
        raise ValueError(f"--config {path}: uses YAML aliases (*name); write each value out (aliases let a few "
                         "bytes expand to billions of values, so settings files may not use them)") from None
    except Exception as err:  # json and yaml raise their own error types
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"--config {path}: not valid {kind} ({first})") from None


class _AliasError(Exception):
    pass


def _load_yaml(text: str) -> Any:
    """yaml.safe_load with aliases refused while composing, before anything is expanded."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise _AliasError
            return super().compose_node(parent, index)

    return yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 (a SafeLoader subclass)


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def check_types(values: Mapping[str, Any], where: str) -> None:
    """ValueError naming the first setting whose value is not of its TrainConfig field's type (unknown keys are
    left to the caller). Ranges and choices are vitlab.train.config.validate's."""
    for key, value in values.items():
        problem = type_problem(key, value)
        if problem is None:
            continue
        hint = _field_types()[key]
        hint_text = ""
        if isinstance(value, str) and _is_number_text(value) and _describe(hint) in ("an integer", "a number"):
            # quoted, or YAML 1.1 reading an exponent without a decimal point (1e-3) as text
            hint_text = "; write it unquoted" + (", with a decimal point (1.0e-3)" if "e" in value.lower() else "")
        raise ValueError(f"{where}: {problem}{hint_text}")


def type_problem(key: str, value: Any) -> str | None:
    """"KEY must be <its TrainConfig field's type>, got VALUE (its kind)" when `value` is not of that type; None
    when it is, or when `key` is neither a TrainConfig field nor a FLAG_ONLY flag."""
    hint = FLAG_ONLY[key][0] if key in FLAG_ONLY else _field_types().get(key)
    if hint is None or _matches(value, hint):
        return None
    text = repr(value)
    return f"{key} must be {_describe(hint)}, got {text if len(text) <= 60 else text[:57] + '...'} ({_kind(value)})"


def check_record(path: Path, record: dict[str, Any], record_keys: frozenset[str]) -> None:
    """A stored run's config.json beyond what config_from_json checks: value types, and its sources and notes
    (what the banner prints), so that an edited file is one line naming it, never a traceback."""
    check_types({k: v for k, v in record.items() if k not in record_keys}, str(path))
    sources, notes = record.get("sources", {}), record.get("notes", [])
    if not isinstance(sources, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in sources.items()):
        raise ValueError(f"{path}: 'sources' must map each setting to where its value came from, got "
                         f"{json.dumps(sources)[:60]}; the file was edited or is damaged: restore it")
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise ValueError(f"{path}: 'notes' must be a list of lines, got {json.dumps(notes)[:60]}; the file was "
                         "edited or is damaged: restore it")


def check_model_args_type(model_args: Any, where: str) -> None:
    """ValueError naming `where` unless model_args_problem finds nothing."""
    problem = model_args_problem(model_args)
    if problem:
        raise ValueError(f"{where}: {problem}")


def model_args_problem(model_args: Any) -> str | None:
    """model_args: a mapping of model config field names to values (the model decides which names it has)."""
    if isinstance(model_args, Mapping) and all(isinstance(k, str) for k in model_args):
        return None
    return f"model_args must be a mapping of model settings (e.g. {{depth: 4}}), got {model_args!r}"


def _matches(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin is typing.Literal:
        return isinstance(value, str)  # which strings: the choice check names them
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        return len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args, strict=True))
    if origin is dict:
        return isinstance(value, dict)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if hint is type(None):
        return "null"
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
        return f"a list of {len(args)} {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def _kind(value: Any) -> str:
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
            tuple: "a list", dict: "a mapping", type(None): "null"}.get(type(value), type(value).__name__)


def _is_number_text(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
