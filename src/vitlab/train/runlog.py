"""What a run reports while it trains (rank 0 only): each record to metrics.jsonl and the trackers, progress on
the console (a tqdm bar on a terminal unless `vitlab -q`, plain lines otherwise, console.log either way), and how
long the run will take, from a measured step."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from vitlab.files.rundir import METRICS
from vitlab.progress import bars_enabled, duration
from vitlab.train.console import FILE_ONLY, log
from vitlab.train.metrics import truncate_metrics
from vitlab.train.trackers import scalar_writers


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
                stats["data_images_per_s"], 100 * stats["data_wait"], duration(eta),
            )

    def estimate(self, step: int, last: dict[str, float], workers: int, log_every: int) -> None:
        """On the step the estimate measures (`estimate_step`: step 2, or 1), before its log line: how long the run
        will take at that step's pace."""
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


# --------------------------------------------------------------------------------------------------------------
# How long a run will take, from a step it has measured: one line after the banner, before the first step line.
#
# The estimate times one step, not a guess from the model's size: step 2 of the run (step 1 pays once for the
# loader workers' start-up, the first allocations and, on a GPU, kernel selection), or step 1 when the first log
# line comes at step 1 or the run has one step left. A step takes its compute time, or the time the loader workers
# need to produce its batch if that is longer (they run beside the compute); with no worker processes the loading
# happens inside the step and counts in full. Evaluations, few-shot probes and checkpoints come on top, and a run
# that becomes data-bound or is slowed by other programs later takes longer: the line says what it measured.

def estimate_step(start_step: int, total_steps: int, log_every: int) -> int:
    """The step whose time the estimate uses (see the module doc)."""
    return start_step + (2 if log_every >= 2 and total_steps - start_step >= 2 else 1)


def step_seconds(stats: dict[str, float], workers: int) -> float:
    """The time one step takes in a steady run, from one measured step's stats (the loop's `_train_step`)."""
    compute = max(stats["seconds"] - stats["wait"], 0.0)
    if workers <= 0:
        return stats["seconds"]  # loading happened in this process, inside the step
    return max(compute, stats["load"] / workers)


def estimate_line(stats: dict[str, float], workers: int, remaining: int, measured: int, total: int) -> str:
    """One line: the time the `remaining` steps of a `total`-step run will take at step `measured`'s pace."""
    per_step = step_seconds(stats, workers)
    loading = (f"{stats['load'] / workers:.3g} s of loading over {workers} worker{'s' if workers != 1 else ''} "
               "beside it" if workers > 0 else f"{stats['wait']:.3g} s of it loading in this process")
    return (f"time    about {duration(per_step * remaining)} for {remaining:,} of {total:,} steps: "
            f"{per_step:.3g} s a step, measured on step {measured} (compute "
            f"{max(stats['seconds'] - stats['wait'], 0.0):.3g} s, {loading}); evaluations and checkpoints not "
            "included")
