"""What a run reports: `metrics.jsonl` (one JSON object per line), `curves.png`, TensorBoard events when asked
(`enable_tensorboard`, `vitlab train --tb`; `pip install vitlab[tb]`), a Weights & Biases run when asked
(`enable_wandb`), and progress on the console (a tqdm bar on a terminal unless `vitlab -q`, plain lines
otherwise). `console.log` gets every step and validation line either way: under a bar they go to the file only
(`FILE_ONLY`). Only the main process (rank 0) creates one of these.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from vitlab.errors import setting
from vitlab.files.outputs import atomic_write
from vitlab.files.reading import read_text_regular
from vitlab.files.rundir import CONFIG, CONSOLE_LOG, METRICS, TENSORBOARD, WANDB
from vitlab.models.flops import count_macs
from vitlab.progress import bars_enabled, duration
from vitlab.train.resolve import Resolved
from vitlab.train.rules import proportion_warning, schedule_line

log = logging.getLogger("vitlab.train")

_WANDB: dict[str, Any] = {"enabled": False, "project": None}
_TENSORBOARD: dict[str, bool] = {"enabled": False}
# Lines for console.log only (the step lines a progress bar replaces on the terminal): vitlab.train.runlog's
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


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop records after `last_step`: a resumed run rewrites the steps the killed run logged after its
    last checkpoint, and the file must describe one run, not two overlapping ones."""
    if not path.exists():
        return
    lines = [line for line in read_text_regular(path).splitlines() if line.strip()]
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
                stats["data_images_per_s"], 100 * stats["data_wait"], duration(eta),
            )

    def estimate(self, step: int, last: dict[str, float], workers: int, log_every: int) -> None:
        """On the step vitlab.train.runlog measures (step 2, or 1), before its log line: how long the run will take
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


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in read_text_regular(path).splitlines() if line.strip()]


FEW_POINTS = 50  # logged steps up to which curves.png marks each point


def plot_curves(metrics_path: Path, out: Path) -> Path | None:
    """curves.png: loss (train and val), accuracy (val top-1, and top-5 above 5 classes) and learning rate against
    step."""
    records = read_metrics(metrics_path) if metrics_path.exists() else []
    train = [r for r in records if r["split"] == "train"]
    val = [r for r in records if r["split"] == "val"]
    if not train and not val:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc, ax_lr) = plt.subplots(1, 3, figsize=(15, 4))
    dots = "o" if len(train) <= FEW_POINTS else None  # a short run's few points (or one) stay visible
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train", lw=1, marker=dots, ms=3)
    ax_loss.plot([r["step"] for r in val], [r["loss"] for r in val], "o-", label="val")
    ax_loss.set_yscale("log")
    for key in ("top1", "top5"):  # top-5 only where the run logged it: more than 5 classes (informative_metrics)
        if any(key not in r for r in val):
            continue
        ax_acc.plot([r["step"] for r in val], [r[key] for r in val], "o-", label=f"val {key}")
    fewshot = [r for r in records if r["split"] == "fewshot"]
    if fewshot:  # the paper's progress signal during pre-training
        ax_acc.plot([r["step"] for r in fewshot], [r["5shot"] for r in fewshot], "s--", label="5-shot linear")
    ax_lr.plot([r["step"] for r in train], [r["lr"] for r in train], marker=dots, ms=3)
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


# --------------------------------------------------------------------------------------------------------------
# The start banner: printed once before step 1 (and by `--print-config`), from the resolved settings.
#
# Model (name, parameters, multiply-adds), data (source, classes, images per split, pre-processing), every setting
# grouped by where its value came from, the notes of the resolution step, the output folder, devices and
# processes. The banner and the run's later console lines are also kept in `<run>/console.log`.

# Settings shown in the model/data/run lines instead of in the grouped list.
_SHOWN_ELSEWHERE = {"out", "recipe", "data", "model", "model_args", "init"}


def settings_lines(resolved: Resolved, defaults: bool = True) -> list[str]:
    """Every setting as `value`, grouped by source, then the notes: what --print-config prints. `defaults=False`
    (the banner) counts the settings left at vitlab's defaults instead of listing them: config.json records every
    value, and the banner keeps to what the recipe, the weights and the flags chose."""
    values = resolved.config.to_dict()
    groups: dict[str, list[str]] = {}
    for key, value in values.items():
        if key in _SHOWN_ELSEWHERE:
            continue
        groups.setdefault(resolved.sources.get(key, "given"), []).append(f"{key} {_fmt(value)}")
    order = sorted(groups, key=lambda s: (s == "default", s.startswith("recipe"), s))  # flags and weights first
    lines = [f"recipe {values['recipe']}, data {values['data']}, model {values['model']}"
             + (f" {_fmt(values['model_args'])}" if values["model_args"] else "")
             + (f", initial weights {values['init']}" if values["init"] else "") + f", out {values['out']}"]
    for source in order:
        if source == "default" and not defaults:
            lines.append(f"  from default: {len(groups[source])} other settings (config.json lists every value)")
            continue
        lines.append(_wrap(f"  from {source}: " + ", ".join(groups[source])))
    lines += [_wrap(f"  note: {note}") for note in resolved.notes]
    return lines


def banner_lines(resolved: Resolved, model: Any, data: Any, device: Any, world: int, workers: int,
                 threads: int, start_step: int, training: list[str] | None = None) -> list[str]:
    """`training`: the trainer's lines on what trains, layer decay and EMA (after the compute line)."""
    cfg = resolved.config
    config = model.config
    params = sum(p.numel() for p in model.parameters())
    macs = count_macs(config, cfg.image_size).total
    start = f"resuming at step {start_step:,} of {cfg.steps:,}" if start_step else f"{cfg.steps:,} steps"
    lines = [
        f"vitlab {cfg.recipe}: {start} → {cfg.out}",
        f"model   {config.name or cfg.model}: {_count(params)} parameters, {_count(macs)} multiply-adds per "
        f"{cfg.image_size}×{cfg.image_size} image, mean {_fmt(config.mean)} std {_fmt(config.std)}",
        f"data    {data.source}: {data.num_classes} classes, {len(data.train):,} train / {len(data.val):,} val "
        f"images at {cfg.image_size} px; train {_train_preprocessing(cfg)}; eval resize {cfg.eval_resize}",
        *schedule_lines(resolved, len(data.train)),
        f"devices {device.type} × {world} process{'es' if world > 1 else ''}, {threads} compute thread"
        f"{'s' if threads != 1 else ''} and {workers} loader worker{'s' if workers != 1 else ''} per process",
        f"compute {cfg.precision} ({resolved.sources.get('precision', 'given')})",
        *([f"attention {cfg.attention} ({resolved.sources.get('attention', 'given')})"]
          if hasattr(config, "head_dim") else []),
        *([_wrap(line)] if (line := loss_line(cfg, data.num_classes)) else []),
        *(_wrap(line) for line in training or ()),
    ]
    settings = settings_lines(resolved, defaults=False)
    return lines + ["settings " + line if i == 0 else line for i, line in enumerate(settings)]


