"""Training configuration: `TrainConfig` (declared with every setting's range, choices, help and flag in
vitlab.train.settings), every value checked against its declaration however it arrived; the recipes, plain dicts of
values over it, are vitlab.train.recipes.

How a run's values are decided from defaults, recipe, initial weights, preset, config file and flags is
vitlab.train.resolution; the resolved config is what the run directory records (config.json) and what `--resume`
restores.
"""

from __future__ import annotations

import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vitlab.constants import SETTING_CHOICES, TIMM_RESIZE_PREFIX, canonical_setting, setting_words, timm_resize
from vitlab.errors import closest, setting
from vitlab.files.reading import NotRegularFile, open_regular, read_text_regular
from vitlab.runtime.precision import check_precision
from vitlab.train.finetune import tuning_problems
from vitlab.train.settings import FIELDS, MODEL_FIELDS, SETTINGS, TrainConfig, spelled


def validate(cfg: TrainConfig, recorded_in: str | Path | None = None,
             sources: Mapping[str, str] | None = None) -> TrainConfig:
    """Every setting against its allowed range, before anything runs: a bad value is one line naming the flag,
    the value and the range, never a traceback minutes into a run. `recorded_in`: the file the values were read
    from (a stored run's config.json), which the line then names with the setting, not a flag no one passed;
    `sources` (each setting's, as resolve records them): a value a --config file set is named as that file's key,
    after the file's name, for the same reason."""
    name = _flag if recorded_in is None else _recorded
    files = {key: source.removeprefix(_FILE_SOURCE) for key, source in (sources or {}).items()
             if recorded_in is None and source.startswith(_FILE_SOURCE) and (key in _DEFAULTS or key == "model_args")}
    for key in files:
        problem = _one_setting_problem(cfg, key, _recorded)
        if problem:
            raise ValueError(f"{files[key]}: {problem}")
    for message in _setting_problems(cfg, name) + _rule_problems(cfg, name):
        if recorded_in is not None:
            message = (f"{recorded_in}: {message}; the file was edited, or written by another vitlab: put the run's "
                       f"value back, or start a new run with another {setting('out', value='DIR')}")
        raise ValueError(message)
    return cfg


def _flag(name: str) -> str:
    """A setting (or an architecture flag's name: heads) as the caller spells it: the command line's flag, or a
    vitlab.fit keyword (vitlab.train.settings.Setting.spelled)."""
    return spelled(name)


def _recorded(name: str) -> str:
    """A setting as a run's config.json spells it (an architecture flag's value lives in its model_args)."""
    model_field = SETTINGS[name].model_field if name in SETTINGS else None
    return f"model_args {model_field}" if model_field else name


_DEFAULTS = {name: SETTINGS[name].default for name in FIELDS}
_FILE_SOURCE = "config "  # the source resolve records for a value a --config file set: "config FILE"


def setting_problem(key: str, value: Any, label: str) -> str | None:
    """What is wrong with one setting's value on its own (its declared range, the one its flag parses with; its
    shape; its choices: vitlab.train.settings), as one line about `label` (the flag, the vitlab.fit keyword or the
    recorded setting); None when the value is allowed. `key` is a TrainConfig field or a flag-only setting's name
    (epochs, depth, heads). The value is of the setting's type already (vitlab.train.config.type_problem)."""
    declared = SETTINGS.get(key)
    if declared is not None and key not in _DEFAULTS and declared.range is not None:  # a flag-only setting
        allowed = declared.range
        return None if allowed.holds(value) else f"{label} must be {allowed.allowed()}, got {value!r}"
    if value is None and _DEFAULTS.get(key, ...) is None:
        return None
    if declared is not None and declared.shape is not None:
        allowed, length = declared.range, _length(declared.type)
        ok = (isinstance(value, tuple | list) and (length is None or len(value) == length)
              and all(allowed.holds(v) for v in value) and (declared.rule is None or declared.rule(value)))
        return None if ok else (f"{label} must be {declared.shape}, each {allowed.allowed()}, got "
                                f"{setting_text(tuple(value) if isinstance(value, list) else value)}")
    if declared is not None and declared.range is not None:
        allowed = declared.range
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
    return [p for key in dict.fromkeys([*_DEFAULTS, "model_args"]) if (p := _one_setting_problem(cfg, key, name))]


def _one_setting_problem(cfg: TrainConfig, key: str, name: Callable[[str], str]) -> str | None:
    """`setting_problem` of one TrainConfig field (model_args: each architecture value in it)."""
    if key != "model_args":
        return setting_problem(key, getattr(cfg, key), name(key))
    problems = [setting_problem(MODEL_FIELDS[k], v, name(MODEL_FIELDS[k]))
                for k, v in cfg.model_args.items() if k in MODEL_FIELDS]
    return next((p for p in problems if p), None)


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
    if name in SETTINGS and SETTINGS[name].parse == "words" and isinstance(value, tuple | list):
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


