"""Checkpoints, write side: a directory per step (the layout and its verification are vitlab.files.rundir's), written
atomically; reading one back for resuming.

    run/checkpoints/step_00001500/
        model.safetensors   vitlab weights (config + class names inside): `vitlab.load` reads it
        state.pt            optimizer, scheduler, EMA, RNG states of every process, step (= data position)
        manifest.json       size and SHA-256 of the two files, and the run's settings, written last

The directory is assembled under a temporary name, flushed to disk and renamed: a reader sees all of it or
none of it. A file damaged later (a truncated copy, a full disk on another tool) fails its manifest check and
resuming falls back to the previous checkpoint.
"""

from __future__ import annotations

import copy
import errno
import fcntl
import json
import os
import pickle
import random
import shutil
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from vitlab.data.errors import describe_paths
from vitlab.errors import DataError, WeightsError, by_surface, setting
from vitlab.files.digest import sha256_file
from vitlab.files.outputs import storage_error
from vitlab.files.reading import check_regular, read_text_regular, resolved
from vitlab.files.rundir import (
    CHECKPOINTS,
    CONFIG,
    CONSOLE_LOG,
    LOCK,
    MANIFEST,
    METRICS,
    SHARDS,
    STATE,
    WEIGHTS,
    enclosing_run,
    holds_run,
    is_sharded_checkpoint,
    is_sweep_dir,
    latest_valid_checkpoint,
    list_checkpoints,
    shard_files,
    step_dir,
)
from vitlab.models.config import ModelConfig, config_from_dict
from vitlab.models.registry import build_model as build_from_config
from vitlab.train.config import TrainConfig
from vitlab.train.console import log
from vitlab.train.distributed import Dist, all_gather_objects, barrier, collective_timeout
from vitlab.train.finetune import Ema
from vitlab.train.optim import replan_schedule
from vitlab.train.resolution import json_excerpt
from vitlab.weights.vitlab_format import read_vitlab, save

_FILES = (WEIGHTS, STATE)


class WeightsHolder:
    """What `vitlab.save` needs from a model (state_dict, config, class_names), for a state dict that was
    gathered from shards or taken from EMA weights."""

    def __init__(self, state: dict[str, torch.Tensor], config: ModelConfig, class_names: list[str] | None):
        self._state, self.config, self.class_names = state, config, class_names

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state


def save_weights(
    path: Path, state: dict[str, torch.Tensor], config: ModelConfig, class_names: list[str],
    meta: dict[str, Any] | None = None,
) -> None:
    """vitlab safetensors (atomic): loadable by `vitlab.load`, class names (and `meta`) in the metadata. Written by
    the run's own training, so its own files may be replaced (`user_named=False`)."""
    save(WeightsHolder(state, config, class_names), path, meta=meta, user_named=False)


