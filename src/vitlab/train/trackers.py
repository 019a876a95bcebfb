"""Experiment trackers beside metrics.jsonl, each only when asked: TensorBoard events in RUN/tensorboard
(`enable_tensorboard`, `vitlab train --tb`; `pip install vitlab[tb]`) and a Weights & Biases run (`enable_wandb`,
`--wandb`; offline unless WANDB_MODE says otherwise). A tracker is a writer with `add_scalar` and `close`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vitlab.errors import setting
from vitlab.files.outputs import atomic_write
from vitlab.files.rundir import CONFIG, TENSORBOARD, WANDB
from vitlab.train.console import log

_WANDB: dict[str, Any] = {"enabled": False, "project": None}
_TENSORBOARD: dict[str, bool] = {"enabled": False}
def enable_tensorboard(enabled: bool = True) -> None:
    """Write TensorBoard events for every later run of this process (`vitlab train --tb`) into RUN/tensorboard.
    Never on merely because the package is installed. Needs tensorboard (`pip install vitlab[tb]`)."""
    if enabled:
        check_trackers(tensorboard=True)
    _TENSORBOARD["enabled"] = enabled


def check_trackers(tensorboard: bool = False, wandb_project: str | None = None) -> None:
    """One line when a tracker the run asks for (its config: `--tb`, `--wandb`, or a resumed run's) is not
    installed, before anything runs."""
    if tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError:
            raise ValueError(f"{setting('tb')} needs the tensorboard package: pip install 'vitlab[tb]'") from None
    if wandb_project:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ValueError(f"{setting('wandb')} needs the wandb package: pip install 'vitlab[wandb]'") from None


def enable_wandb(project: str | None = None) -> None:
    """Log every later run of this process to Weights & Biases as well (`vitlab train --wandb`). Offline unless
    WANDB_MODE says otherwise: nothing is sent, nothing asks for a login; `wandb sync RUN/wandb/offline-run-*`
    uploads later. Needs the wandb package (`pip install vitlab[wandb]`)."""
    check_trackers(wandb_project=project or "vitlab")
    _WANDB.update(enabled=True, project=project)


def _tensorboard(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional: pip install vitlab[tb]
        return None
    return SummaryWriter(str(run_dir / TENSORBOARD))


class WandbWriter:
    """The two calls RunLog makes of a TensorBoard writer, sent to a W&B run. The run's config is the run
    directory's config.json; its files go under RUN/wandb. The W&B run's id is kept in RUN/wandb/vitlab-run-id,
    so a resumed vitlab run continues the same W&B run."""

    def __init__(self, run_dir: Path, project: str | None = None):
        import wandb

        config_path = run_dir / CONFIG
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        mode = os.environ.get("WANDB_MODE", "offline")  # never online unless the user says so
        self.run = wandb.init(project=project or os.environ.get("WANDB_PROJECT", "vitlab"), name=run_dir.name,
                              dir=str(run_dir), config=config, mode=mode, id=_wandb_id(run_dir), resume="allow")
        log.info("Weights & Biases: %s run in %s", mode, run_dir / WANDB)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.run.log({tag: value}, step=step)

    def close(self) -> None:
        self.run.finish()


def _wandb_id(run_dir: Path) -> str:
    """The W&B run id of this vitlab run: made once (random, as W&B's own), then read back on every resume."""
    path = run_dir / WANDB / "vitlab-run-id"
    if path.is_file():
        return path.read_text().strip()
    run_id = os.urandom(6).hex()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_text(run_id))
    return run_id


def scalar_writers(run_dir: Path, wandb_project: str | None = None, wandb: bool | None = None,
                   tensorboard: bool | None = None) -> list[Any]:
    """The trackers of one run: TensorBoard when enabled (`enable_tensorboard` or tensorboard=True), W&B when
    enabled (`enable_wandb` or wandb=True)."""
    use_tb = _TENSORBOARD["enabled"] if tensorboard is None else tensorboard
    writers = [w for w in [_tensorboard(run_dir) if use_tb else None] if w is not None]
    if _WANDB["enabled"] if wandb is None else wandb:
        writers.append(WandbWriter(run_dir, wandb_project or _WANDB["project"]))
    return writers
