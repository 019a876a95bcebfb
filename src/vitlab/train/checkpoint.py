"""Checkpoints, write side: a directory per step (the layout and its verification are vitlab.rundir's), written
atomically; reading one back for resuming.

    run/checkpoints/step_00001500/
        model.safetensors   vitlab weights (config + class names inside): `vitlab.load` reads it
        state.pt            optimizer, scheduler, EMA, RNG states of every process, step (= data position)
        manifest.json       size and SHA-256 of the two files, written last

The directory is assembled under a temporary name, flushed to disk and renamed: a reader sees all of it or
none of it. A file damaged later (a truncated copy, a full disk on another tool) fails its manifest check and
resuming falls back to the previous checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from ..models.config import ModelConfig
from ..outputs import storage_error
from ..rundir import CHECKPOINTS, MANIFEST, STATE, WEIGHTS, list_checkpoints, sha256_file, step_dir
from ..weights.io import read_vitlab, save

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
) -> Path:
    """Write step's checkpoint atomically; returns its directory."""
    final = step_dir(run_dir, step)
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        save_weights(tmp / WEIGHTS, weights, config, class_names, meta)
        _save_state(state, tmp / STATE)
        manifest = {"step": step, "files": {}}
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


def read_checkpoint(path: Path) -> tuple[Any, dict[str, Any]]:
    """(weights: a `vitlab.weights.checkpoint.Checkpoint` with config and state dict, training state)."""
    weights = read_vitlab(path / WEIGHTS)
    state = torch.load(path / STATE, map_location="cpu", weights_only=True)
    return weights, state


def prune_checkpoints(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step checkpoints (and stale temporary directories)."""
    for path in list_checkpoints(run_dir)[keep_last:]:
        shutil.rmtree(path, ignore_errors=True)
    root = run_dir / CHECKPOINTS
    for tmp in root.glob(".step_*.tmp*") if root.is_dir() else []:
        shutil.rmtree(tmp, ignore_errors=True)
