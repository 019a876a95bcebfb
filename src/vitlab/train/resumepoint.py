"""Where a resumed run continues from, decided once before the model is built:

1. the newest intact checkpoint (vitlab.files.rundir verifies manifests; damaged ones are skipped with a warning), its
   contents checked against the run: a training state vitlab wrote, weights of the run's architecture and
   classes, and the run's settings as the checkpoint recorded them (a config.json edited since is refused, naming
   the setting, instead of being trained with and credited to the recipe in the banner);
2. else the run's final weights (`model.safetensors`, whose metadata records the step they were trained to): a
   finished run whose checkpoints were deleted to save space continues from them with a fresh optimizer state
   (Adam's moments and SGD's momentum start at zero; the schedule is placed at their step), as the log says;
3. else step 0, but only for a run that never reached a checkpoint (killed before its first): a run whose history
   went past a checkpoint it no longer holds is refused, since retraining it from step 0 would replace its
   metrics.jsonl history and its weights with a new run's.

Anything wrong is a one-line ValueError naming the file and what to do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from vitlab.data.errors import DataError, describe_paths
from vitlab.errors import WeightsError
from vitlab.files.rundir import (
    CHECKPOINTS,
    CONFIG,
    METRICS,
    WEIGHTS,
    checkpoint_settings,
    latest_valid_checkpoint,
    list_checkpoints,
)
from vitlab.models.registry import build_model as build_from_config
from vitlab.train.checkpoint import read_training_checkpoint
from vitlab.train.resolve import SAFE_ON_RESUME
from vitlab.train.runlog import log
from vitlab.weights.vitlab_format import read_vitlab


@dataclass
class ResumePoint:
    path: Path  # the checkpoint directory (the final weights' file when continuing from them)
    model: nn.Module  # the trained module (the objective's wrapper), its weights loaded
    state: dict[str, Any]  # what write_checkpoint stored beside the weights (no "optimizer": start it fresh)


def find_resume_point(run_dir: Path, objective: Any, class_names: list[str], source: str, is_main: bool
                      ) -> ResumePoint | None:
    """The model of the newest intact checkpoint (its own architecture: --init is not read again) and the
    training state saved with it, else the run's final weights; None if the run never reached a checkpoint."""
    record = _stored_record(run_dir)
    ckpt = latest_valid_checkpoint(run_dir)
    if ckpt is None:
        return _without_checkpoint(run_dir, record, objective, class_names, is_main)
    advice = f"move {ckpt} aside to resume from the previous checkpoint"
    _check_settings(run_dir, record, ckpt)
    weights, state = read_training_checkpoint(ckpt)
    if list(state["class_names"]) != class_names:
        raise DataError(
            f"the classes of {source} differ from those of checkpoint {ckpt} "
            f"({describe_paths(list(state['class_names']), 5)}); resume on the same data"
        )
    _check_architecture(record, weights.config, f"checkpoint {ckpt}", advice)
    model = _load(objective, weights, state.get("objective", {}), f"checkpoint {ckpt}", advice)
    model.class_names = list(class_names)
    if is_main:
        log.info("resuming from %s (step %d)", ckpt, state["step"])
    return ResumePoint(ckpt, model.train(), state)


