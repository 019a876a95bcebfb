"""The layout of a run directory, read side: what marks a folder as a vitlab run or one checkpoint of it, where
the step checkpoints are, and whether one is intact. train/ writes this layout (train/checkpoint.py); every
reader (`vitlab.load`, `info`, `eval`, `--init`, resuming, the experiments) asks here. Pure file system: no torch.

    run/
        config.json, metrics.jsonl, console.log, curves.png, best.safetensors, model.safetensors (when complete)
        checkpoints/step_00001500/
            model.safetensors   vitlab weights (config + class names inside)
            state.pt            optimizer, scheduler, EMA, RNG states, step
            manifest.json       size and SHA-256 of the two files, the run's settings, written last

    A sharded checkpoint (an FSDP run of several processes) holds, instead of model.safetensors and the
    optimizer in state.pt, the files of torch.distributed.checkpoint, each process writing its own shards:
        checkpoints/step_00001500/
            shards/.metadata, shards/__0_0.distcp, shards/__1_0.distcp, …
            state.pt            the rest (scheduler, RNG states, step) and the model's config and class names
            manifest.json       size and SHA-256 of state.pt and of every file in shards/, written last

Only `step_<digits>` folders are checkpoints: anything else in checkpoints/ (a stray `step_abc`, a copy) is left
alone, never read or pruned, with a warning when resuming. A manifest must list exactly its checkpoint's files by
plain name (`shards/<name>` for a shard): one naming a file outside its folder, or listing none, makes the
checkpoint damaged, not intact.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from vitlab.files.digest import sha256_file
from vitlab.files.reading import not_regular, read_text_regular, resolved, special_kind

CHECKPOINTS = "checkpoints"
WEIGHTS = "model.safetensors"  # the final weights of a run, and the weights of each checkpoint
STATE = "state.pt"
MANIFEST = "manifest.json"
METRICS = "metrics.jsonl"
CONFIG = "config.json"
BEST = "best.safetensors"  # the weights of the best validation step
CURVES = "curves.png"
CONSOLE_LOG = "console.log"  # every line the run printed
LOCK = ".vitlab.lock"  # held while a process writes the run
TENSORBOARD = "tensorboard"  # event files, with --tb
WANDB = "wandb"  # the Weights & Biases run and its id, with --wandb
CHECKPOINT_FILES = (WEIGHTS, STATE)  # what a manifest lists, no more and no fewer
SHARDS = "shards"  # a sharded checkpoint's folder of torch.distributed.checkpoint files
SHARDS_INDEX = f"{SHARDS}/.metadata"  # written last by torch.distributed.checkpoint: which shard holds what
_SHARD_NAME = re.compile(rf"{SHARDS}/(\.metadata|__\d+_\d+\.distcp)")
RUN_FILES = (CONFIG, METRICS, WEIGHTS, BEST, CURVES, CONSOLE_LOG, LOCK)  # a run's own files at its top level
RUN_FOLDERS = (CHECKPOINTS, TENSORBOARD, WANDB)  # a run's own folders: everything in them is the run's
_STEP_NAME = re.compile(r"step_(\d+)")

log = logging.getLogger("vitlab.files.rundir")


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step:08d}"


def is_checkpoint_dir(path: Path) -> bool:
    """One step checkpoint: a folder with its manifest."""
    return path.is_dir() and (path / MANIFEST).is_file()


def is_run_dir(path: Path) -> bool:
    """A folder a vitlab run wrote: metrics or checkpoints. timm and HF folders hold config.json and a
    model.safetensors too, but never these, so config.json alone does not make a run for a reader."""
    return path.is_dir() and ((path / METRICS).exists() or (path / CHECKPOINTS).is_dir())


def run_owning(path: str | Path) -> Path | None:
    """The run (or lone checkpoint, or sweep) folder whose own file `path` is or would be: one of a run's
    `RUN_FILES`, anything under its `RUN_FOLDERS`, any file of a checkpoint folder, or a sweep's records
    (`SWEEP_FILES`); None otherwise. The path is taken as the OS resolves it (`reading.resolved`), so no other
    spelling (a link, `L/..`) names a file outside the run that is in it."""
    path = resolved(path)
    folder = path.parent
    if path.name in RUN_FILES and is_run_dir(folder):
        return folder
    if path.name in SWEEP_FILES and is_sweep_dir(folder):
        return folder
    if is_checkpoint_dir(folder):
        return folder
    for inner, outer in zip((folder, *folder.parents), folder.parents, strict=False):
        if inner.name in RUN_FOLDERS and is_run_dir(outer):
            return outer
    return None


def enclosing_run(path: str | Path) -> Path | None:
    """The run or sweep folder that `path` lies inside (at any depth, not `path` itself), as the OS resolves it;
    None when there is none. A new run or sweep is never made inside another: its files would be taken for the
    other's, and removing one would remove both."""
    for folder in resolved(path).parents:
        if is_run_dir(folder) or is_sweep_dir(folder):
            return folder
    return None


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
    if is_sweep_dir(path):  # a sweep: the run it chose
        path = sweep_choice(path)[0] or path
    if path.is_file():
        path = path.parent
    if path.parent.name == CHECKPOINTS and is_checkpoint_dir(path):
        path = path.parent.parent
    return path if is_run_dir(path) else None


