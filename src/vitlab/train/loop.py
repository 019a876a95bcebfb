"""The training loop: one loop for pre-training and fine-tuning (the recipe decides which).

`run(config)` trains in this process, or as one of torchrun's processes (DDP or FSDP2), and returns a
`RunResult`. Each optimiser step consumes one global batch (all processes × accumulation micro-steps), checks the
loss, clips the global gradient norm, steps the optimiser and the schedule, and updates the EMA weights.
"""

from __future__ import annotations

import errno
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitlab.data import build_datasets, normalize
from vitlab.data.errors import DataError, describe_paths
from vitlab.eval.fewshot_data import fewshot_weights
from vitlab.files.rundir import METRICS
from vitlab.runtime.device import all_reduce
from vitlab.runtime.precision import autocast_for, model_width, resolve_precision
from vitlab.train.banner import ConsoleLog, banner_lines
from vitlab.train.checkpointer import Checkpointer, find_resume_point
from vitlab.train.config import TrainConfig
from vitlab.train.distributed import Dist, barrier, grad_sync, peers_in_one_line, setup, teardown, wrap_model
from vitlab.train.ema import Ema
from vitlab.train.layer_decay import describe as describe_layer_decay
from vitlab.train.mixup import draw_mixup
from vitlab.train.objective import objective_for
from vitlab.train.optim import build_optimizer, build_scheduler
from vitlab.train.preemption import StopDuringEvaluation, StopSignals
from vitlab.train.resolve import Resolved
from vitlab.train.runlock import prepare_run_dir
from vitlab.train.runlog import RunLog, StepWindow, log, plot_curves, to_float
from vitlab.train.setup import build_model, check_classes, make_loaders, write_run_config
from vitlab.train.tuning import Tuning

# A write into the run directory failed for a reason the user can fix: full disk or quota, file too large,
# read-only file system or permissions.
OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}


class OutputError(ValueError):
    """The run could not write its outputs; the checkpoints written before stay valid."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the run stopped without saving the bad state."""


@dataclass
class RunResult:
    out_dir: Path
    status: str  # "completed" or "preempted"
    step: int
    metrics: dict[str, float] = field(default_factory=dict)  # last validation: loss, top1, top5
    best_top1: float | None = None
    weights: Path | None = None  # the final (evaluated) weights, vitlab safetensors
    images_per_s: float = 0.0  # model throughput: images per second of compute
    data_images_per_s: float = 0.0  # loader capacity: images per second the workers can produce
    seconds: float = 0.0
    skipped_images: list[str] = field(default_factory=list)


@peers_in_one_line  # a peer of the job died or stopped answering: one line, no gloo traceback
def run(config: TrainConfig | Resolved) -> RunResult:
    """Train as configured (a TrainConfig, or the Resolved settings of `vitlab.train.resolve` with their
    sources); in a torchrun job every process calls this and rank 0 writes."""
    resolved = config if isinstance(config, Resolved) else Resolved(config, dict.fromkeys(config.to_dict(), "given"))
    d = setup(resolved.config.device)
    finished = False
    try:
        trainer = Trainer(resolved, d)
        try:
            result = trainer.fit()
            finished = True
            return result
        except OSError as err:
            if err.errno not in OUTPUT_ERRNOS:
                raise
            last = trainer.checkpoints.last or "none yet"
            raise OutputError(f"cannot write {err.filename or trainer.run_dir} ({err.strerror}) at step "
                              f"{trainer.step}; the last good checkpoint is {last}: free space or fix permissions, "
                              "then continue with --resume") from None
        finally:
            trainer.close()
    finally:
        teardown(d, finished)