def weights_meta(cfg: Any) -> dict[str, Any]:
    """What a run's weights carry besides config and class names: how the run evaluated, so that
    `vitlab eval` on them evaluates the same way."""
    return {"eval_resize": cfg.eval_resize}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(
    run_dir: Path, step: int, weights: dict[str, torch.Tensor], config: ModelConfig,
    class_names: list[str], state: dict[str, Any], meta: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> Path:
    """Write step's checkpoint atomically; returns its directory. `settings`: the run's (TrainConfig.to_dict()),
    recorded in the manifest so that a resume can tell an edited config.json from the run that was trained."""
    final = step_dir(run_dir, step)
    tmp = temporary_step_dir(final, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        save_weights(tmp / WEIGHTS, weights, config, class_names, meta)
        _save_state(state, tmp / STATE)
        seal_checkpoint(tmp, final, step, list(_FILES), settings)
    except BaseException:  # a full disk: the earlier checkpoints stay, the half-written one goes
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def temporary_step_dir(final: Path, owner: int) -> Path:
    """Where a step's checkpoint is assembled before its rename: hidden, named after the writing process."""
    return final.with_name(f".{final.name}.tmp{owner}")


def seal_checkpoint(tmp: Path, final: Path, step: int, files: list[str], settings: dict[str, Any] | None) -> None:
    """Flush `files` of the assembled folder `tmp`, write the manifest (their sizes and SHA-256) last, and rename
    the folder to `final`: a reader sees the whole checkpoint or none of it."""
    manifest: dict[str, Any] = {"step": step, "files": {}, **({"settings": settings} if settings else {})}
    for name in files:
        _fsync(tmp / name)
        manifest["files"][name] = {"size": (tmp / name).stat().st_size, "sha256": sha256_file(tmp / name)}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _fsync(tmp / MANIFEST)
    if final.exists():  # the same step saved again (e.g. preempted right after a periodic save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(final.parent)  # the rename itself must reach the disk


def _save_state(state: dict[str, Any], path: Path) -> None:
    """torch.save, with a full disk reported as the OSError it is (torch wraps it in "unexpected pos …")."""
    try:
        torch.save(state, path)
    except RuntimeError as err:
        problem = storage_error(err, path, written=path)
        if problem is None:
            raise
        raise problem from None


# What a training state must hold to be resumed from, with the type each key's value must have.
_STATE_KEYS: dict[str, type | tuple[type, ...]] = {"step": int, "optimizer": dict, "scheduler": dict,
                                                   "rng": list, "class_names": list}


def read_training_checkpoint(path: Path) -> tuple[Any, dict[str, Any]]:
    """(weights: a `vitlab.weights.record.WeightsRecord` with config and state dict, training state). A file
    that passed its manifest but is not what vitlab writes (another program's pickle, `{}`, foreign weights) is a
    ValueError naming the checkpoint, never a traceback; pickles are never executed (weights_only)."""
    advice = f"move {path} aside to resume from the previous checkpoint"
    weights = None
    try:
        if not is_sharded_checkpoint(path):
            weights = read_vitlab(path / WEIGHTS)
    except (WeightsError, ValueError, OSError) as err:
        raise ValueError(f"checkpoint {path}: {WEIGHTS} is not vitlab weights ({_first_line(err)}); {advice}") from None
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol of a file it then refuses
            warnings.simplefilter("ignore")
            check_regular(path / STATE)
            state = torch.load(path / STATE, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(f"checkpoint {path}: {STATE} is a pickle of more than tensors and plain values (refused "
                         f"unexecuted), not a vitlab training state; {advice}") from None
    except Exception as err:  # struct, EOF, zip errors for junk
        raise ValueError(f"checkpoint {path}: {STATE} is not a vitlab training state ({type(err).__name__}: "
                         f"{_first_line(err)}); {advice}") from None
    problem = _state_problem(state)
    if problem:
        raise ValueError(f"checkpoint {path}: {STATE} {problem}, not a vitlab training state; {advice}")
    if weights is None:  # sharded: the architecture from the state, the tensors from the shards (Checkpointer)
        try:
            weights = SimpleNamespace(config=config_from_dict(state["model_config"]), state_dict=None)
        except (KeyError, ValueError, TypeError) as err:
            raise ValueError(f"checkpoint {path}: {STATE} describes no vitlab model ({_first_line(err)}); "
                             f"{advice}") from None
    return weights, state


def _state_problem(state: Any) -> str | None:
    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}"
    for key, kind in _STATE_KEYS.items():
        if key not in state:
            return f"has no {key!r}"
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            return f"has a {type(state[key]).__name__} for {key!r}"
    if state["step"] < 0 or not all(isinstance(n, str) for n in state["class_names"]):
        return "has a negative step or class names that are not text"
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:200]


def prune_checkpoints(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step checkpoints (and stale temporary directories)."""
    for path in list_checkpoints(run_dir)[keep_last:]:
        shutil.rmtree(path, ignore_errors=True)
    root = run_dir / CHECKPOINTS
    for tmp in root.glob(".step_*.tmp*") if root.is_dir() else []:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------------------------------
# Where a resumed run continues from, decided once before the model is built:
#
# 1. the newest intact checkpoint (vitlab.files.rundir verifies manifests; damaged ones are skipped with a warning), its
#    contents checked against the run: a training state vitlab wrote, weights of the run's architecture and
#    classes (the run's settings were held to those its checkpoints recorded when they were resolved:
#    vitlab.train.resolution.recorded_settings);
# 2. else the run's final weights (`model.safetensors`, whose metadata records the step they were trained to): a
#    finished run whose checkpoints were deleted to save space continues from them with a fresh optimizer state
#    (Adam's moments and SGD's momentum start at zero; the schedule is placed at their step), as the log says;
# 3. else step 0, but only for a run that never reached a checkpoint (killed before its first): a run whose history
#    went past a checkpoint it no longer holds is refused, since retraining it from step 0 would replace its
#    metrics.jsonl history and its weights with a new run's.
#
# Anything wrong is a one-line ValueError naming the file and what to do.

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
    weights, state = read_training_checkpoint(ckpt)
    if list(state["class_names"]) != class_names:
        raise DataError(
            f"the classes of {source} differ from those of checkpoint {ckpt} "
            f"({describe_paths(list(state['class_names']), 5)}); resume on the same data"
        )
    _check_architecture(record, weights.config, f"checkpoint {ckpt}", advice)
    if weights.state_dict is None:  # sharded: Checkpointer.restore reads the shards into the wrapped model
        model = objective.wrap(build_from_config(weights.config))
    else:
        model = _load(objective, weights, state.get("objective", {}), f"checkpoint {ckpt}", advice)
    model.class_names = list(class_names)
    if is_main:
        log.info("resuming from %s (step %d)", ckpt, state["step"])
    return ResumePoint(ckpt, model.train(), state)


def _stored_record(run_dir: Path) -> dict[str, Any]:
    """The run's config.json as recorded before this resume rewrites it (resolve has already read it)."""
    try:
        record = json.loads(read_text_regular(run_dir / CONFIG))
    except (OSError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def _check_architecture(record: dict[str, Any], config: Any, what: str, advice: str) -> None:
    """The weights' architecture against the one config.json recorded for the run (the keys both know)."""
    recorded = record.get("model_config")
    if not isinstance(recorded, dict):
        return
    held = json.loads(json.dumps(config.to_dict()))
    for key in sorted(set(held) & set(recorded) - {"name"}):  # the name describes, the other fields build
        if held[key] != recorded[key]:
            raise ValueError(f"{what} holds a model with {key} {json_excerpt(held[key])}, the run trains {key} "
                             f"{json_excerpt(recorded[key])} ({CONFIG}): the weights are not this run's; {advice}")


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
                         f"its checkpoints, or start a new run with another {setting('out', value='DIR')}")
    if is_main:
        log.info("no checkpoint in %s: starting from step 0", run_dir)
    return None


def _last_logged_step(run_dir: Path) -> int:
    """The highest step metrics.jsonl records (0 without any; torn or foreign lines are skipped here)."""
    last = 0
    try:
        lines = read_text_regular(run_dir / METRICS).splitlines()
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
    new_run = (f"start a new run with another {setting('out', value='DIR')} ("
               + by_surface("`vitlab finetune --init`", "vitlab.fit('finetune', init=...)")
               + " starts one from these weights)")
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
    for line in read_text_regular(run_dir / METRICS).splitlines() if (run_dir / METRICS).is_file() else []:
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


# --------------------------------------------------------------------------------------------------------------
# The run directory, write side: what may be written into, by whom, and checked before step 1 (its layout, and
# what marks a folder as a run, are vitlab.files.rundir's).
#
# - `--out` must be new, empty, or a vitlab run (continued only with --resume): an export folder or any other
#   non-empty folder is never written into.
# - One training at a time: an exclusive lock (`.vitlab.lock`, flock) is held for the run's life. The OS releases it
#   when the process dies, so a run killed with -9 never blocks its own `--resume`. The lock belongs to the training
#   process alone: a forked child (a loader worker) closes its inherited copy at once, since a flock lives as long as
#   any descriptor of its open file, and orphaned workers outlive a killed parent by seconds.
# - The folder and its `checkpoints/` are probed for writing before step 1, so a read-only or full disk is one line
#   at the start instead of a traceback after the last step.

OWN_FILES = {LOCK, CONSOLE_LOG}  # what a run that failed before its first record leaves behind
_HELD: set[int] = set()  # descriptors of the run locks this process holds


def _drop_inherited_locks() -> None:
    """In a forked child: close the run-lock descriptors inherited from the parent (the parent keeps its own)."""
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_drop_inherited_locks)


def check_out(out: Path, resume: bool) -> None:
    """ValueError (one line) unless `out` may receive this run."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{setting('out', value=str(out))} is a file, not a folder; choose a new folder for the run")
    around = enclosing_run(out)  # a sweep's own runs sit right inside it
    if around is not None and not (is_sweep_dir(around) and resolved(out).parent == around):
        raise ValueError(f"{setting('out', value=str(out))} lies inside the run or sweep {around}; choose a folder "
                         "outside it")
    if not out.is_dir():
        return
    if holds_run(out):
        if not resume:
            raise ValueError(f"{out} already holds a run; pass {setting('resume', value=True)} to continue it or "
                             f"choose another {setting('out', value='DIR')}")
        return
    foreign = sorted(p.name for p in out.iterdir() if p.name not in OWN_FILES)
    if foreign:
        raise ValueError(f"{setting('out', value=str(out))} is not empty and not a vitlab run (it holds {foreign[0]!r}"
                         f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}); choose a new or empty "
                         "folder")


def probe_writable(folder: Path) -> None:
    """Create `folder` if needed and write a file into it; a one-line ValueError naming the cause otherwise."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".vitlab-probe-{os.getpid()}"
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as err:
        raise ValueError(f"cannot write to {folder} ({err.strerror or err}); "
                         f"choose a writable {setting('out')}") from None


class RunLock:
    """An exclusive lock on the run directory for this process's life (rank 0 of a job takes it)."""

    def __init__(self, out: Path):
        self.path = out / LOCK
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            self.fd = None
            if err.errno in (errno.EAGAIN, errno.EACCES):
                raise ValueError(f"{out} is in use by another vitlab run (process {holder}); wait for it to end or "
                                 f"choose another {setting('out', value='DIR')}") from None
            raise ValueError(f"cannot lock {self.path} ({err.strerror}); choose another {setting('out', value='DIR')}"
                             ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        _HELD.add(self.fd)

    def release(self) -> None:
        if self.fd is not None:
            _HELD.discard(self.fd)
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def prepare_run_dir(out: Path, resume: bool, is_main: bool) -> RunLock | None:
    """Check, create, probe and lock the run directory: the main process does it all (the others would see its
    probe and lock files appear while they look; its refusal ends the whole job)."""
    if not is_main:
        return None
    check_out(out, resume)
    probe_writable(out)
    lock = RunLock(out)
    try:
        if (out / CHECKPOINTS).is_dir():  # a resumed run's (created later with the folder's permissions)
            probe_writable(out / CHECKPOINTS)
    except BaseException:
        lock.release()
        raise
    return lock


# --------------------------------------------------------------------------------------------------------------
# The trainer's checkpointer, a component the trainer asks (as torchtitan's trainer asks its CheckpointManager):
# on resume it finds the newest intact checkpoint and puts its state back; during the run it writes a step's
# checkpoint (weights, optimizer, scheduler, EMA, the RNG of every process) and keeps the last k, and it writes the
# evaluated weights (best.safetensors, model.safetensors). DDP and one-process states are gathered whole and rank 0
# writes them; an FSDP run of several processes writes shards, each process its own, optionally in the background
# (--async-save: the step folder appears, sealed, once every shard is on disk).

__all__ = ["Checkpointer", "ResumePoint", "find_resume_point"]

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass
class PendingSave:
    """A sharded checkpoint being written in the background: the write's future, the folder it assembles and
    where it goes, and (rank 0) the training state sealed beside the shards once they are all written."""

    future: Any
    tmp: Path
    final: Path
    step: int
    state: dict[str, Any] | None


class Checkpointer:
    """Writes and restores the state of one run: the model (as trained: sharded or whole), its optimizer,
    schedule and EMA. `last` is the newest checkpoint written or resumed from."""

    def __init__(self, cfg: TrainConfig, d: Dist, objective: Any, model: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any, ema: Ema | None, class_names: list[str], last: Path | None = None,
                 tuning: Any = None):
        self.cfg, self.d, self.objective = cfg, d, objective
        self.run_dir = Path(cfg.out)
        self.model, self.optimizer, self.scheduler, self.ema = model, optimizer, scheduler, ema
        self.data_class_names = list(class_names)  # what resuming checks the data against
        # The class names the saved weights carry: none for an encoder without a head (self-supervision).
        self.class_names = self.data_class_names if model.config.num_classes else None
        self.last = last
        self.tuning = tuning  # vitlab.train.finetune: LoRA's weights are saved merged, its adapters kept for resume
        self.pending: PendingSave | None = None
        # Background writes talk over a gloo group of their own: torch's async save needs a CPU backend, and its
        # collectives then never interleave with the training step's on the default group.
        self.writers = (torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=collective_timeout()))
                        if cfg.async_save and self.sharded else None)
        if cfg.async_save and not self.sharded and d.is_main:
            log.info("%s: this run's checkpoints are whole, written in place (shards are written in the background:"
                     " %s with several processes)", setting("async_save"), setting("fsdp"))

    def restore(self, state: dict[str, Any]) -> None:
        """Optimizer, schedule, EMA and this process's random streams as `state` saved them; a state without an
        optimizer (the run's final weights, its checkpoints gone) keeps the fresh optimizer, the schedule placed
        at its step. A state that does not fit the model is a one-line ValueError naming the checkpoint."""
        if state.get("optimizer") is None:
            _place_schedule(self.scheduler, int(state["step"]))  # built for --steps already: no re-planning
            torch.manual_seed(self.cfg.seed + 1 + 1_000_003 * self.d.rank)
            return
        try:
            self._restore(state)
        except (KeyError, ValueError, RuntimeError, TypeError, IndexError, AttributeError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise ValueError(f"checkpoint {self.last}: its training state does not fit the model ({first}); move "
                             "it aside to resume from the previous checkpoint") from None

    def _restore(self, state: dict[str, Any]) -> None:
        if state.get("sharded"):
            self._restore_shards(state)
        else:
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=_FULL)
        self.scheduler.load_state_dict(state["scheduler"])
        planned_for = replan_schedule(self.scheduler, self.cfg.steps)  # --resume --steps N: extend, never lr 0
        if planned_for is not None and self.d.is_main:
            log.info("learning-rate schedule re-planned from %d to %d steps: step %d takes lr %.3g", planned_for,
                     self.cfg.steps, int(state["step"]) + 1, self.scheduler.get_last_lr()[0])
        if self.ema is not None and state.get("ema") is not None:
            with self.ema.applied(self.model):
                set_model_state_dict(self.model, state["ema"], options=_FULL)
                self.ema.capture(self.model)
        rngs = state["rng"]
        if self.d.rank < len(rngs):
            set_rng_state(rngs[self.d.rank])
        else:  # resumed on more processes than saved: the extra ones start a fresh stream
            torch.manual_seed(self.cfg.seed + 1 + 1_000_003 * self.d.rank)

    def _restore_shards(self, state: dict[str, Any]) -> None:
        """The model, optimizer and EMA from the checkpoint's shards, into this run's layout: torch.distributed
        .checkpoint reads each process's part of every tensor whatever the number of processes that wrote them."""
        parts = self._shard_parts(state["sharded"])
        with warnings.catch_warnings():  # one process without a process group: torch warns that it assumes so
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(parts, checkpoint_id=str(Path(self.last) / SHARDS))
        set_model_state_dict(self.model, self.objective.merge_state(parts["weights"], parts["extras"]))
        set_optimizer_state_dict(self.model, self.optimizer, parts["optimizer"])
        if "ema" in parts:
            with self.ema.applied(self.model):
                set_model_state_dict(self.model, parts["ema"])
                self.ema.capture(self.model)

    def _shard_parts(self, saved: list[str]) -> dict[str, Any]:
        """What the shards hold, as this process holds it (its own shards under FSDP, whole tensors otherwise):
        the live parameters and optimizer state, which loading fills in place, and a copy for the EMA."""
        weights, extras = self.objective.split_state(get_model_state_dict(self.model))
        parts: dict[str, Any] = {"weights": weights, "extras": extras,
                                 "optimizer": get_optimizer_state_dict(self.model, self.optimizer)}
        if "ema" in saved and self.ema is not None:
            with self.ema.applied(self.model):
                parts["ema"] = {k: v.clone() for k, v in get_model_state_dict(self.model).items()}
        return parts

    @property
    def sharded(self) -> bool:
        """Whether checkpoints are written as shards: an FSDP run of several processes (each writes its own)."""
        return bool(self.cfg.fsdp) and self.d.world > 1

    def save(self, step: int, training: dict[str, Any]) -> Path:
        """The checkpoint of `step`; `training`: the trainer's own state to resume (best, logged-loss window). A
        background write still under way is completed first: one checkpoint is in flight at a time."""
        self.wait()
        if self.sharded:
            return self._save_shards(step, training)
        full = get_model_state_dict(self.model, options=_FULL)
        weights, extras = self.objective.split_state(self._merged_weights(full))
        optimizer = get_optimizer_state_dict(self.model, self.optimizer, options=_FULL)
        ema = None
        if self.ema is not None:
            # Cloned: on CPU the state dict holds the live parameters, which leaving the block sets back to the
            # trained weights (checkpoints held those as "ema", and a resumed EMA restarted from them).
            with self.ema.applied(self.model):
                ema = {k: v.clone() for k, v in get_model_state_dict(self.model, options=_FULL).items()}
        rngs = all_gather_objects(rng_state())
        path = step_dir(self.run_dir, step)
        if self.d.is_main:
            state = {
                "step": step,  # also the data position: the loader restarts at this step's global batch
                "samples_seen": step * self.cfg.batch_size, "optimizer": optimizer,
                "scheduler": self.scheduler.state_dict(), "ema": ema, "rng": rngs,
                "class_names": self.data_class_names, "world_size": self.d.world,
                "objective": extras,  # self-supervision: mask token and prediction head, not in the weights file
                **self._tuning_state(full),  # LoRA's adapters and the W0 they add to
                **training,
            }
            path = write_checkpoint(self.run_dir, step, weights, self.model.config, self.class_names, state,
                                    weights_meta(self.cfg), settings=self.cfg.to_dict())
            prune_checkpoints(self.run_dir, self.cfg.keep_last)
        barrier()
        self.last = path
        return path

    def _save_shards(self, step: int, training: dict[str, Any]) -> Path:
        """Every process writes its shards of the model, optimizer and EMA into one temporary step folder (named by
        rank 0); rank 0 then adds the rest of the state, the manifest of all the files, and renames the folder."""
        final = step_dir(self.run_dir, step)
        tmp = Path(str(all_gather_objects(str(temporary_step_dir(final, os.getpid())))[0]))
        if self.d.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / SHARDS).mkdir(parents=True)
        barrier()
        try:
            parts = self._shard_parts(["ema"])  # the EMA's weights too, when the run keeps one
            rngs = all_gather_objects(rng_state())
            state = None
            if self.d.is_main:
                meta = {**weights_meta(self.cfg), **({"class_names": self.class_names} if self.class_names else {})}
                state = {
                    "step": step, "samples_seen": step * self.cfg.batch_size,
                    "optimizer": {},  # in the shards, as are the weights and the EMA
                    "sharded": sorted(parts), "model_config": self.model.config.to_dict(), "weights_meta": meta,
                    "scheduler": self.scheduler.state_dict(), "rng": rngs, "class_names": self.data_class_names,
                    "world_size": self.d.world, **training,
                }
                if self.writers is not None:  # this step's: training goes on while the background write runs
                    state = copy.deepcopy(state)
            if self.writers is not None:  # copied here (staged), written by a thread of torch's
                future = dcp.async_save(parts, checkpoint_id=str(tmp / SHARDS), process_group=self.writers)
                self.pending = PendingSave(future, tmp, final, step, state)
                return final
            dcp.save(parts, checkpoint_id=str(tmp / SHARDS))
            self._seal(PendingSave(None, tmp, final, step, state))
        except BaseException:
            if self.d.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        barrier()
        return final

    def _seal(self, save: PendingSave) -> None:
        """Rank 0, once every shard is written: the training state, the manifest of all the files, the rename,
        `keep_last`. Every process then knows the checkpoint as the last one."""
        if self.d.is_main:
            _save_state(save.state, save.tmp / STATE)
            seal_checkpoint(save.tmp, save.final, save.step, [STATE, *shard_files(save.tmp)], self.cfg.to_dict())
            prune_checkpoints(self.run_dir, self.cfg.keep_last)
        self.last = save.final

    def poll(self) -> None:
        """Seal a background write that has finished (no collective: each process looks at its own future; rank
        0's completes only once every process's shards and the checkpoint's metadata are written)."""
        if self.pending is not None and self.pending.future.done():
            self._complete()

    def wait(self) -> None:
        """Complete a background write (a preemption's or the run's last checkpoint, the next save): every process
        waits for its part, rank 0 seals the folder."""
        if self.pending is not None:
            self._complete()
            barrier()

    def _complete(self) -> None:
        save, self.pending = self.pending, None
        try:
            save.future.result()
            self._seal(save)
        except BaseException:
            if self.d.is_main:
                shutil.rmtree(save.tmp, ignore_errors=True)
            raise

    def abandon(self) -> None:
        """After a failure (a peer gone, an error elsewhere): let a background write end by itself, without a
        collective of ours, and leave no folder behind it; the last sealed checkpoint stays the one to resume.
        A write whose peer died fails as soon as gloo sees the closed connection."""
        save, self.pending = self.pending, None
        if save is None:
            return
        try:
            save.future.result(timeout=collective_timeout())
        except BaseException:  # its error is not this failure's: the caller's is reported
            pass
        if self.d.is_main:
            shutil.rmtree(save.tmp, ignore_errors=True)

    def save_weights(self, path: Path, step: int | None = None) -> None:
        """The weights as currently loaded in the model (EMA inside `ema.applied`), gathered from shards; `step`
        recorded in their metadata (the final weights': a run whose checkpoints were deleted continues from them)."""
        weights, _ = self.objective.split_state(self._merged_weights(get_model_state_dict(self.model, options=_FULL)))
        if self.d.is_main:
            meta = {**weights_meta(self.cfg), **({"step": step} if step is not None else {})}
            save_weights(path, weights, self.model.config, self.class_names, meta)
        barrier()

    def _tuning_state(self, state: dict[str, Any]) -> dict[str, Any]:
        saved = self.tuning.resume_state(state) if self.tuning is not None else None
        return {"tuning": saved} if saved is not None else {}

    def _merged_weights(self, state: dict[str, Any]) -> dict[str, Any]:
        """The model's state as plain vitlab weights (LoRA's adapters merged by peft)."""
        return self.tuning.weights(state) if self.tuning is not None else state


def _place_schedule(scheduler: Any, step: int) -> None:
    """A fresh LambdaLR as if it had been stepped `step` times (stepping a million times would take seconds)."""
    scheduler.last_epoch = step
    lrs = [base * factor(step) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs


def rng_state() -> dict[str, Any]:
    """Every generator the step may draw from, in types `torch.load(weights_only=True)` accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
