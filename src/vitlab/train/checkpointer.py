"""The trainer's checkpointer, a component the trainer asks (as torchtitan's trainer asks its CheckpointManager):
on resume it finds the newest intact checkpoint and puts its state back; during the run it writes a step's
checkpoint (weights, optimizer, scheduler, EMA, the RNG of every process) and keeps the last k, and it writes the
evaluated weights (best.safetensors, model.safetensors). Sharded (FSDP) states are gathered to full ones first;
rank 0 writes, every process takes part in the gathering."""

from __future__ import annotations

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

from vitlab.files.rundir import step_dir
from vitlab.train.checkpoint import prune_checkpoints, save_weights, weights_meta, write_checkpoint
from vitlab.train.config import TrainConfig
from vitlab.train.distributed import Dist, all_gather_objects, barrier
from vitlab.train.ema import Ema
from vitlab.train.optim import replan_schedule
from vitlab.train.resumepoint import ResumePoint, find_resume_point
from vitlab.train.runlog import log
from vitlab.train.setup import rng_state, set_rng_state

__all__ = ["Checkpointer", "ResumePoint", "find_resume_point"]

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class Checkpointer:
    """Writes and restores the state of one run: the model (as trained: sharded or whole), its optimizer,
    schedule and EMA. `last` is the newest checkpoint written or resumed from."""

    def __init__(self, cfg: TrainConfig, d: Dist, objective: Any, model: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any, ema: Ema | None, class_names: list[str], last: Path | None = None,
                 tuning: Any = None):
        self.cfg, self.d, self.objective = cfg, d, objective
        self.run_dir = Path(cfg.out)
        self.model, self.optimizer, self.scheduler, self.ema = model, optimizer, scheduler, ema
        self.data_class_names = list(class_names)  # what resuming checks the data against
        # The class names the saved weights carry: none for an encoder without a head (self-supervision).
        self.class_names = self.data_class_names if model.config.num_classes else None
        self.last = last
        self.tuning = tuning  # vitlab.train.tuning: LoRA's weights are saved merged, its adapters kept for resume

    def restore(self, state: dict[str, Any]) -> None:
        """Optimizer, schedule, EMA and this process's random streams as `state` saved them; a state without an
        optimizer (the run's final weights, its checkpoints gone) keeps the fresh optimizer, the schedule placed
        at its step. A state that does not fit the model is a one-line ValueError naming the checkpoint."""
        if state.get("optimizer") is None:
            _place_schedule(self.scheduler, int(state["step"]))  # built for --steps already: no re-planning
            torch.manual_seed(self.cfg.seed + 1 + 1_000_003 * self.d.rank)
            return
        try:
            self._restore(state)
        except (KeyError, ValueError, RuntimeError, TypeError, IndexError, AttributeError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise ValueError(f"checkpoint {self.last}: its training state does not fit the model ({first}); move "
                             "it aside to resume from the previous checkpoint") from None

    def _restore(self, state: dict[str, Any]) -> None:
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
        full = get_model_state_dict(self.model, options=_FULL)
        weights, extras = self.objective.split_state(self._plain(full))
        optimizer = get_optimizer_state_dict(self.model, self.optimizer, options=_FULL)
        ema = None
        if self.ema is not None:
            # Cloned: on CPU the state dict holds the live parameters, which leaving the block sets back to the
            # trained weights (checkpoints held those as "ema", and a resumed EMA restarted from them).
            with self.ema.applied(self.model):
                ema = {k: v.clone() for k, v in get_model_state_dict(self.model, options=_FULL).items()}
        rngs = all_gather_objects(rng_state())
        path = step_dir(self.run_dir, step)
        if self.d.is_main:
            state = {
                "step": step,  # also the data position: the loader restarts at this step's global batch
                "samples_seen": step * self.cfg.batch_size, "optimizer": optimizer,
                "scheduler": self.scheduler.state_dict(), "ema": ema, "rng": rngs,
                "class_names": self.data_class_names, "world_size": self.d.world,
                "objective": extras,  # self-supervision: mask token and prediction head, not in the weights file
                **self._tuning_state(full),  # LoRA's adapters and the W0 they add to
                **training,
            }
            path = write_checkpoint(self.run_dir, step, weights, self.model.config, self.class_names, state,
                                    weights_meta(self.cfg), settings=self.cfg.to_dict())
            prune_checkpoints(self.run_dir, self.cfg.keep_last)
        barrier()
        self.last = path
        return path

    def save_weights(self, path: Path, step: int | None = None) -> None:
        """The weights as currently loaded in the model (EMA inside `ema.applied`), gathered from shards; `step`
        recorded in their metadata (the final weights': a run whose checkpoints were deleted continues from them)."""
        weights, _ = self.objective.split_state(self._plain(get_model_state_dict(self.model, options=_FULL)))
        if self.d.is_main:
            meta = {**weights_meta(self.cfg), **({"step": step} if step is not None else {})}
            save_weights(path, weights, self.model.config, self.class_names, meta)
        barrier()

    def _tuning_state(self, state: dict[str, Any]) -> dict[str, Any]:
        saved = self.tuning.resume_state(state) if self.tuning is not None else None
        return {"tuning": saved} if saved is not None else {}

    def _plain(self, state: dict[str, Any]) -> dict[str, Any]:
        """The model's state as plain vitlab weights (LoRA's adapters merged by peft)."""
        return self.tuning.weights(state) if self.tuning is not None else state


def _place_schedule(scheduler: Any, step: int) -> None:
    """A fresh LambdaLR as if it had been stepped `step` times (stepping a million times would take seconds)."""
    scheduler.last_epoch = step
    lrs = [base * factor(step) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs
