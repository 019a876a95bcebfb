"""Building what a run needs from its config: run directory, datasets, model, loaders, RNG state."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitlab.data import (
    Datasets,
    EvalTransform,
    ShardSampler,
    StepSampler,
    TrainTransform,
    TransformedSplit,
    make_loader,
)
from vitlab.data.augment import with_augmentation
from vitlab.data.errors import DataError, describe_paths
from vitlab.data.loader import PartsLoader
from vitlab.data.stream import training_order
from vitlab.files.outputs import atomic_write
from vitlab.models.config import ViTConfig
from vitlab.models.registry import build_model as build_from_config
from vitlab.models.registry import describe_architecture, model_config
from vitlab.train.config import TrainConfig
from vitlab.train.distributed import Dist
from vitlab.train.resolve import InitWeights, read_init
from vitlab.weights.load import model_from_checkpoint


def check_classes(cfg: TrainConfig, data: Datasets) -> None:
    if cfg.num_classes is not None and cfg.num_classes != data.num_classes:
        raise DataError(
            f"num_classes mismatch: --num-classes {cfg.num_classes} but {data.source} has {data.num_classes} "
            f"classes ({describe_paths(data.class_names, 5)})"
        )
    if len(data.train) == 0:
        raise DataError(f"the training split of {data.source} is empty; add images or lower --val-fraction")
    if len(data.val) == 0:
        raise DataError(f"the validation split of {data.source} is empty; add images or raise --val-fraction")


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
                raise ValueError(f"--drop-path-rate: {config.name or type(config).__name__} has no stochastic "
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
        raise ValueError(f"--representation-size applies to ViTs; {cfg.model} has no representation layer")
    return {"representation_size": cfg.representation_size or None}


def build_model(cfg: TrainConfig, class_names: list[str], with_head: bool = True,
                init: InitWeights | None = None) -> nn.Module:
    """From scratch (`--model`) or, for fine-tuning, from `--init` weights in any format `vitlab.load` reads
    (or a run directory; `init`: the resolution step's read of them, else they are read here): position
    embedding resampled to the run's image size and, as the paper prescribes, the whole head replaced by a
    zero-initialised one for the new classes. Without a head for self-supervision."""
    k = len(class_names) if with_head else 0
    if cfg.init:
        if cfg.representation_size or cfg.head_bias_init:
            raise ValueError("--representation-size and --head-bias-init shape a model trained from scratch; "
                             "fine-tuning replaces the head with a zero one (paper Section 3.2): leave them unset")
        init = init or read_init(cfg.init)
        model = model_from_checkpoint(init.checkpoint, init.path, image_size=cfg.image_size)
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
    programs) pushed off a core, which made a 2-core run 8x slower than with one thread."""
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


def rng_state() -> dict[str, Any]:
    """Every generator the step may draw from, in types `torch.load(weights_only=True)` accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