def schedule_lines(resolved: Resolved, train_images: int) -> list[str]:
    """The run's length in steps and epochs of this training set, and a warning when a recipe's schedule is far
    out of proportion to it (vitlab.train.rules); the banner and --print-config show them."""
    cfg, source = resolved.config, resolved.sources.get("steps", "given")
    warning = proportion_warning(cfg, source, train_images)
    return [_wrap(schedule_line(cfg, source, train_images))] + ([_wrap(f"warning: {warning}")] if warning else [])


def loss_line(cfg: Any, num_classes: int) -> str | None:
    """What a sigmoid loss implies for this run's classes, which a practitioner used to softmax would misread: the
    first loss (the head starts at zero, so every logit is the head bias b: softplus(−b) for the image's class plus
    softplus(b) for each other, whatever the label smoothing or mixing) and softmax's log K beside it."""
    if cfg.loss != "sigmoid":
        return None
    bias = 0.0 if cfg.init else float(cfg.head_bias_init)  # fine-tuning replaces the head with a zero one
    first = _softplus(-bias) + (num_classes - 1) * _softplus(bias)
    return (f"loss    sigmoid cross-entropy summed over {num_classes} classes, head bias {bias:g}: the first steps' "
            f"loss is about {first:.2f}, not softmax's log {num_classes} = {math.log(num_classes):.2f} (the "
            "upstream pre-training loss of the paper's ImageNet-21k and JFT models, each class a yes/no); for "
            "one label per image, --loss softmax is the usual choice")