def _stored_record(run_dir: Path) -> dict[str, Any]:
    """The run's config.json as recorded before this resume rewrites it (resolve has already read it)."""
    try:
        record = json.loads((run_dir / CONFIG).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def _check_settings(run_dir: Path, record: dict[str, Any], ckpt: Path) -> None:
    """config.json against the settings the checkpoint was trained with: a setting that changes what the run
    computes (lr, model, data, …) must be the checkpoint's, or the edit is refused before it is trained with and
    credited, in the banner, to the source of the value it replaced; one a resume may change (steps, workers, …)
    may differ, with a warning unless a resume flag changed it."""
    trained = checkpoint_settings(ckpt) or {}
    sources = record.get("sources") if isinstance(record.get("sources"), dict) else {}
    for key, before in trained.items():
        if key in ("out", "resume") or key not in record:  # a moved run continues where it now is
            continue
        now = record[key]
        if json.dumps(now, sort_keys=True) == json.dumps(before, sort_keys=True):
            continue
        if key in SAFE_ON_RESUME:  # how long the run goes and what it reports, not what it computes: said, kept
            if sources.get(key) != "flag (on resume)":
                log.warning("%s says %s %s, checkpoint %s was trained with %s (edited, or changed by a resume that "
                            "did not record it): continuing with %s; a resume flag (--%s) is the way to change it",
                            run_dir / CONFIG, key, _show(now), ckpt, _show(before), _show(now), key.replace("_", "-"))
            continue
        raise ValueError(f"{run_dir / CONFIG} says {key} {_show(now)} but checkpoint {ckpt} was trained with "
                         f"{key} {_show(before)}: config.json was edited after the run started; put "
                         f"{_show(before)} back, or start a new run with another --out")


def _show(value: Any) -> str:
    return json.dumps(value)[:80]


def _check_architecture(record: dict[str, Any], config: Any, what: str, advice: str) -> None:
    """The weights' architecture against the one config.json recorded for the run (the keys both know)."""
    recorded = record.get("model_config")
    if not isinstance(recorded, dict):
        return
    held = json.loads(json.dumps(config.to_dict()))
    for key in sorted(set(held) & set(recorded) - {"name"}):  # the name describes, the other fields build
        if held[key] != recorded[key]:
            raise ValueError(f"{what} holds a model with {key} {_show(held[key])}, the run trains {key} "
                             f"{_show(recorded[key])} ({CONFIG}): the weights are not this run's; {advice}")


def _load(objective: Any, weights: Any, extras: dict[str, Any], what: str, advice: str) -> nn.Module:
    model = objective.wrap(build_from_config(weights.config))
    try:
        model.load_state_dict(objective.merge_state(weights.state_dict, extras))
    except (RuntimeError, KeyError, ValueError, TypeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ValueError(f"{what}: the weights do not fit the model they describe ({first}); {advice}") from None
    return model


def _without_checkpoint(run_dir: Path, record: dict[str, Any], objective: Any, class_names: list[str],
                        is_main: bool) -> ResumePoint | None:
    """The final weights, or step 0 for a run that never reached a checkpoint; refused otherwise."""
    logged = _last_logged_step(run_dir)
    if (run_dir / WEIGHTS).is_file():
        return _from_final_weights(run_dir, record, objective, class_names, logged, is_main)
    damaged = list_checkpoints(run_dir)
    if damaged or not _never_checkpointed(run_dir, record, logged):
        what = (f"none of its {len(damaged)} checkpoint(s) is intact (see above)" if damaged
                else f"its {CHECKPOINTS}/ holds no checkpoint")
        raise ValueError(f"{run_dir}: {what} and it has no final weights, but its {METRICS} goes to step "
                         f"{logged}: training again from step 0 would replace the run's history and weights; restore "
                         "its checkpoints, or start a new run with another --out")
    if is_main:
        log.info("no checkpoint in %s: starting from step 0", run_dir)
    return None


def _last_logged_step(run_dir: Path) -> int:
    """The highest step metrics.jsonl records (0 without any; torn or foreign lines are skipped here)."""
    last = 0
    try:
        lines = (run_dir / METRICS).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return 0
    for line in lines:
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError, RecursionError):
            continue
        if isinstance(step, int) and not isinstance(step, bool):
            last = max(last, step)
    return last


def _never_checkpointed(run_dir: Path, record: dict[str, Any], logged: int) -> bool:
    """Whether the history stops before the run's first checkpoint: the step record of a checkpoint's step is
    written just before the checkpoint, so a history at that step is a checkpoint deleted, unless the checkpoint
    was being written when the run died (its temporary folder is still there)."""
    steps = record.get("steps") if isinstance(record.get("steps"), int) else 0
    every = record.get("save_every") or record.get("eval_every") or 0
    first = min(every, steps) if isinstance(every, int) and every > 0 else steps
    being_written = any((run_dir / CHECKPOINTS).glob(".step_*.tmp*")) if (run_dir / CHECKPOINTS).is_dir() else False
    return logged < first or (logged == first and being_written)


def _from_final_weights(run_dir: Path, record: dict[str, Any], objective: Any, class_names: list[str], logged: int,
                        is_main: bool) -> ResumePoint:
    path = run_dir / WEIGHTS
    new_run = "start a new run with another --out (`vitlab finetune --init` starts one from these weights)"
    try:
        weights = read_vitlab(path)
    except (WeightsError, ValueError, OSError) as err:
        raise ValueError(f"{run_dir} holds no checkpoint, and its final weights {path} cannot be read "
                         f"({str(err).splitlines()[0][:200]}); {new_run}") from None
    step = weights.meta.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ValueError(f"{run_dir} holds no checkpoint, and its final weights {path} do not record the step they "
                         f"were trained to (written by an older vitlab): they cannot be continued; {new_run}")
    if logged > step:
        raise ValueError(f"{run_dir} holds no checkpoint; its final weights {path} are of step {step} but its "
                         f"{METRICS} goes to step {logged}: continuing from them would rewrite that history; "
                         f"restore its checkpoints, or {new_run}")
    extras = objective.split_state(objective.wrap(build_from_config(weights.config)).state_dict())[1]
    if extras:  # masked patch prediction: its prediction head is saved in checkpoints only
        raise ValueError(f"{run_dir} holds no checkpoint, and its final weights {path} lack the {objective.name} "
                         f"objective's own parameters ({', '.join(sorted(extras)[:3])}); {new_run}")
    held = weights.meta.get("class_names")
    if held is not None and list(held) != class_names:
        raise DataError(f"the classes of the data differ from those of {path} ({describe_paths(list(held), 5)}); "
                        "resume on the same data")
    advice = f"restore its checkpoints, or {new_run}"
    _check_architecture(record, weights.config, f"final weights {path}", advice)
    model = _load(objective, weights, {}, f"final weights {path}", advice)
    model.class_names = list(class_names)
    if is_main:
        ema = " (its EMA weights, which the EMA then starts from)" if record.get("ema") else ""
        log.warning("no intact checkpoint in %s: continuing from its final weights %s%s (step %d) with a fresh "
                    "optimizer state (moments and momentum start at zero, the learning-rate schedule is placed at step "
                    "%d)", run_dir, path, ema, step, step)
    state = {"step": step, "best": _best(run_dir, objective), "class_names": list(class_names)}
    return ResumePoint(path, model.train(), state)


def _best(run_dir: Path, objective: Any) -> dict[str, Any] | None:
    """The best validation of the run's history, as a checkpoint records it (best.safetensors is not replaced by
    a worse evaluation of the continued run)."""
    best = None
    for line in (run_dir / METRICS).read_text().splitlines() if (run_dir / METRICS).is_file() else []:
        try:
            r = json.loads(line)
            if r.get("split") != "val":
                continue
            score = float(objective.score(r))
        except (ValueError, AttributeError, KeyError, TypeError, RecursionError):
            continue
        if best is None or score > best["score"]:
            best = {"top1": r.get("top1"), "score": score, "step": r.get("step")}
    return best
