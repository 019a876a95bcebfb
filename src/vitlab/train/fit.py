"""Training from Python: `vitlab.fit(...)` does what `vitlab train` / `vitlab finetune` do, and returns the
trained model with the run's result.

    import vitlab
    result = vitlab.fit("finetune", init="vit_s16.safetensors", data="photos/", epochs=10, out="runs/photos")
    result.metrics["top1"], result.out_dir, result.model      # final validation metrics, run folder, the model

A thin layer over the command line's path: the settings are the flags' (TrainConfig fields as keywords, plus
`epochs`), resolved by `vitlab.train.resolve`, checked by `vitlab.train.fit.prepare` as the run would, trained
by `vitlab.train.run` (or `run_sweep` with `lr_sweep`). The console shows what the command line shows (the
banner, the time estimate, step and validation lines, a progress bar on a terminal, the final `done:` line)
unless `progress=False` or the program has set up logging itself.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from vitlab.data import build_datasets
from vitlab.files.rundir import CONFIG
from vitlab.train.resolve import Resolved, resolve
from vitlab.train.runlog import append_to_console_log, check_trackers, result_line, schedule_lines, settings_lines
from vitlab.train.trainer import RunResult, build_run_model, check_classes, objective_for, run, run_record
from vitlab.weights.load import load

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
    then every value by source and the notes; `resolved` as `prepare` returns it."""
    lines = settings_lines(resolved)
    return lines[:1] + schedule_lines(resolved, len(resolved.data.train)) + lines[1:]


def _model_config(resolved: Resolved) -> dict[str, Any]:
    """The configuration of the model the run saves: a resumed run's is its stored one (it continues from its
    checkpoint); otherwise the model is built as the run builds it, on the meta device."""
    cfg = resolved.config
    stored = Path(cfg.out) / CONFIG
    if cfg.resume and stored.is_file():
        return json.loads(stored.read_text())["model_config"]
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


def fit(recipe: str | None = None, *, config_file: str | None = None, progress: bool = True,
        **settings: Any) -> FitResult:
    """Train (fine-tune, with `init`) as the command line does; see the module doc. `recipe`: as `--recipe`
    (default: `demo`, or `finetune` with `init`); `config_file`: as `--config`; `settings`: the flags as
    TrainConfig fields (`data`, `init`, `out`, `lr`, `batch_size`, `steps` or `epochs`, …; paths as str or
    Path). ValueError (one line) for settings or data the run would refuse."""
    settings = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in settings.items()}  # as typed
    verb = "finetune" if settings.get("init") else "train"
    with _console(progress):
        resolved = prepare(resolve(recipe, settings, config_file=config_file, verb=verb))
        outcome = train_resolved(resolved, verb, say=lambda line: log.info("%s", line))
    if resolved.config.lr_sweep:
        model = load(outcome.out_dir)  # the run the sweep chose (its refit, if it made one)
        return FitResult(outcome.out_dir, "completed", resolved.config.steps, {"top1": outcome.test_top1},
                         seconds=outcome.seconds, model=model, sweep=outcome)
    model = load(outcome.weights) if outcome.weights is not None else None
    return FitResult(**{f.name: getattr(outcome, f.name) for f in fields(RunResult)}, model=model)


def train_resolved(resolved: Resolved, verb: str, say: Callable[[str], None]) -> Any:
    """The run (or the learning-rate sweep) of prepared settings, as `vitlab train`/`finetune` and `vitlab.fit`
    both perform it: the first process of a job says the result line (or the sweep's table) and adds it to the
    run's console.log. Returns the RunResult, or the SweepResult of a sweep."""
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
