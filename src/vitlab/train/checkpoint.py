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

import json
import os
import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from vitlab.errors import WeightsError
from vitlab.files.outputs import storage_error
from vitlab.files.rundir import CHECKPOINTS, MANIFEST, STATE, WEIGHTS, list_checkpoints, sha256_file, step_dir
from vitlab.models.config import ModelConfig
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
    """vitlab safetensors (atomic): loadable by `vitlab.load`, class names (and `meta`) in the metadata."""
    save(WeightsHolder(state, config, class_names), path, meta=meta)


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
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        save_weights(tmp / WEIGHTS, weights, config, class_names, meta)
        _save_state(state, tmp / STATE)
        manifest: dict[str, Any] = {"step": step, "files": {}, **({"settings": settings} if settings else {})}
        for name in _FILES:
            _fsync(tmp / name)
            manifest["files"][name] = {"size": (tmp / name).stat().st_size, "sha256": sha256_file(tmp / name)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        _fsync(tmp / MANIFEST)
        if final.exists():  # the same step saved again (e.g. preempted right after a periodic save)
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:  # a full disk: the earlier checkpoints stay, the half-written one goes
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync(final.parent)  # the rename itself must reach the disk
    return final


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
    """(weights: a `vitlab.weights.checkpoint.Checkpoint` with config and state dict, training state). A file
    that passed its manifest but is not what vitlab writes (another program's pickle, `{}`, foreign weights) is a
    ValueError naming the checkpoint, never a traceback; pickles are never executed (weights_only)."""
    advice = f"move {path} aside to resume from the previous checkpoint"
    try:
        weights = read_vitlab(path / WEIGHTS)
    except (WeightsError, ValueError, OSError) as err:
        raise ValueError(f"checkpoint {path}: {WEIGHTS} is not vitlab weights ({_first_line(err)}); {advice}") from None
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol of a file it then refuses
            warnings.simplefilter("ignore")
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
