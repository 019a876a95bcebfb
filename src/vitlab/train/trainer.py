"""Building what a run needs from its config: run directory, datasets, model, loaders, RNG state."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.data import (
    Datasets,
    EvalTransform,
    ShardSampler,
    StepSampler,
    TrainTransform,
    TransformedSplit,
    build_datasets,
    make_loader,
    normalize,
)
from vitlab.data.augment import with_augmentation
from vitlab.data.errors import describe_paths
from vitlab.data.loader import PartsLoader, UnreadableImages
from vitlab.data.mixup import MixUp, draw_mixup
from vitlab.data.stream import training_order
from vitlab.errors import DataError, OutputError, TrainingDiverged, setting
from vitlab.eval.classify import evaluate
from vitlab.eval.metrics import ClassificationMeter, informative_metrics
from vitlab.files.outputs import atomic_write
from vitlab.files.rundir import BEST, CONFIG, CURVES, METRICS, WEIGHTS
from vitlab.losses import classification_loss, per_image_loss
from vitlab.models.attention import set_attention_form
from vitlab.models.config import ViTConfig
from vitlab.models.registry import build_model as build_from_config
from vitlab.models.registry import describe_architecture, model_config
from vitlab.models.unobserved import unread_tokens_skipped
from vitlab.runtime.attention import config_attention
from vitlab.runtime.device import all_reduce
from vitlab.runtime.precision import autocast_for, training_precision
from vitlab.train.banner import banner_lines
from vitlab.train.checkpoint import Checkpointer, find_resume_point, prepare_run_dir
from vitlab.train.config import TrainConfig
from vitlab.train.console import ConsoleLog, log
from vitlab.train.distributed import (
    Dist,
    StopDuringEvaluation,
    StopSignals,
    barrier,
    grad_sync,
    peers_in_one_line,
    setup,
    teardown,
    wrap_model,
)
from vitlab.train.finetune import Ema, Tuning, ema_warning
from vitlab.train.metrics import plot_curves
from vitlab.train.optim import build_optimizer, build_scheduler, describe_optimizer
from vitlab.train.optim import describe as describe_layer_decay
from vitlab.train.resolution import InitWeights, Resolved, read_init
from vitlab.train.runlog import RunLog, StepWindow, to_float
from vitlab.weights.load import model_from_checkpoint


def check_classes(cfg: TrainConfig, data: Datasets) -> None:
    if cfg.num_classes is not None and cfg.num_classes != data.num_classes:
        raise DataError(
            f"num_classes mismatch: {setting('num_classes', value=cfg.num_classes)} but {data.source} has "
            f"{data.num_classes} "
            f"classes ({describe_paths(data.class_names, 5)})"
        )
    if len(data.train) == 0:
        raise DataError(f"the training split of {data.source} is empty; add images or lower "
                        f"{setting('val_fraction')}")
    if len(data.val) == 0:
        raise DataError(f"the validation split of {data.source} is empty; add images or raise "
                        f"{setting('val_fraction')}")


def _with_config(model: nn.Module, config: Any) -> nn.Module:
    """The same weights under a config that differs only in settings without parameters (dropout, mean)."""
    if config == model.config:
        return model
    rebuilt = build_from_config(config)
    rebuilt.load_state_dict(model.state_dict())
    return rebuilt


def _setting_changes(cfg: TrainConfig, config: Any) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if cfg.dropout is not None and isinstance(config, ViTConfig):
        changes["dropout"] = cfg.dropout
    if cfg.drop_path_rate is not None:
        if not any(f.name == "drop_path_rate" for f in dataclasses.fields(config)):
            if cfg.drop_path_rate:
                raise ValueError(f"{setting('drop_path_rate')}: {config.name or type(config).__name__} has no "
                                 "stochastic "
                                 "depth (ViTs and hybrids do); leave it unset")
        else:
            changes["drop_path_rate"] = cfg.drop_path_rate
    if cfg.mean is not None:
        changes["mean"] = tuple(cfg.mean)
    if cfg.std is not None:
        changes["std"] = tuple(cfg.std)
    return changes


def _representation(cfg: TrainConfig, config: Any) -> dict[str, Any]:
    """`pre_logits` width for a model built from scratch (0: none); the name stays the variant's, as for the
    official ImageNet-21k releases, which are ViT-B/16 etc. with a representation layer."""
    if cfg.representation_size is None:
        return {}
    if not isinstance(config, ViTConfig):
        raise ValueError(f"{setting('representation_size')} applies to ViTs; {cfg.model} has no representation layer")
    return {"representation_size": cfg.representation_size or None}


def build_run_model(cfg: TrainConfig, class_names: list[str], with_head: bool = True,
                init: InitWeights | None = None) -> nn.Module:
    """From scratch (`--model`) or, for fine-tuning, from `--init` weights in any format `vitlab.load` reads
    (or a run directory; `init`: the resolution step's read of them, else they are read here): position
    embedding resampled to the run's image size and, as the paper prescribes, the whole head replaced by a
    zero-initialised one for the new classes. Without a head for self-supervision."""
    k = len(class_names) if with_head else 0
    if cfg.init:
        if cfg.representation_size or cfg.head_bias_init:
            raise ValueError(f"{setting('representation_size')} and {setting('head_bias_init')} shape a model "
                             "trained from scratch; "
                             "fine-tuning replaces the head with a zero one (paper Section 3.2): leave them unset")
        init = init or read_init(cfg.init)
        model = model_from_checkpoint(init.checkpoint, init.path or cfg.init, image_size=cfg.image_size)
        model.reset_classifier(k)
        model = _with_config(model, model.config.replace(**_setting_changes(cfg, model.config)))
    else:
        config = model_config(cfg.model, num_classes=k, image_size=cfg.image_size, **cfg.model_args)
        if cfg.model_args:  # no longer the named variant: say what it is
            config = config.replace(name=describe_architecture(config))
        config = config.replace(**_representation(cfg, config))
        model = build_from_config(config.replace(**_setting_changes(cfg, config)))
        if cfg.head_bias_init and isinstance(model.head, nn.Linear):  # vit_jax `head_bias_init`
            with torch.no_grad():
                model.head.bias.fill_(cfg.head_bias_init)
    model.class_names = list(class_names)
    return model.train()


def _cpus_per_process(d: Dist) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // max(d.local_world, 1))


def default_workers(d: Dist) -> int:
    """One CPU of this process's share for the training process, the rest for loading. On CUDA every other
    core loads: the GPU computes, and a ViT-B/16 step there consumes thousands of decoded JPEGs per second,
    more than 8 workers make. On CPU the cores left over are the compute threads, so loading keeps at most 8."""
    spare = _cpus_per_process(d) - 1
    return max(0, spare if d.device.type == "cuda" else min(8, spare))


def set_cpu_threads(d: Dist, workers: int) -> None:
    """On CPU, compute threads = this process's CPUs minus its loader workers, unless OMP_NUM_THREADS says
    otherwise. PyTorch would take every core; OpenMP threads then spin-wait for threads the workers (or other
    programs) pushed off a core, which makes a run slower than with one thread (BENCHMARKS.md "Bounds and choices
    in the code")."""
    if d.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, _cpus_per_process(d) - workers))


