"""What a run checks before its first step, done before it starts: `--print-config` shows exactly what the run
will do and refuses what the run refuses.

`prepare` makes the run's own checks on resolved settings (trackers installed, the sweep's settings, the
datasets built with their classes and splits checked, as vitlab.train.loop does); `planned_record` is the
config.json the run will write, model configuration included (the model built on the meta device: no memory, no
initialisation); `planned_lines` is what `--print-config` prints, the banner's schedule and settings lines.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from vitlab.data import build_datasets
from vitlab.files.rundir import CONFIG
from vitlab.train.banner import schedule_lines, settings_lines
from vitlab.train.objective import objective_for
from vitlab.train.resolve import Resolved
from vitlab.train.runlog import check_trackers
from vitlab.train.setup import build_model, check_classes, run_record


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
        model = build_model(cfg, resolved.data.class_names, objective_for(cfg).has_head, resolved.init)
    return model.config.to_dict()