def _softplus(x: float) -> float:
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))  # log(1 + e^x) without overflow


def _count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{int(n):,}"


def _train_preprocessing(cfg: Any) -> str:
    flip = ", flip" if cfg.flip else ", no flip"
    if cfg.train_crop == "resize-random-crop":
        return f"resize then random crop{flip}" + _augmentation(cfg)
    lo, hi = cfg.crop_scale
    return f"{cfg.train_crop} crop ({100 * lo:g}%–{100 * hi:g}% of the area){flip}" + _augmentation(cfg)


def _augmentation(cfg: Any) -> str:
    """RandAugment, random erasing, MixUp and CutMix when on."""
    parts = []
    if cfg.randaug_ops:
        spread = f" ± {cfg.randaug_mstd:g}" if cfg.randaug_mstd else ""
        parts.append(f"RandAugment {cfg.randaug_ops} ops at level {cfg.randaug_magnitude:g}{spread}")
    if cfg.random_erasing:
        parts.append(f"random erasing p {cfg.random_erasing:g}")
    if cfg.mixup:
        parts.append(f"MixUp α {cfg.mixup:g}")
    if cfg.cutmix:
        parts.append(f"CutMix α {cfg.cutmix:g}")
    return "".join(", " + part for part in parts)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple | list):
        return "(" + ", ".join(_fmt(v) for v in value) + ")"
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(value.items())) + ")"
    return str(value)


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=118, subsequent_indent="      ", break_on_hyphens=False, break_long_words=False)


_CONSOLE_FORMAT = logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S")


class ConsoleLog:
    """Copies vitlab's log lines into `<run>/console.log` while the run lasts (rank 0 only), and the lines that
    go to the file only (runlog.FILE_ONLY: step and validation lines while a progress bar is on screen)."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.handler: logging.Handler | None = None
        if enabled:
            self.handler = logging.FileHandler(run_dir / CONSOLE_LOG, encoding="utf-8")
            self.handler.setFormatter(_CONSOLE_FORMAT)
            self.handler.setLevel(logging.INFO)
            logger = logging.getLogger("vitlab")
            if logger.level == logging.NOTSET:  # library use without logging set up: still record INFO lines
                logger.setLevel(logging.INFO)
            logger.addHandler(self.handler)
            FILE_ONLY.setLevel(logging.INFO)
            FILE_ONLY.addHandler(self.handler)

    def close(self) -> None:
        if self.handler is not None:
            logging.getLogger("vitlab").removeHandler(self.handler)
            FILE_ONLY.removeHandler(self.handler)
            self.handler.close()
            self.handler = None


def result_line(result: Any, verb: str) -> str:
    """The final line of `vitlab train` and `vitlab.train.fit`: what this call did (trained, or evaluated again
    a run that had already finished)."""
    if result.status == "preempted":
        return f"preempted at step {result.step}; continue with: vitlab {verb} --out {result.out_dir} --resume"
    m = result.metrics
    top5 = f"top-5 {100 * m['top5']:.2f}%, " if "top5" in m else ""  # only where it can be below 100%
    scores = (f"val top-1 {100 * m.get('top1', 0):.2f}%, {top5}loss {m.get('loss', 0):.4f} ({m.get('count', 0)} "
              "images)")
    if not result.images_per_s:  # no step ran: the run had finished before this invocation
        return (f"done: {result.out_dir} had already finished its {result.step:,} steps; nothing trained, its final "
                f"weights evaluated again in {result.seconds:.0f} s: {scores}; weights {result.weights}")
    return (f"done: step {result.step}, {scores} in {result.seconds:.0f} s; {result.images_per_s:.0f} img/s model, "
            f"{result.data_images_per_s:.0f} img/s data; weights {result.weights}")



def append_to_console_log(run_dir: Path, text: str) -> None:
    """A line after the run has closed its log (the command line's final `done:` line), in the same format."""
    path = Path(run_dir) / CONSOLE_LOG
    if path.parent.is_dir():
        record = logging.LogRecord("vitlab", logging.INFO, __file__, 0, text, None, None)
        with open(path, "a", encoding="utf-8") as f:
            f.write(_CONSOLE_FORMAT.format(record) + "\n")
