"""The layout of a run directory, read side: what marks a folder as a vitlab run or one checkpoint of it, where
the step checkpoints are, and whether one is intact. train/ writes this layout (train/checkpoint.py); every
reader (`vitlab.load`, `info`, `eval`, `--init`, resuming, the experiments) asks here. Pure file system: no torch.

    run/
        config.json, metrics.jsonl, console.log, curves.png, best.safetensors, model.safetensors (when complete)
        checkpoints/step_00001500/
            model.safetensors   vitlab weights (config + class names inside)
            state.pt            optimizer, scheduler, EMA, RNG states, step
            manifest.json       size and SHA-256 of the two files, written last
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

CHECKPOINTS = "checkpoints"
WEIGHTS = "model.safetensors"  # the final weights of a run, and the weights of each checkpoint
STATE = "state.pt"
MANIFEST = "manifest.json"
METRICS = "metrics.jsonl"
CONFIG = "config.json"

log = logging.getLogger("vitlab.rundir")


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step:08d}"


def is_checkpoint_dir(path: Path) -> bool:
    """One step checkpoint: a folder with its manifest."""
    return path.is_dir() and (path / MANIFEST).is_file()


def is_run_dir(path: Path) -> bool:
    """A folder a vitlab run wrote: metrics or checkpoints. timm and HF folders hold config.json and a
    model.safetensors too, but never these, so config.json alone does not make a run for a reader."""
    return path.is_dir() and ((path / METRICS).exists() or (path / CHECKPOINTS).is_dir())


def holds_run(out: Path) -> bool:
    """Whether `out` already holds a run that a new one must not overwrite: its config.json (recorded before
    anything else), metrics, or anything in checkpoints/."""
    checkpoints = out / CHECKPOINTS
    return (out / METRICS).exists() or (out / CONFIG).exists() or (
        checkpoints.is_dir() and any(checkpoints.iterdir()))


def run_dir_of(weights: str | Path) -> Path | None:
    """The run a weights argument belongs to: the run directory itself, a checkpoint directory in it
    (run/checkpoints/step_N), or a file in either (run/best.safetensors, run/checkpoints/step_N/model.safetensors);
    None for anything else."""
    path = Path(weights)
    if path.is_file():
        path = path.parent
    if path.parent.name == CHECKPOINTS and is_checkpoint_dir(path):
        path = path.parent.parent
    return path if is_run_dir(path) else None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_checkpoint(path: Path) -> str | None:
    """None if the checkpoint is complete and intact (every file of its manifest, size and SHA-256), else what
    is wrong with it."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError, RecursionError):
        return f"{MANIFEST} missing or unreadable"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(e, dict) and isinstance(e.get("size"), int)
                                              and isinstance(e.get("sha256"), str) for e in files.values()):
        return f"{MANIFEST} is not a vitlab checkpoint manifest (damaged)"
    for name, expect in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != expect["size"]:
            return f"{name} has {f.stat().st_size} bytes, expected {expect['size']} (truncated?)"
        if sha256_file(f) != expect["sha256"]:
            return f"{name} does not match its checksum (corrupt)"
    return None


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Step checkpoints, newest first (temporary folders of a checkpoint being written are not listed)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_")]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]), reverse=True)


def latest_valid_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint that passes verification; damaged newer ones are reported and skipped."""
    for path in list_checkpoints(run_dir):
        problem = verify_checkpoint(path)
        if problem is None:
            return path
        log.warning("checkpoint %s is damaged (%s); falling back to the previous one", path, problem)
    return None