def make_loaders(cfg: TrainConfig, data: Datasets, start_step: int, d: Dist) -> tuple[Any, Any, int]:
    """(train loader from start_step, validation loader, workers)."""
    workers = default_workers(d) if cfg.workers is None else cfg.workers
    set_cpu_threads(d, workers)
    size = (cfg.image_size, cfg.image_size)
    train_tf = TrainTransform(size, tuple(cfg.crop_scale), tuple(cfg.crop_ratio), cfg.flip, cfg.train_crop,
                              cfg.train_resize)
    order = training_order(data.train, cfg.seed, cfg.batch_size, data.source)  # None: a seeded permutation
    parts = max(1, workers)
    sampler = StepSampler(len(data.train), cfg.batch_size, cfg.seed, start_step, cfg.steps, d.rank, d.world, cfg.accum,
                          order, parts)
    train_tf = with_augmentation(train_tf, cfg.randaug_ops, cfg.randaug_magnitude, cfg.randaug_mstd, cfg.random_erasing)
    train = make_loader(TransformedSplit(data.train, train_tf), sampler, workers, d.device)
    if sampler.parts > 1:
        train = PartsLoader(train, sampler.parts)
    val_sampler = ShardSampler(len(data.val), cfg.eval_batch_size, d.rank, d.world)
    val = make_loader(TransformedSplit(data.val, EvalTransform(size, cfg.eval_resize)), val_sampler, workers, d.device)
    return train, val, workers