def verify_checkpoint(path: Path) -> str | None:
    """None if the checkpoint is complete and intact (every file of its manifest, size and SHA-256), else what
    is wrong with it."""
    try:
        manifest = json.loads(read_text_regular(path / MANIFEST))
    except (OSError, ValueError, RecursionError):
        return f"{MANIFEST} missing or unreadable"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(e, dict) and isinstance(e.get("size"), int)
                                              and isinstance(e.get("sha256"), str) for e in files.values()):
        return f"{MANIFEST} is not a vitlab checkpoint manifest (damaged)"
    strange = sorted(str(name) for name in files if name not in CHECKPOINT_FILES and not _SHARD_NAME.fullmatch(name))
    if strange:  # `../../x` would be checked (and later read) outside the checkpoint
        return f"{MANIFEST} names {strange[0]!r}, not a file of a checkpoint (edited or damaged)"
    expected = (STATE, SHARDS_INDEX) if any(_SHARD_NAME.fullmatch(name) for name in files) else CHECKPOINT_FILES
    if WEIGHTS in files and SHARDS_INDEX in files:
        return f"{MANIFEST} lists both {WEIGHTS} and shards (edited or damaged)"
    missing = [name for name in expected if name not in files]
    if missing:  # a manifest listing nothing vouches for nothing
        return f"{MANIFEST} does not list {' or '.join(missing)} (edited or damaged)"
    for name, expect in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is {special_kind(f.stat().st_mode)}, not a regular file" if f.exists() else \
                f"{name} is missing"
        if f.stat().st_size != expect["size"]:
            return f"{name} has {f.stat().st_size} bytes, expected {expect['size']} (truncated?)"
        if sha256_file(f) != expect["sha256"]:
            return f"{name} does not match its checksum (corrupt)"
    return None


def is_sharded_checkpoint(path: Path) -> bool:
    """A step checkpoint whose weights are shards of torch.distributed.checkpoint, not one model.safetensors."""
    return is_checkpoint_dir(path) and (Path(path) / SHARDS_INDEX).is_file()


