"""Training from Python: `vitlab.fit(...)` does what `vitlab train` / `vitlab finetune` do, and returns the
trained model with the run's result.

    import vitlab
    result = vitlab.fit("finetune", init="vit_s16.safetensors", data="photos/", epochs=10, out="runs/photos")
    result.metrics["top1"], result.out_dir, result.model      # final validation metrics, run folder, the model

    # objects instead of paths: a model (vitlab's, or a timm ViT) and map-style datasets of (image, label)
    train, val = torchvision.datasets.ImageFolder("photos/train"), torchvision.datasets.ImageFolder("photos/val")
    result = vitlab.fit("finetune", init=vitlab.load("vit_s16.safetensors"), data=(train, val), epochs=10)

A thin layer over the command line's path: the settings are the flags as keywords (TrainConfig fields, plus
`epochs` and the architecture flags `depth`, `width`, `heads`, `mlp_dim`, which set `model_args` as their flags
do), each checked as its flag is (`fit_flags`), resolved by `vitlab.train.resolve`, checked by
`vitlab.train.fitting.prepare` as the run would, trained by `vitlab.train.run` (or `run_sweep` with `lr_sweep`). The
console shows what the command line shows (the banner, the time estimate, step and validation lines, a progress bar
on a terminal, the final `done:` line) unless `progress=False` or the program has set up logging itself.

Objects (vitlab.data.objects has the rules for datasets): `data` is a dataset, or a (train, val) pair of them, and a
single dataset needs `val_fraction` (the keyword or --config's) as a folder without val/ does; the datasets' images are
transformed by vitlab (a dataset with a transform of its own is refused). `init` is a vitlab model or a timm ViT, whose
weights are copied (the object is not trained). The run records each by its description, `object:TYPE(… sha256 …)` in
config.json's data / init, and `resume` refuses another object than the run's. An object run cannot sweep learning rates
(`lr_sweep`) nor measure few-shot accuracy (`fewshot_every`), which read the data by name.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from vitlab.data import Datasets, build_datasets
from vitlab.data.objects import OBJECT_PREFIX, is_dataset_object, iterable_only
from vitlab.errors import closest
from vitlab.files.digest import tensors_fingerprint
from vitlab.files.reading import read_text_regular
from vitlab.files.rundir import CONFIG
from vitlab.models.config import BiTConfig, ViTConfig
from vitlab.models.registry import describe_architecture
from vitlab.runtime.allocator import tune_for_compute
from vitlab.train.banner import result_line, schedule_lines, settings_lines
from vitlab.train.config import (
    model_args_problem,
    read_record,
    setting_problem,
    type_problem,
)
from vitlab.train.console import append_to_console_log
from vitlab.train.finetune import ema_warning
from vitlab.train.resolution import InitWeights, Resolved, resolve
from vitlab.train.settings import MODEL_FIELDS, SETTINGS, named_by_flag
from vitlab.train.start import Start, decide_start
from vitlab.train.trackers import check_trackers
from vitlab.train.trainer import RunResult, build_run_model, check_classes, objective_for, run, run_record
from vitlab.weights.load import is_model_object, load, read_module

# --------------------------------------------------------------------------------------------------------------
# What a run checks before its first step, done before it starts: `--print-config` shows exactly what the run
# will do and refuses what the run refuses.
#
# `prepare` makes the run's own checks on resolved settings (trackers installed, the sweep's settings, the
# datasets built with their classes and splits checked, as vitlab.train.trainer does); `planned_record` is the
# config.json the run will write, model configuration included (the model built on the meta device: no memory, no
# initialisation); `planned_lines` is what `--print-config` prints, the banner's schedule and settings lines.

def prepare(resolved: Resolved) -> Resolved:
    """The resolved settings with their datasets, after the checks the run makes before its first step
    (ValueError / DataError in the run's words otherwise)."""
    cfg = resolved.config
    check_trackers(cfg.tensorboard, cfg.wandb_project)
    val_fraction = cfg.val_fraction
    if cfg.lr_sweep:
        from vitlab.train.sweep import check_sweep  # the sweep imports the loop: only when there is one

        check_sweep(cfg)
        val_fraction = cfg.dev_fraction  # each of its runs validates on the dev split
    data = resolved.data if resolved.data is not None and not cfg.lr_sweep else build_datasets(
        cfg.data, val_fraction, cfg.strict)
    check_classes(cfg, data)
    return dataclasses.replace(resolved, data=data)


def planned_record(resolved: Resolved) -> dict[str, Any]:
    """config.json as the run (one without a sweep) will write it; `resolved` as `prepare` returns it."""
    cfg, data = resolved.config, resolved.data
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return run_record(cfg, resolved.record(), _model_config(resolved), data, world)


def planned_lines(resolved: Resolved) -> list[str]:
    """`--print-config`: the first settings line, the schedule (steps, epochs, a warning when out of proportion),
    then every value by source and the notes; `resolved` as `prepare` returns it. The warnings the run prints
    (an EMA horizon longer than the run) are printed here too."""
    lines, cfg = settings_lines(resolved), resolved.config
    warning = ema_warning(cfg.ema, cfg.ema_warmup, cfg.steps) if cfg.ema else None
    warnings = [f"warning: {warning}"] if warning else []
    return lines[:1] + schedule_lines(resolved, len(resolved.data.train)) + warnings + lines[1:]


def _model_config(resolved: Resolved) -> dict[str, Any]:
    """The configuration of the model the run saves: a resumed run's is its stored one (it continues from its
    checkpoint); otherwise the model is built as the run builds it, on the meta device."""
    cfg = resolved.config
    stored = Path(cfg.out) / CONFIG
    if cfg.resume and stored.is_file():
        return json.loads(read_text_regular(stored))["model_config"]
    with torch.device("meta"):
        model = build_run_model(cfg, resolved.data.class_names, objective_for(cfg).has_head, resolved.init)
    return model.config.to_dict()


log = logging.getLogger("vitlab.train")


@dataclass
class FitResult(RunResult):
    """The run's result (vitlab.train.RunResult: out_dir, status, step, metrics, weights, …) and the trained
    model, read back from its final weights (None when the run was preempted). With a sweep: the chosen run's
    model, `metrics["top1"]` its test accuracy, and `sweep` the whole table (vitlab.train.sweep.SweepResult)."""

    model: Any = None
    sweep: Any = None


def fit(recipe: str | None = None, *, config_file: str | os.PathLike | None = None, progress: bool = True,
        **settings: Any) -> FitResult:
    """Train (fine-tune, with `init`) as the command line does; see the module doc. `recipe`: as `--recipe`
    (default: `demo`, or `finetune` with `init`); `config_file`: as `--config`; `settings`: the flags as keywords
    (`data`, `init`, `out`, `lr`, `batch_size`, `steps` or `epochs`, `depth`, `heads`, …; paths as str or Path;
    `data` may be a dataset object or a (train, val) pair of them, `init` a vitlab model or a timm ViT: module doc).
    TypeError (one line, naming the keyword) for a keyword or a value of the wrong type, ValueError (one line) for
    settings or data the run would refuse."""
    _check_call(recipe, config_file, progress)
    flags = fit_flags(settings)
    verb = "finetune" if flags.get("init") is not None else "train"
    config_file = os.fspath(config_file) if config_file is not None else None
    with _console(progress):
        init_weights = _init_object(flags)
        start = decide_start(flags, config_file=config_file, recipe=recipe, verb=verb)
        held_out = _val_fraction(flags, start)
        data = _data_object(flags, held_out)
        resolved = resolve(recipe, flags, config_file=config_file, verb=verb, data=data, init_weights=init_weights,
                           start=start)
        if data is not None:
            _check_object_run(resolved, held_out)
            resolved = dataclasses.replace(resolved, data=data)  # a resumed run's too
        resolved = prepare(resolved)
        outcome = train_resolved(resolved, verb, say=lambda line: log.info("%s", line))
    if resolved.config.lr_sweep:
        model = load(outcome.out_dir)  # the run the sweep chose (its refit, if it made one)
        return FitResult(outcome.out_dir, "completed", resolved.config.steps, {"top1": outcome.test_top1},
                         seconds=outcome.seconds, model=model, sweep=outcome)
    model = load(outcome.weights) if outcome.weights is not None else None
    return FitResult(**{f.name: getattr(outcome, f.name) for f in fields(RunResult)}, model=model)


def _init_object(flags: dict[str, Any]) -> InitWeights | None:
    """A model object given as `init`, read as weights; in `flags` it is replaced by its description (module doc)."""
    if flags.get("init") is None or isinstance(flags["init"], str):
        return None
    record = read_module(flags["init"])
    kind = type(flags["init"]).__name__
    flags["init"] = (f"{OBJECT_PREFIX}{kind}({record.config.name or describe_architecture(record.config)}, "
                     f"tensors sha256 {tensors_fingerprint(record.state_dict)})")
    return InitWeights(None, record)


def _data_object(flags: dict[str, Any], val_fraction: float | None) -> Datasets | None:
    """A dataset object given as `data` built into the run's Datasets (`val_fraction` held out); in `flags` it is
    replaced by its description (module doc)."""
    if isinstance(flags.get("data", ""), str):
        return None
    data = build_datasets(flags["data"], val_fraction, bool(flags.get("strict")))
    flags["data"] = data.source
    return data


def _val_fraction(flags: Mapping[str, Any], start: Start) -> float | None:
    """The held-out share a dataset object is split with, found before the run is resolved because the split
    comes first: the keyword's, else on resume the stored run's, else the config file's (no recipe sets it)."""
    if "val_fraction" in flags:
        return flags["val_fraction"]
    if start.case == "continue":
        return read_record(start.record).get("val_fraction")
    return start.file_values.get("val_fraction")


def _check_object_run(resolved: Resolved, val_fraction: float | None) -> None:
    """What a run on a dataset object cannot do, refused before it starts (module doc); `val_fraction`: the share
    the object was split with."""
    cfg = resolved.config
    if (cfg.val_fraction or None) != (val_fraction or None):
        raise ValueError(f"val_fraction {cfg.val_fraction} ({resolved.sources.get('val_fraction')}) would split a "
                         "dataset object after it was split: pass val_fraction= to vitlab.fit itself")
    if cfg.lr_sweep:
        raise ValueError("lr_sweep splits its dev set from the data by name; with a dataset object, run one lr per "
                         "vitlab.fit call")
    if cfg.fewshot_every:
        raise ValueError("fewshot_every reads the data by name; with a dataset object leave it 0")


# --------------------------------------------------------------------------------------------------------------
# vitlab.fit's keywords are the command line's flags (dashes as underscores; --wd, --clip, --lora, --tb and --wandb by
# their settings' names), checked one by one before anything is resolved, as argparse checks the flags: a keyword
# vitlab.fit does not take, or a value of the wrong type, is a TypeError naming the keyword; a value outside its
# flag's range a ValueError in the flag's words (vitlab.train.config.setting_problem); never an error from inside
# the resolution.

# Keywords whose value is a path (str or os.PathLike), with what else it may name.
PATHS = {"data": "a path or dataset name", "init": "a path or weights name", "out": "a path"}
# Objects a keyword takes besides a path (module doc).
OBJECTS = {"data": "a map-style dataset of (image, label) (torchvision ImageFolder, datasets.Dataset, …) or a "
                   "(train, val) pair of them, or a datasets.DatasetDict (its train and validation splits)",
           "init": "a model (vitlab's, or a timm ViT)"}
_KEYWORDS = frozenset(SETTINGS)
# What a model's config has that a run sets through model_args (the run sets its size and classes itself).
_MODEL_SETTINGS = frozenset(f.name for c in (ViTConfig, BiTConfig) for f in dataclasses.fields(c)) - _KEYWORDS - {
    "name"}


def fit_flags(settings: Mapping[str, Any]) -> dict[str, Any]:
    """vitlab.fit's keywords as the flags `vitlab.train.resolve` takes (TrainConfig fields and `epochs`; the
    architecture flags gathered into model_args); None is a keyword left out. TypeError / ValueError (one line,
    naming the keyword) for what the command line would refuse."""
    flags: dict[str, Any] = {}
    model_args: dict[str, Any] = {}
    for key, value in settings.items():
        if key not in _KEYWORDS:
            raise TypeError(_unknown_keyword(key))
        if value is None:
            continue
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        problem = _type_problem(key, value)
        if problem:
            raise TypeError(problem)
        problem = setting_problem(key, value, key)
        if problem:
            raise ValueError(problem)
        if SETTINGS[key].model_field:
            model_args[SETTINGS[key].model_field] = value
        else:
            flags[key] = value
    if model_args:
        given = flags.get("model_args", {})
        for field, value in model_args.items():
            if field in given and given[field] != value:
                raise ValueError(f"{MODEL_FIELDS[field]}={value!r} and model_args {field} {given[field]!r} "
                                 "disagree; pass one")
        flags["model_args"] = {**given, **model_args}
    return flags


def _type_problem(key: str, value: Any) -> str | None:
    if key in PATHS:
        if isinstance(value, str) or (key == "data" and is_dataset_object(value)) or (
                key == "init" and is_model_object(value)):
            return None
        if key == "data" and (why := iterable_only(value)):
            return why
        also = f", or {OBJECTS[key]}" if key in OBJECTS else ""
        return f"{key} must be {PATHS[key]} (str or os.PathLike){also}, got {type(value).__name__}"
    if key == "resume":  # as --resume [auto]; auto: continue the run, or start it when there is none
        ok = isinstance(value, bool) or (isinstance(value, str) and value == "auto")
        return None if ok else f"resume must be True, False or 'auto', got {repr(value)[:60]}"
    if key == "model_args":
        return model_args_problem(value)
    return type_problem(key, value)


def _unknown_keyword(key: str) -> str:
    """One line for a keyword vitlab.fit does not take: the setting it spells (a flag's own name, a model setting,
    a slip of the keyboard)."""
    named = named_by_flag(key)
    if named is not None:
        return f"vitlab.fit has no keyword {key!r}: the flag --{key.replace('_', '-')} is the keyword {named.keyword}"
    if key in _MODEL_SETTINGS:
        flag = MODEL_FIELDS.get(key)
        return (f"vitlab.fit has no keyword {key!r}: it is a model setting; pass "
                f"{f'{flag}=… (the --{flag} flag) or ' if flag else ''}model_args={{{key!r}: …}}")
    close = closest(key, sorted(_KEYWORDS | _MODEL_SETTINGS))
    if close in _MODEL_SETTINGS:
        return f"vitlab.fit has no keyword {key!r}; did you mean the model setting model_args={{{close!r}: …}}?"
    if close:
        return f"vitlab.fit has no keyword {key!r}; did you mean {close}?"
    return (f"vitlab.fit has no keyword {key!r}: its keywords are vitlab train's settings (help(vitlab.fit)), a "
            "model's own settings go in model_args")


def _check_call(recipe: Any, config_file: Any, progress: Any) -> None:
    """fit's own arguments: TypeError naming the one of the wrong type."""
    if recipe is not None and not isinstance(recipe, str):
        raise TypeError(f"recipe must be a recipe name (str; `vitlab recipes` lists them), got {type(recipe).__name__}")
    if config_file is not None and not isinstance(config_file, str | os.PathLike):
        raise TypeError(f"config_file must be a path (str or os.PathLike), got {type(config_file).__name__}")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, got {type(progress).__name__}")


def train_resolved(resolved: Resolved, verb: str, say: Callable[[str], None]) -> Any:
    """The run (or the learning-rate sweep) of prepared settings, as `vitlab train`/`finetune` and `vitlab.fit`
    both perform it: the first process of a job says the result line (or the sweep's table) and adds it to the
    run's console.log. Returns the RunResult, or the SweepResult of a sweep. A library call tunes the process's
    allocator as the command line does (`tune_for_compute`; `VITLAB_MALLOC_TUNING=0` opts out), so that a run
    from Python trains at the command line's speed."""
    tune_for_compute()
    first = int(os.environ.get("RANK", "0")) == 0
    if resolved.config.lr_sweep:
        from vitlab.train.sweep import format_table, run_sweep

        sweep = run_sweep(resolved)
        if first:
            say(format_table(sweep))
        return sweep
    result = run(resolved)
    if first:
        line = result_line(result, verb)
        say(line)
        append_to_console_log(result.out_dir, line)
    return result


@contextmanager
def _console(progress: bool) -> Iterator[None]:
    """vitlab's INFO lines on stderr, as `vitlab train` prints them, for the duration of the call; nothing
    changes where the program configured logging itself (a handler on the root or `vitlab` logger)."""
    logger = logging.getLogger("vitlab")
    if not progress or logger.handlers or logging.getLogger().handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