def write_run_config(path: Path, cfg: TrainConfig, record: dict[str, Any], model: nn.Module, data: Datasets,
                     d: Dist) -> None:
    """config.json: the resolved values, where each came from, and what the run was built from (atomic: a
    resume must never find it torn)."""
    text = json.dumps(run_record(cfg, record, model.config.to_dict(), data, d.world), indent=1)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def run_record(cfg: TrainConfig, record: dict[str, Any], model_config: dict[str, Any], data: Datasets,
               world: int) -> dict[str, Any]:
    """What config.json holds (`vitlab train --print-config json` prints the same before any run)."""
    return {
        **cfg.to_dict(), **record,
        "model_config": model_config,
        "class_names": data.class_names,
        "train_images": len(data.train),
        "val_images": len(data.val),
        "world_size": world,
        "torch": torch.__version__,
    }


# --------------------------------------------------------------------------------------------------------------
# What the loop optimises: image classification (the default) or masked patch prediction (paper Section 4.6).
#
# An objective wraps the model that is saved (a plain ViT) into the module that is trained, computes the loss of a
# batch, evaluates, and splits the trained module's state into the vitlab weights file (the ViT, loadable by
# `vitlab.load` and `vitlab finetune --init`) and objective-only extras kept with the checkpoint for resuming.

