"""What the loop optimises: image classification (the default) or masked patch prediction (paper Section 4.6).

An objective wraps the model that is saved (a plain ViT) into the module that is trained, computes the loss of a
batch, evaluates, and splits the trained module's state into the vitlab weights file (the ViT, loadable by
`vitlab.load` and `vitlab finetune --init`) and objective-only extras kept with the checkpoint for resuming.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vitlab.data import normalize
from vitlab.data.loader import UnreadableImages
from vitlab.eval.classify import evaluate, per_image_loss
from vitlab.eval.metrics import ClassificationMeter
from vitlab.runtime.device import all_reduce
from vitlab.runtime.precision import autocast_for
from vitlab.selfsup import MaskedPatchPredictor, MPPConfig
from vitlab.selfsup.mpp import validation_summary
from vitlab.train.config import TrainConfig
from vitlab.train.mixup import MixUp
from vitlab.train.optim import classification_loss


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

    def summary(self, metrics: dict[str, float]) -> str:
        """The validation line of the console log."""
        return (f"val loss {metrics['loss']:.4f}  top-1 {100 * metrics['top1']:.2f}%  "
                f"top-5 {100 * metrics['top5']:.2f}%  ({metrics['count']} images)")

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

    def summary(self, metrics: dict[str, float]) -> str:
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