def shard_files(path: Path) -> list[str]:
    """The names (`shards/<name>`) of the shard files in a checkpoint folder being written or read."""
    folder = Path(path) / SHARDS
    names = [f"{SHARDS}/{p.name}" for p in folder.iterdir()] if folder.is_dir() else []
    return sorted(name for name in names if _SHARD_NAME.fullmatch(name))


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Step checkpoints, newest first (temporary folders of a checkpoint being written are not listed)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_NAME.fullmatch(p.name)]
    return sorted(found, key=checkpoint_step, reverse=True)


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint folder `step_<digits>`."""
    return int(Path(path).name.removeprefix("step_"))


def special_run_file(run_dir: Path) -> str | None:
    """Why one of the run's own top-level files cannot be read or appended to (a FIFO, a device, a socket, a
    folder named like metrics.jsonl or console.log), or None: resuming reads metrics.jsonl and appends to both, and
    opening a FIFO for either waits forever for the other end."""
    for name in RUN_FILES:
        path = Path(run_dir) / name
        if name != LOCK and os.path.lexists(path):
            try:
                reason = not_regular(path)
            except OSError:  # a broken link: the reader or writer reports it in its own words
                continue
            if reason is not None:
                return reason
    return None


def stray_entries(run_dir: Path) -> list[str]:
    """Names in checkpoints/ that are neither a checkpoint (`step_<digits>`) nor one being written
    (`.step_….tmp…`): vitlab wrote none of them, so it neither reads nor deletes them."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if not (p.is_dir() and _STEP_NAME.fullmatch(p.name)) and not p.name.startswith(".step_"))


def checkpoint_settings(path: Path) -> dict | None:
    """The run's settings a checkpoint's manifest recorded (None for checkpoints written before they were)."""
    try:
        manifest = json.loads(read_text_regular(Path(path) / MANIFEST))
    except (OSError, ValueError, RecursionError):
        return None
    settings = manifest.get("settings") if isinstance(manifest, dict) else None
    return settings if isinstance(settings, dict) else None


def latest_valid_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint that passes verification; damaged newer ones are reported and skipped, and so is
    anything in checkpoints/ that is not a checkpoint."""
    for name in stray_entries(run_dir):
        log.warning("%s is not a vitlab checkpoint (they are named step_<digits>); ignored",
                    Path(run_dir) / CHECKPOINTS / name)
    for path in list_checkpoints(run_dir):
        problem = verify_checkpoint(path)
        if problem is None:
            return path
        log.warning("checkpoint %s is damaged (%s); falling back to the previous one", path, problem)
    return None


# A learning-rate sweep's folder (`vitlab finetune --lr-sweep … --out DIR`, train/sweep.py): one run per learning
# rate in lr_<lr>/, with --refit the chosen one again on all of train in final/, and sweep.json (its table and
# choice) written when the sweep ends. Weights readers resolve the folder to the run it chose.
SWEEP_RECORD = "sweep.json"
SWEEP_PLOT = "sweep.png"
SWEEP_FILES = (SWEEP_RECORD, SWEEP_PLOT)  # a sweep's own files at its top level: only the sweep writes them
REFIT_RUN = "final"


def sweep_run_name(lr: float) -> str:
    """The folder of one learning rate's run in a sweep."""
    return f"lr_{lr:g}"


def is_sweep_dir(path: Path) -> bool:
    """A sweep's folder (not itself a run): sweep.json, or a run in an lr_*/ folder."""
    path = Path(path)
    return path.is_dir() and not is_run_dir(path) and (
        (path / SWEEP_RECORD).is_file() or any(is_run_dir(p) for p in path.glob("lr_*")))


def sweep_choice(path: Path) -> tuple[Path | None, str]:
    """(the run a finished sweep chose: its refit in final/ if it made one, else the chosen learning rate's
    run; "") or (None, why not, naming the runs there are)."""
    path = Path(path)
    runs = sorted(p.name for p in path.glob("lr_*") if is_run_dir(p))
    listed = ", ".join(str(path / name) for name in runs) or "none yet"
    try:
        record = json.loads(read_text_regular(path / SWEEP_RECORD))
        chosen = float(record["chosen_lr"])
    except FileNotFoundError:
        return None, f"a learning-rate sweep that has not finished (no {SWEEP_RECORD}); pass one of its runs: {listed}"
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None, f"{SWEEP_RECORD} is damaged (no chosen_lr); pass one of its runs: {listed}"
    if record.get("refit_test_top1") is not None and is_run_dir(path / REFIT_RUN):
        return path / REFIT_RUN, ""
    run = path / sweep_run_name(chosen)
    if not is_run_dir(run):
        return None, f"the chosen run {run} is missing; pass one of its runs: {listed}"
    return run, ""
