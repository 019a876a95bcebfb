"""The trainer's checkpointer, a component the trainer asks (as torchtitan's trainer asks its CheckpointManager):
on resume it finds the newest intact checkpoint and puts its state back; during the run it writes a step's
checkpoint (weights, optimizer, scheduler, EMA, the RNG of every process) and keeps the last k, and it writes the
evaluated weights (best.safetensors, model.safetensors). Sharded (FSDP) states are gathered to full ones first;
rank 0 writes, every process takes part in the gathering."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ..data.errors import DataError, describe_paths
from ..models.registry import build_model as build_from_config
from ..rundir import latest_valid_checkpoint, step_dir
from .checkpoint import prune_checkpoints, read_training_checkpoint, save_weights, weights_meta, write_checkpoint
from .config import TrainConfig
from .distributed import Dist, all_gather_objects, barrier
from .optim import Ema, replan_schedule
from .runlog import log
from .setup import rng_state, set_rng_state

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass
class ResumePoint:
    path: Path  # the checkpoint directory
    model: nn.Module  # the trained module (the objective's wrapper), its weights loaded
    state: dict[str, Any]  # what write_checkpoint stored beside the weights


def find_resume_point(run_dir: Path, objective: Any, class_names: list[str], source: str, is_main: bool
                      ) -> ResumePoint | None:
    """The model of the newest intact checkpoint (its own architecture: --init is not read again) and the
    training state saved with it; None if the run has no checkpoint yet."""
    ckpt = latest_valid_checkpoint(run_dir)
    if ckpt is None:
        if is_main:
            log.info("no checkpoint in %s: starting from step 0", run_dir)
        return None
    weights, state = read_training_checkpoint(ckpt)
    if list(state["class_names"]) != class_names:
        raise DataError(
            f"the classes of {source} differ from those of checkpoint {ckpt} "
            f"({describe_paths(list(state['class_names']), 5)}); resume on the same data"
        )
    model = objective.wrap(build_from_config(weights.config))
    model.load_state_dict(objective.merge_state(weights.state_dict, state.get("objective", {})))
    model.class_names = list(class_names)
    if is_main:
        log.info("resuming from %s (step %d)", ckpt, state["step"])
    return ResumePoint(ckpt, model.train(), state)


class Checkpointer:
    """Writes and restores the state of one run: the model (as trained: sharded or whole), its optimizer,
    schedule and EMA. `last` is the newest checkpoint written or resumed from."""

    def __init__(self, cfg: TrainConfig, d: Dist, objective: Any, model: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any, ema: Ema | None, class_names: list[str], last: Path | None = None):
        self.cfg, self.d, self.objective = cfg, d, objective
        self.run_dir = Path(cfg.out)
        self.model, self.optimizer, self.scheduler, self.ema = model, optimizer, scheduler, ema
        self.data_class_names = list(class_names)  # what resuming checks the data against
        # The class names the saved weights carry: none for an encoder without a head (self-supervision).
        self.class_names = self.data_class_names if model.config.num_classes else None
        self.last = last

    def restore(self, state: dict[str, Any]) -> None:
        """Optimizer, schedule, EMA and this process's random streams as `state` saved them."""
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=_FULL)
        self.scheduler.load_state_dict(state["scheduler"])
        planned_for = replan_schedule(self.scheduler, self.cfg.steps)  # --resume --steps N: extend, never lr 0
        if planned_for is not None and self.d.is_main:
            log.info("learning-rate schedule re-planned from %d to %d steps: step %d takes lr %.3g", planned_for,
                     self.cfg.steps, int(state["step"]) + 1, self.scheduler.get_last_lr()[0])
        if self.ema is not None and state.get("ema") is not None:
            with self.ema.applied(self.model):
                set_model_state_dict(self.model, state["ema"], options=_FULL)
                self.ema.capture(self.model)
        rngs = state["rng"]
        if self.d.rank < len(rngs):
            set_rng_state(rngs[self.d.rank])
        else:  # resumed on more processes than saved: the extra ones start a fresh stream
            torch.manual_seed(self.cfg.seed + 1 + 1_000_003 * self.d.rank)

    def save(self, step: int, training: dict[str, Any]) -> Path:
        """The checkpoint of `step`; `training`: the trainer's own state to resume (best, logged-loss window)."""
        weights, extras = self.objective.split_state(get_model_state_dict(self.model, options=_FULL))
        optimizer = get_optimizer_state_dict(self.model, self.optimizer, options=_FULL)
        ema = None
        if self.ema is not None:
            with self.ema.applied(self.model):
                ema = get_model_state_dict(self.model, options=_FULL)
        rngs = all_gather_objects(rng_state())
        path = step_dir(self.run_dir, step)
        if self.d.is_main:
            state = {
                "step": step,  # also the data position: the loader restarts at this step's global batch
                "samples_seen": step * self.cfg.batch_size, "optimizer": optimizer,
                "scheduler": self.scheduler.state_dict(), "ema": ema, "rng": rngs,
                "class_names": self.data_class_names, "world_size": self.d.world,
                "objective": extras,  # self-supervision: mask token and prediction head, not in the weights file
                **training,
            }
            path = write_checkpoint(self.run_dir, step, weights, self.model.config, self.class_names, state,
                                    weights_meta(self.cfg))
            prune_checkpoints(self.run_dir, self.cfg.keep_last)
        barrier()
        self.last = path
        return path

    def save_weights(self, path: Path) -> None:
        """The weights as currently loaded in the model (EMA inside `ema.applied`), gathered from shards."""
        weights, _ = self.objective.split_state(get_model_state_dict(self.model, options=_FULL))
        if self.d.is_main:
            save_weights(path, weights, self.model.config, self.class_names, weights_meta(self.cfg))
        barrier()
