"""Training from Python: `vitlab.fit(...)` does what `vitlab train` / `vitlab finetune` do, and returns the
trained model with the run's result.

    import vitlab
    result = vitlab.fit("finetune", init="vit_s16.safetensors", data="photos/", epochs=10, out="runs/photos")
    result.metrics["top1"], result.out_dir, result.model      # final validation metrics, run folder, the model

A thin layer over the command line's path: the settings are the flags' (TrainConfig fields as keywords, plus
`epochs`), resolved by `vitlab.train.resolve`, checked by `vitlab.train.preview.prepare` as the run would, trained
by `vitlab.train.run` (or `run_sweep` with `lr_sweep`). The console shows what the command line shows (the
banner, the time estimate, step and validation lines, a progress bar on a terminal, the final `done:` line)
unless `progress=False` or the program has set up logging itself.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from vitlab.train.banner import append_to_console_log, result_line
from vitlab.train.loop import RunResult, run
from vitlab.train.preview import prepare
from vitlab.train.resolve import resolve
from vitlab.weights.load import load

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
        if resolved.config.lr_sweep:
            return _sweep(resolved)
        result = run(resolved)
        line = result_line(result, verb)
        log.info("%s", line)
        append_to_console_log(result.out_dir, line)
    model = load(result.weights) if result.weights is not None else None
    return FitResult(**{f.name: getattr(result, f.name) for f in fields(RunResult)}, model=model)


def _sweep(resolved: Any) -> FitResult:
    from vitlab.train.sweep import format_table, run_sweep

    sweep = run_sweep(resolved)
    log.info("%s", format_table(sweep))
    model = load(sweep.out_dir)  # the run the sweep chose (its refit, if it made one)
    return FitResult(sweep.out_dir, "completed", resolved.config.steps, {"top1": sweep.test_top1},
                     seconds=sweep.seconds, model=model, sweep=sweep)


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