def _length(hint: Any) -> int | None:
    """A tuple type's length (None for tuple[X, ...]), under an optional `| None`."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) in (
        typing.Union, types.UnionType) else [hint]
    inner = typing.get_args(args[0])
    return None if len(inner) == 2 and inner[1] is Ellipsis else len(inner)


def _valid_device(device: str) -> bool:
    return device in ("auto", "cpu", "cuda", "mps") or (device.startswith("cuda:") and device[5:].isdigit())


def config_from_json(path: str | Path) -> TrainConfig:
    """The config a run directory recorded; lists become tuples again."""
    return config_from_record(read_record(path))


def read_record(path: str | Path) -> dict[str, Any]:
    """A run's config.json as a mapping; ValueError naming the file when it holds none."""
    try:
        d = json.loads(read_text_regular(path))
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a run's settings; the file is damaged") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: holds a JSON {type(d).__name__}, not a run's settings (an object); the file is "
                         "damaged")
    return d


def config_from_record(record: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig of a run's recorded settings (its other keys ignored); lists become tuples again."""
    known = set(FIELDS)
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
    where = setting("config_file", "config", str(path))
    try:
        with open_regular(p) as f:  # a FIFO is refused, never waited on; the size is what is read, not st_size
            raw = f.read(MAX_BYTES + 1)
    except NotRegularFile as err:
        raise ValueError(f"{where}: is {err.kind}, not a regular file; pass a settings file") from None
    except OSError as err:
        raise ValueError(f"{where}: cannot read it ({err.strerror or err})") from None
    if len(raw) > MAX_BYTES:
        raise ValueError(f"{where}: more bytes than a settings file holds (limit {MAX_BYTES:,}); pass a run's "
                         "config.json or a short JSON / YAML file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{where}: not a text file (not UTF-8)") from None
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


def check_types(values: Mapping[str, Any], where: str) -> None:
    """ValueError naming the first setting whose value is not of its TrainConfig field's type (unknown keys are
    left to the caller). Ranges and choices are vitlab.train.config.validate's."""
    for key, value in values.items():
        problem = type_problem(key, value)
        if problem is None:
            continue
        hint = SETTINGS[key].type
        hint_text = ""
        if isinstance(value, str) and _is_number_text(value) and _describe(hint) in ("an integer", "a number"):
            # quoted, or YAML 1.1 reading an exponent without a decimal point (1e-3) as text
            hint_text = "; write it unquoted" + (", with a decimal point (1.0e-3)" if "e" in value.lower() else "")
        raise ValueError(f"{where}: {problem}{hint_text}")


def type_problem(key: str, value: Any) -> str | None:
    """"KEY must be <its TrainConfig field's type>, got VALUE (its kind)" when `value` is not of that type; None
    when it is, or when `key` is no declared setting."""
    hint = SETTINGS[key].type if key in SETTINGS else None
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


# Keys of a run's config.json besides the TrainConfig fields (accepted, and ignored, by --config).
RUN_RECORD_KEYS = frozenset({"model_config", "class_names", "train_images", "val_images", "world_size", "torch",
                             "sources", "notes", "resumed"})


def check_known(values: Mapping[str, Any], what: str, extra: frozenset[str] = frozenset()) -> None:
    """ValueError naming the keys of `values` that are no setting (with the closest setting's name)."""
    known = set(FIELDS) | extra
    unknown = sorted(set(values) - known)
    if unknown:
        guess = closest(unknown[0], sorted(known))
        raise ValueError(f"unknown {what}: {', '.join(unknown)}" + (f"; did you mean {guess}?" if guess else ""))


def read_config_file(path: str) -> dict[str, Any]:
    """A run's config.json, or a JSON/YAML file of TrainConfig fields (`vitlab train --config`)."""
    values = parse_settings(path)  # bounded: size, nesting, no YAML aliases
    if not isinstance(values, dict):
        raise ValueError(f"--config {path}: expected a mapping of settings, got {type(values).__name__}")
    check_known(values, f"settings in --config {path}", RUN_RECORD_KEYS)
    values = {k: v for k, v in values.items() if k not in RUN_RECORD_KEYS and k not in ("resume", "auto")}
    check_types(values, f"--config {path}")
    values = {k: canonical_setting(k, v) for k, v in values.items()}
    if "model_args" in values:
        check_model_args_type(values["model_args"], f"--config {path}")
    return values