class Trainer:
    def __init__(self, resolved: Resolved, d: Dist):
        self.cfg, self.d = resolved.config, d
        self.run_dir = Path(self.cfg.out)
        self.lock = prepare_run_dir(self.run_dir, self.cfg.resume, d.is_main)
        self.console = ConsoleLog(self.run_dir, d.is_main)
        try:
            self._assemble(resolved)
        except BaseException:
            self._release()
            raise

    def _assemble(self, resolved: Resolved) -> None:
        """Data, model, optimiser, loaders and logs from the resolved settings, then the banner."""
        cfg, d = self.cfg, self.d
        self.data = resolved.data or build_datasets(cfg.data, cfg.val_fraction, cfg.strict)
        check_classes(cfg, self.data)
        self.step, self.best, self.metrics = 0, None, {}
        self.window = StepWindow()  # the steps since the last logged line; its loss sum is in checkpoints
        torch.manual_seed(cfg.seed)
        self.objective = objective_for(cfg)
        resume = (find_resume_point(self.run_dir, self.objective, self.data.class_names, self.data.source, d.is_main)
                  if cfg.resume else None)
        if resume is None:
            model = build_model(cfg, self.data.class_names, self.objective.has_head, resolved.init)
            self.model = self.objective.wrap(model)
        else:
            self.model = resume.model
        self.tuning = Tuning(self.model, cfg)  # --freeze / --lora: what trains, set before the optimizer sees it
        if resume is not None:
            self.tuning.restore(self.model, resume.state, resume.path)
        self.model_config = self.model.config  # of the saved ViT (the encoder, for self-supervision)
        resolved = self._decide_precision(resolved)
        cfg = self.cfg
        # self.model stays the model (sharded in place under FSDP); train_module is what the step calls (DDP)
        self.train_module = wrap_model(self.model, d, cfg.compile, cfg.fsdp)
        self.optimizer = build_optimizer(self.model, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.ema = Ema(self.model, cfg.ema, cfg.ema_warmup) if cfg.ema else None
        self.checkpoints = Checkpointer(cfg, d, self.objective, self.model, self.optimizer, self.scheduler, self.ema,
                                        self.data.class_names, resume.path if resume else None, self.tuning)
        if resume is not None:
            self.checkpoints.restore(resume.state)
            self.step, self.best = int(resume.state["step"]), resume.state.get("best")
            logged = resume.state.get("log_window") or {}  # a checkpoint between two logged lines: their mean
            self.window.steps, self.window.loss = int(logged.get("steps", 0)), float(logged.get("loss", 0.0))
        else:
            torch.manual_seed(cfg.seed + 1 + 1_000_003 * d.rank)  # dropout: its own stream per process
        self.train_loader, self.val_loader, self.workers = make_loaders(cfg, self.data, self.step, d)
        self.bad_images: list[str] = list(self.data.skipped)
        self.stops = StopSignals(d)
        if d.is_main:
            lines = banner_lines(resolved, self.saved_model(), self.data, d.device, d.world, self.workers,
                                 torch.get_num_threads(), self.step, self._tuning_lines())
            for line in lines:
                log.info(line)
            write_run_config(self.run_dir / "config.json", cfg, resolved.record(), self.saved_model(),
                             self.data, d)
        self.log = RunLog(self.run_dir, cfg.steps, self.step, d.is_main, tensorboard=cfg.tensorboard,
                          wandb_project=cfg.wandb_project)
        if resolved.resumed_changes:
            self.log.record({"step": self.step, "split": "resume", "changed": resolved.resumed_changes})

    def _tuning_lines(self) -> list[str]:
        """The banner's lines on what trains, at which learning rates, and the EMA."""
        lines = [self.tuning.describe()]
        if self.cfg.layer_decay is not None:
            lines.append(describe_layer_decay(self.model, self.cfg.layer_decay))
        return lines + ([self.ema.describe()] if self.ema is not None else [])

    def _decide_precision(self, resolved: Resolved) -> Resolved:
        """A TrainConfig given directly with precision auto (the command line's is decided by resolve): decided
        here by the same rule, and recorded as the command line's is."""
        if self.cfg.precision != "auto":
            return resolved
        chosen = resolve_precision("auto", self.d.device, use="train", width=model_width(self.saved_model()))
        self.cfg = self.cfg.replace(precision=chosen.name)
        return Resolved(self.cfg, {**resolved.sources, "precision": chosen.reason}, resolved.notes,
                        resolved.resumed_changes, resolved.data, resolved.init)

    def saved_model(self) -> Any:
        """The saved model (the encoder for self-supervision): what the banner and config.json describe."""
        return getattr(self.model, "encoder", self.model)

    # --- the loop --------------------------------------------------------------------------------------
    def fit(self) -> RunResult:
        cfg, start_time = self.cfg, time.perf_counter()
        window = self.window
        totals = StepWindow()
        status = "completed"
        with self.stops:  # SIGTERM and Ctrl-C stop the loop after the step (preemption.py)
            try:
                batches = iter(self.train_loader)
                while self.step < cfg.steps:
                    if self.stops.agreed():
                        self.log.message(f"{self.stops.requested or 'SIGTERM'}: saving a checkpoint at step "
                                         f"{self.step} and stopping")
                        self.save_checkpoint()
                        status = "preempted"
                        break
                    stats = self._train_step(batches)
                    self.step += 1
                    window.add(stats)
                    totals.add(stats)
                    self._after_step(window)
            except StopDuringEvaluation:  # the step is complete: its checkpoint is what resume needs
                self.log.message(f"{self.stops.requested}: evaluation aborted; saving a checkpoint at step "
                                 f"{self.step} and stopping")
                self.save_checkpoint()
                status = "preempted"
        return self._finish(status, totals, time.perf_counter() - start_time)

    def _train_step(self, batches: Any) -> dict[str, float]:
        cfg, d = self.cfg, self.d
        t0 = time.perf_counter()
        wait = load = 0.0
        images = 0
        loss_sum = torch.zeros((), device=d.device)
        for j in range(cfg.accum):
            t = time.perf_counter()
            batch = next(batches)
            wait += time.perf_counter() - t
            load += batch["load_seconds"]
            self._note_bad_images(batch["bad"])
            x = normalize(batch["images"].to(d.device, non_blocking=True), self.model_config.mean,
                          self.model_config.std)
            y = batch["labels"].to(d.device, non_blocking=True)
            images += len(y)
            mix = draw_mixup(cfg.mixup, len(y), cfg.seed, self.step, j, d.rank, cutmix=cfg.cutmix,
                             size=tuple(x.shape[-2:]))  # None without MixUp or CutMix
            with grad_sync(self.train_module, j == cfg.accum - 1):
                with autocast_for(d.device, cfg.precision):  # bf16: float32 master weights and optimizer state
                    loss = self.objective.loss(self.train_module, x, y, cfg, mix) / cfg.accum
                loss.backward()
            loss_sum += loss.detach()
        loss_value = all_reduce(loss_sum).item() / d.world
        if not math.isfinite(loss_value):
            self._diverged(loss_value)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip or math.inf)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model, self.step + 1)  # this is update step + 1 (warm-up counts updates)
        seconds = time.perf_counter() - t0
        return {"loss": loss_value, "lr": lr, "grad_norm": to_float(grad_norm), "images": images * d.world,
                "seconds": seconds, "wait": wait, "load": load, "local_images": images}

    def _diverged(self, value: float) -> None:
        last = self.checkpoints.last
        last = f"the last good checkpoint is {last}" if last else "no checkpoint"
        raise TrainingDiverged(
            f"loss is {value} at step {self.step + 1}; stopped without saving it ({last}). "
            "Lower --lr, lengthen --warmup or check the data"
        )

    def _after_step(self, window: StepWindow) -> None:
        cfg, step = self.cfg, self.step
        show = step % cfg.log_every == 0 or step == cfg.steps
        stats = window.summary(self.workers, self.d.world)
        self.log.estimate(step, window.last, self.workers, cfg.log_every)  # once, before the first step line
        self.log.train(step, stats, show)
        if show:
            self.log.record({"step": step, "split": "train", **stats})
            window.reset()
        evaluate_now = step == cfg.steps or (cfg.eval_every and step % cfg.eval_every == 0)
        if evaluate_now:
            self._evaluate()
        if cfg.fewshot_every and (step % cfg.fewshot_every == 0 or step == cfg.steps):
            self._fewshot()
        save_every = cfg.save_every or cfg.eval_every
        if step == cfg.steps or (save_every and step % save_every == 0):
            self.save_checkpoint()
        if evaluate_now and self.d.is_main:
            plot_curves(self.run_dir / METRICS, self.run_dir / "curves.png")

    def _note_bad_images(self, bad: list[str]) -> None:
        if not bad:
            return
        if self.cfg.strict:
            raise DataError(f"unreadable image(s): {describe_paths(bad)} (--strict)")
        new = [p for p in dict.fromkeys(bad) if p not in self.bad_images]
        if new and self.d.is_main:
            log.warning("skipping unreadable image(s), replaced by the next readable one: %s", describe_paths(new))
        self.bad_images += new

    # --- evaluation, checkpoints, preemption -----------------------------------------------------------
    def _evaluate(self, record: bool = True) -> dict[str, float]:
        t0 = time.perf_counter()
        with self.ema.applied(self.model) if self.ema is not None else nullcontext():
            self.metrics = self.objective.evaluate(self.model, self.stops.stoppable(self.val_loader), self.d.device,
                                                   self.data.num_classes, self.cfg)
            score = self.objective.score(self.metrics)
            improved = self.best is None or score > self.best.get("score", self.best["top1"])
            if improved:
                self.best = {"top1": self.metrics["top1"], "score": score, "step": self.step}
                self.checkpoints.save_weights(self.run_dir / "best.safetensors")
        if record:
            self.log.record({"step": self.step, "split": "val", **self.metrics, "ema": self.ema is not None,
                             "seconds": time.perf_counter() - t0})
        self.log.message(f"step {self.step}: {self.objective.summary(self.metrics)}")
        return self.metrics

    def _fewshot(self) -> None:
        """The paper's progress signal during pre-training: 5-shot linear accuracy (3 seeds) of the frozen
        representation, few-shot sets from the train split, accuracy on the validation split. Rank 0 only."""
        if self.d.is_main:
            encoder = getattr(self.model, "encoder", self.model)  # self-supervision: the ViT inside
            with self.ema.applied(self.model) if self.ema is not None else nullcontext():
                accuracy = fewshot_weights(encoder, self.cfg.data, shots=(5,), seeds=3,
                                           val_fraction=self.cfg.val_fraction).table["5"]["mean"]
            self.log.record({"step": self.step, "split": "fewshot", "5shot": accuracy})
            self.log.message(f"step {self.step}: 5-shot linear accuracy {100 * accuracy:.2f}% on {self.cfg.data}")
        barrier()

    def save_checkpoint(self) -> Path:
        logged = {"steps": self.window.steps, "loss": self.window.loss}  # the logged loss resumes
        return self.checkpoints.save(self.step, {"best": self.best, "log_window": logged})

    def _finish(self, status: str, totals: StepWindow, seconds: float) -> RunResult:
        weights = None
        if status == "completed":
            if not self.metrics:  # a resumed run that had already finished: evaluate again, log nothing new
                self._evaluate(record=False)
            weights = self.run_dir / "model.safetensors"
            with self.ema.applied(self.model) if self.ema is not None else nullcontext():
                self.checkpoints.save_weights(weights, step=self.step)  # its step: resumable without checkpoints
            if self.d.is_main:
                plot_curves(self.run_dir / METRICS, self.run_dir / "curves.png")
        summary = totals.summary(self.workers, self.d.world) if totals.steps else {}
        if self.bad_images and self.d.is_main:
            log.warning("%d unreadable image(s) were skipped: %s", len(self.bad_images),
                        describe_paths(self.bad_images))
        return RunResult(
            self.run_dir, status, self.step, dict(self.metrics), self.best["top1"] if self.best else None,
            weights, summary.get("images_per_s", 0.0), summary.get("data_images_per_s", 0.0), seconds,
            list(self.bad_images),
        )

    def close(self) -> None:
        self.log.close()
        self._release()

    def _release(self) -> None:
        """Loader workers stopped, console log closed, run directory unlocked: also after a failed start."""
        for loader in (getattr(self, "train_loader", None), getattr(self, "val_loader", None)):
            iterator = getattr(loader, "_iterator", None)
            if iterator is not None:
                iterator._shutdown_workers()
        self.console.close()
        if self.lock is not None:
            self.lock.release()
            self.lock = None