class Classification:
    name = "classify"
    has_head = True

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def loss(self, module: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig,
             mix: MixUp | None = None) -> torch.Tensor:
        if mix is None:
            return classification_loss(module(x), y, cfg.loss, cfg.label_smoothing)
        logits = module(mix.images(x))
        return mix.loss(lambda target: classification_loss(logits, target, cfg.loss, cfg.label_smoothing), y)

    def evaluate(self, module: nn.Module, loader: Any, device: torch.device, num_classes: int,
                 cfg: TrainConfig) -> dict[str, float]:
        c = module.config
        return evaluate(module, loader, device, c.mean, c.std, num_classes, cfg.loss,
                        precision=cfg.precision).result()

    def score(self, metrics: dict[str, float]) -> float:
        """Higher is better: what best.safetensors is chosen by."""
        return metrics["top1"]

    def reported(self, metrics: dict[str, float], num_classes: int) -> dict[str, float]:
        """The metrics a person is shown (the console, the run's result): top-5 only above 5 classes, where it
        can be below 100%. metrics.jsonl keeps every metric."""
        return informative_metrics(metrics, num_classes)

    def summary(self, metrics: dict[str, float], num_classes: int) -> str:
        """The validation line of the console log."""
        m = self.reported(metrics, num_classes)
        top5 = f"top-5 {100 * m['top5']:.2f}%  " if "top5" in m else ""
        return f"val loss {m['loss']:.4f}  top-1 {100 * m['top1']:.2f}%  {top5}({m['count']} images)"

    def split_state(self, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return state, {}

    def merge_state(self, weights: dict[str, torch.Tensor], extras: dict[str, torch.Tensor]) -> dict[str, Any]:
        return weights


class MaskedPatches(Classification):
    """The encoder is trained without a classifier; top-1/top-5 are the colour predictions' accuracies over the
    corrupted patches (the L2-pixel target reports only its loss and is scored by it)."""

    name = "mpp"
    has_head = False

    def __init__(self, target: str):
        self.target = target

    def wrap(self, model: nn.Module) -> nn.Module:
        from vitlab.selfsup import MaskedPatchPredictor, MPPConfig  # imported by the runs that use it

        return MaskedPatchPredictor(model, MPPConfig(target=self.target))

    def loss(self, module: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig,
             mix: MixUp | None = None) -> torch.Tensor:
        return module(x)[0]  # MixUp is refused for self-supervision (config validation)

    @torch.no_grad()
    def evaluate(self, module: nn.Module, loader: Any, device: torch.device, num_classes: int,
                 cfg: TrainConfig) -> dict[str, float]:
        was_training = module.training
        module.eval()
        c = module.config
        # The same corruption at every evaluation, so that the numbers are comparable across steps.
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
        meter = ClassificationMeter(2 ** (3 * c.in_chans), device)
        unreadable = UnreadableImages(loader)  # left out, not counted; fatal under --strict
        for batch in loader:
            unreadable.add(batch["bad"])
            valid = batch["valid"].to(device)
            if not valid.any():  # an all-padding evaluation shard
                continue
            x = normalize(batch["images"].to(device)[valid], c.mean, c.std)
            with autocast_for(device, getattr(cfg, "precision", "fp32")):  # a bare settings object: float32
                pred, target = module.predictions(x, generator)
            pred = pred.float()
            if self.target == "pixels":
                losses = module.loss(pred, target, reduction="none")
                meter.totals += torch.stack([losses.sum(), torch.tensor(float(len(losses)), device=device),
                                             torch.zeros((), device=device), torch.zeros((), device=device)])
            else:
                meter.update(pred, target, per_image_loss(pred, target))
        unreadable.report()
        all_reduce(meter.totals)
        module.train(was_training)
        return meter.result()

    def score(self, metrics: dict[str, float]) -> float:
        return -metrics["loss"] if self.target == "pixels" else metrics["top1"]

    def reported(self, metrics: dict[str, float], num_classes: int) -> dict[str, float]:
        return metrics  # colour predictions: hundreds of classes whatever the dataset's count

    def summary(self, metrics: dict[str, float], num_classes: int) -> str:
        from vitlab.selfsup.mpp import validation_summary

        return validation_summary(metrics, self.target)

    def split_state(self, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        encoder = {k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")}
        extras = {k: v for k, v in state.items() if not k.startswith("encoder.")}  # mask token, prediction head
        return encoder, extras

    def merge_state(self, weights: dict[str, torch.Tensor], extras: dict[str, torch.Tensor]) -> dict[str, Any]:
        return {**{f"encoder.{k}": v for k, v in weights.items()}, **extras}


def objective_for(cfg: TrainConfig) -> Classification:
    if cfg.objective == "classify":
        return Classification()
    if cfg.objective == "mpp":
        return MaskedPatches(cfg.mpp_target)
    raise ValueError(f"unknown objective {cfg.objective!r}; use classify or mpp")


@dataclass(frozen=True)
class StepParts:
    """What one optimiser step of a run computes with, before any data or checkpoint: the model as the run builds it
    (wrapped by its objective; `.encoder` is the ViT under self-supervision), its optimizer, and `loss(images,
    labels)`, the run's loss of one batch."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss: Any  # (images, labels) -> the scalar loss the run back-propagates


def step_parts(cfg: TrainConfig, class_names: list[str], device: torch.device | str = "cpu") -> StepParts:
    """The model (on `device`), optimizer and loss a run of `cfg` trains with, built as the trainer builds them, so
    that a cost estimate times the step the run will take."""
    objective = objective_for(cfg)
    model = objective.wrap(build_run_model(cfg, class_names, objective.has_head)).to(device).train()
    return StepParts(model, build_optimizer(model, cfg), lambda x, y: objective.loss(model, x, y, cfg))


# --------------------------------------------------------------------------------------------------------------
# The training loop: one loop for pre-training and fine-tuning (the recipe decides which).
#
# `run(config)` trains in this process, or as one of torchrun's processes (DDP or FSDP2), and returns a
# `RunResult`. Each optimiser step consumes one global batch (all processes × accumulation micro-steps), checks the
# loss, clips the global gradient norm, steps the optimiser and the schedule, and updates the EMA weights.

# A write into the run directory failed for a reason the user can fix: full disk or quota, file too large,
# read-only file system or permissions.
OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}








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
        result = _fit(resolved, d)  # the trainer, its model and optimizer are released on return
        finished = True
        return result
    finally:
        teardown(d, finished)


def _fit(resolved: Resolved, d: Dist) -> RunResult:
    trainer = Trainer(resolved, d)
    try:
        return trainer.fit()
    except OSError as err:
        if err.errno not in OUTPUT_ERRNOS:
            raise
        last = trainer.checkpoints.last or "none yet"
        raise OutputError(f"cannot write {err.filename or trainer.run_dir} ({err.strerror}) at step "
                          f"{trainer.step}; the last good checkpoint is {last}: free space or fix permissions, "
                          "then continue with --resume") from None
    finally:
        trainer.close()


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
            model = build_run_model(cfg, self.data.class_names, self.objective.has_head, resolved.init)
            self.model = self.objective.wrap(model)
        else:
            self.model = resume.model
        self.tuning = Tuning(self.model, cfg)  # --freeze / --lora: what trains, set before the optimizer sees it
        if resume is not None:
            self.tuning.restore(self.model, resume.state, resume.path)
        self.model_config = self.model.config  # of the saved ViT (the encoder, for self-supervision)
        resolved = self._decide_attention(self._decide_precision(resolved))
        cfg = self.cfg
        set_attention_form(self.model, cfg.attention)
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
            warning = ema_warning(cfg.ema, cfg.ema_warmup, cfg.steps) if cfg.ema else None
            if warning:
                log.warning("warning: %s", warning)
            write_run_config(self.run_dir / CONFIG, cfg, resolved.record(), self.saved_model(),
                             self.data, d)
        self.log = RunLog(self.run_dir, cfg.steps, self.step, d.is_main, tensorboard=cfg.tensorboard,
                          wandb_project=cfg.wandb_project)
        if resolved.resumed_changes:
            self.log.record({"step": self.step, "split": "resume", "changed": resolved.resumed_changes})

    def _tuning_lines(self) -> list[str]:
        """The banner's lines on what trains, at which learning rates, and the EMA."""
        lines = [self.tuning.describe(), describe_optimizer(self.optimizer)]
        if self.cfg.layer_decay is not None:
            lines.append(describe_layer_decay(self.model, self.cfg.layer_decay))
        return lines + ([self.ema.describe()] if self.ema is not None else [])

    def _decide_precision(self, resolved: Resolved) -> Resolved:
        """A TrainConfig given directly with precision auto (the command line's is decided by resolve): decided by
        the same function, runtime.precision.training_precision, and recorded as the command line's is."""
        if self.cfg.precision != "auto":
            return resolved
        chosen = training_precision(self.saved_model().config, self.d.device)
        self.cfg = self.cfg.replace(precision=chosen.name)
        return Resolved(self.cfg, {**resolved.sources, "precision": chosen.reason}, resolved.notes,
                        resolved.resumed_changes, resolved.data, resolved.init)

    def _decide_attention(self, resolved: Resolved) -> Resolved:
        """--attention auto decided once the precision is known, by runtime.attention's measured rule for the model,
        the device and the batch each process computes (one micro-batch); config.json records the choice with the
        rule's reason as its source."""
        if self.cfg.attention != "auto":
            return resolved
        batch = self.cfg.batch_size // (max(self.cfg.accum, 1) * self.d.world)
        chosen = config_attention(self.cfg.attention, self.saved_model().config, self.d.device, self.cfg.precision,
                                  batch)
        self.cfg = self.cfg.replace(attention=chosen.name)
        return Resolved(self.cfg, {**resolved.sources, "attention": chosen.reason}, resolved.notes,
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
            self.checkpoints.wait()  # a checkpoint written in the background is sealed before the run ends
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
                # bf16: float32 master weights and optimizer state. A ViT's last block computes the class token
                # alone while nothing observes it: the same loss and gradients, less compute (models.unobserved).
                with autocast_for(d.device, cfg.precision), unread_tokens_skipped(self.model):
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
        self.checkpoints.poll()
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
            plot_curves(self.run_dir / METRICS, self.run_dir / CURVES)

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
                self.checkpoints.save_weights(self.run_dir / BEST)
        if record:
            self.log.record({"step": self.step, "split": "val", **self.metrics, "ema": self.ema is not None,
                             "seconds": time.perf_counter() - t0})
        self.log.message(f"step {self.step}: {self.objective.summary(self.metrics, self.data.num_classes)}")
        return self.metrics

    def _fewshot(self) -> None:
        """The paper's progress signal during pre-training: 5-shot linear accuracy (3 seeds) of the frozen
        representation, few-shot sets from the train split, accuracy on the validation split. Rank 0 only."""
        if self.d.is_main:
            from vitlab.eval.fewshot_data import fewshot_weights  # imported by the runs that probe

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
            weights = self.run_dir / WEIGHTS
            with self.ema.applied(self.model) if self.ema is not None else nullcontext():
                self.checkpoints.save_weights(weights, step=self.step)  # its step: resumable without checkpoints
            if self.d.is_main:
                plot_curves(self.run_dir / METRICS, self.run_dir / CURVES)
        summary = totals.summary(self.workers, self.d.world) if totals.steps else {}
        if self.bad_images and self.d.is_main:
            log.warning("%d unreadable image(s) were skipped: %s", len(self.bad_images),
                        describe_paths(self.bad_images))
        return RunResult(
            self.run_dir, status, self.step, self.objective.reported(dict(self.metrics), self.data.num_classes),
            self.best["top1"] if self.best else None,
            weights, summary.get("images_per_s", 0.0), summary.get("data_images_per_s", 0.0), seconds,
            list(self.bad_images),
        )

    def close(self) -> None:
        self.checkpoints.abandon()  # after a failure: a background write ends without leaving a folder
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
