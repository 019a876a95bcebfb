"""What a run reports: `metrics.jsonl` (one JSON object per line), `curves.png`, TensorBoard events when asked
(`enable_tensorboard`, `vitlab train --tb`; `pip install vitlab[tb]`), a Weights & Biases run when asked
(`enable_wandb`), and progress on the console (a tqdm bar on a terminal unless `vitlab -q`, plain lines
otherwise). `console.log` gets every step and validation line either way: under a bar they go to the file only
(`FILE_ONLY`). Only the main process (rank 0) creates one of these."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from vitlab.files.outputs import atomic_write
from vitlab.files.rundir import METRICS
from vitlab.progress import bars_enabled
from vitlab.train.eta import estimate_line, estimate_step

log = logging.getLogger("vitlab.train")

_WANDB: dict[str, Any] = {"enabled": False, "project": None}
_TENSORBOARD: dict[str, bool] = {"enabled": False}
# Lines for console.log only (the step lines a progress bar replaces on the terminal): vitlab.train.banner's
# ConsoleLog writes them to the file; they do not propagate to the terminal's handlers.
FILE_ONLY = logging.getLogger("vitlab.file_only")
FILE_ONLY.propagate = False


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
            raise ValueError("--tb needs the tensorboard package: pip install 'vitlab[tb]'") from None
    if wandb_project:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ValueError("--wandb needs the wandb package: pip install 'vitlab[wandb]'") from None


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
    return SummaryWriter(str(run_dir / "tensorboard"))


class WandbWriter:
    """The two calls RunLog makes of a TensorBoard writer, sent to a W&B run. The run's config is the run
    directory's config.json; its files go under RUN/wandb. The W&B run's id is kept in RUN/wandb/vitlab-run-id,
    so a resumed vitlab run continues the same W&B run."""

    def __init__(self, run_dir: Path, project: str | None = None):
        import wandb

        config_path = run_dir / "config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        mode = os.environ.get("WANDB_MODE", "offline")  # never online unless the user says so
        self.run = wandb.init(project=project or os.environ.get("WANDB_PROJECT", "vitlab"), name=run_dir.name,
                              dir=str(run_dir), config=config, mode=mode, id=_wandb_id(run_dir), resume="allow")
        log.info("Weights & Biases: %s run in %s", mode, run_dir / "wandb")

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.run.log({tag: value}, step=step)

    def close(self) -> None:
        self.run.finish()


def _wandb_id(run_dir: Path) -> str:
    """The W&B run id of this vitlab run: made once (random, as W&B's own), then read back on every resume."""
    path = run_dir / "wandb" / "vitlab-run-id"
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


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop records after `last_step`: a resumed run rewrites the steps the killed run logged after its
    last checkpoint, and the file must describe one run, not two overlapping ones."""
    if not path.exists():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            records.append((json.loads(line)["step"], line))
        except (json.JSONDecodeError, KeyError, TypeError):
            if i < len(lines) - 1:
                raise ValueError(f"{path}: line {i + 1} is not a metrics record; the file is damaged (move it "
                                 "aside to resume without the run's earlier metrics)") from None
            log.warning("%s: dropped a torn last line (the run was killed while writing it)", path)
    kept = [line for step, line in records if step <= last_step]
    text = "".join(line + "\n" for line in kept)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


class RunLog:
    def __init__(self, run_dir: Path, total_steps: int, start_step: int, enabled: bool, *,
                 tensorboard: bool = False, wandb_project: str | None = None):
        """`tensorboard` / `wandb_project`: the run's own trackers (its config); off, the process-wide
        `enable_tensorboard` / `enable_wandb` still apply."""
        self.enabled, self.total, self.run_dir = enabled, total_steps, run_dir
        self.metrics_path = run_dir / METRICS
        self.bar = None
        self.writers: list[Any] = []
        self._t0, self._step0 = time.perf_counter(), start_step
        if not enabled:
            return
        truncate_metrics(self.metrics_path, start_step)
        self.writers = scalar_writers(run_dir, wandb_project, wandb=True if wandb_project else None,
                                      tensorboard=True if tensorboard else None)
        if bars_enabled():
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, file=sys.stderr)

    def record(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        for key, value in record.items():
            if key not in ("step", "split") and isinstance(value, int | float) and not isinstance(value, bool):
                for writer in self.writers:
                    writer.add_scalar(f"{record['split']}/{key}", value, record["step"])

    def train(self, step: int, stats: dict[str, float], show: bool) -> None:
        """Progress every step on a bar; a line every log interval (show=True) otherwise."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(
                loss=f"{stats['loss']:.4f}", lr=f"{stats['lr']:.2e}", img_s=f"{stats['images_per_s']:.0f}",
                data_img_s=f"{stats['data_images_per_s']:.0f}", refresh=False,
            )
        if show:  # under a bar the line goes to console.log only: the bar is the terminal's progress
            done = step - self._step0
            eta = (time.perf_counter() - self._t0) / max(done, 1) * (self.total - step)
            (log if self.bar is None else FILE_ONLY).info(
                "step %d/%d  loss %.4f  lr %.2e  %.0f img/s (data %.0f img/s, wait %.0f%%)  eta %s",
                step, self.total, stats["loss"], stats["lr"], stats["images_per_s"],
                stats["data_images_per_s"], 100 * stats["data_wait"], _duration(eta),
            )

    def estimate(self, step: int, last: dict[str, float], workers: int, log_every: int) -> None:
        """On the step vitlab.train.eta measures (step 2, or 1), before its log line: how long the run will take
        at that step's pace."""
        if self.enabled and step == estimate_step(self._step0, self.total, log_every):
            self.message(estimate_line(last, workers, self.total - self._step0, step, self.total))

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
            FILE_ONLY.info("%s", text)
        else:
            log.info("%s", text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        for writer in self.writers:
            writer.close()
        self.writers = []


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_curves(metrics_path: Path, out: Path) -> Path | None:
    """curves.png: loss (train and val), accuracy (val top-1 and top-5) and learning rate against step."""
    records = read_metrics(metrics_path) if metrics_path.exists() else []
    train = [r for r in records if r["split"] == "train"]
    val = [r for r in records if r["split"] == "val"]
    if not train and not val:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc, ax_lr) = plt.subplots(1, 3, figsize=(15, 4))
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train", lw=1)
    ax_loss.plot([r["step"] for r in val], [r["loss"] for r in val], "o-", label="val")
    ax_loss.set_yscale("log")
    for key in ("top1", "top5"):
        ax_acc.plot([r["step"] for r in val], [r[key] for r in val], "o-", label=f"val {key}")
    fewshot = [r for r in records if r["split"] == "fewshot"]
    if fewshot:  # the paper's progress signal during pre-training
        ax_acc.plot([r["step"] for r in fewshot], [r["5shot"] for r in fewshot], "s--", label="5-shot linear")
    ax_lr.plot([r["step"] for r in train], [r["lr"] for r in train])
    for ax, title in ((ax_loss, "loss"), (ax_acc, "accuracy"), (ax_lr, "learning rate")):
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax_loss.legend()
    ax_acc.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def to_float(t: Any) -> float:
    """A scalar tensor (a DTensor under FSDP too) as a float for the logs."""
    if hasattr(t, "full_tensor"):  # a DTensor under FSDP
        t = t.full_tensor()
    return float(t)


class StepWindow:
    """Sums over a stretch of steps, summarised as rates."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps, self.loss, self.images, self.seconds, self.wait, self.load, self.local = 0, 0.0, 0, 0.0, 0.0, 0.0, 0
        self.last: dict[str, float] = {}

    def add(self, s: dict[str, float]) -> None:
        self.steps += 1
        self.loss += s["loss"]
        self.images += s["images"]
        self.seconds += s["seconds"]
        self.wait += s["wait"]
        self.load += s["load"]
        self.local += s["local_images"]
        self.last = s

    def summary(self, workers: int, world: int) -> dict[str, float]:
        """Model images/s: global images per second of compute (waiting for data excluded). Data images/s:
        what the loaders of all processes can deliver, from the time the workers spent producing batches."""
        compute = max(self.seconds - self.wait, 1e-9)
        capacity = self.local / max(self.load / max(workers, 1), 1e-9) * world
        return {
            "loss": self.loss / max(self.steps, 1), "lr": self.last.get("lr", 0.0),
            "grad_norm": self.last.get("grad_norm", 0.0), "images_per_s": self.images / compute,
            "data_images_per_s": capacity, "data_wait": self.wait / max(self.seconds, 1e-9),
        }
