"""`vitlab models`: the named variants with their size and cost (`--pretrained`: the published checkpoints;
`--memory`: the memory per process of training them)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from vitlab.cli.types import image_size
from vitlab.models.memory import OPTIMIZER_STATE, PRECISIONS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the named models with parameters and multiply-adds",
                       description="Every name vitlab.create_model accepts, with its parameter count (1000 "
                                   "classes) and multiply-adds per image (the paper's 'FLOPs').")
    p.add_argument("--image-size", type=image_size, default=224,
                   help="input size for the multiply-add count (default 224)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--pretrained", action="store_true", help="list the published checkpoints vitlab fetches by name")
    p.add_argument("--model", help="with --pretrained: only this architecture (e.g. ViT-B/16)")
    p.add_argument("--dataset", help="with --pretrained: pre-training or fine-tuning data (i21k, i1k)")
    p.add_argument("--resolution", type=image_size, help="with --pretrained: only this input size")
    p.add_argument("name", nargs="?", help="with --memory: the model (default: every plain ViT)")
    p.add_argument("--memory", action="store_true",
                   help="memory per process of training at --image-size: parameters, gradients, optimizer state, "
                        "activations per image (with and without activation checkpointing), checkpoint per process")
    p.add_argument("--world", type=int, nargs="+", default=[8], metavar="N",
                   help="with --memory: processes (GPUs) of the job (default 8)")
    p.add_argument("--precision", choices=PRECISIONS, default="bf16",
                   help="with --memory: fp32, or bf16 autocast over float32 weights (default bf16)")
    p.add_argument("--optimizer", choices=tuple(OPTIMIZER_STATE), default="adam",
                   help="with --memory: adam (pre-training recipes), sgd (momentum: fine-tuning) (default adam)")
    p.add_argument("--batch-size", type=int, default=4096,
                   help="with --memory: the global batch, split over the processes (default 4096, the paper's)")
    p.set_defaults(func=run_models)


def model_rows(image_size: int = 224) -> list[dict[str, Any]]:
    """One row per registry name: parameters at 1000 classes, multiply-adds per image at image_size, both counted
    from the config (no model is built)."""
    from vitlab.models import count_macs, count_parameters, model_config, variant_names

    rows = []
    for name in variant_names():
        cfg = model_config(name, num_classes=1000)
        params = count_parameters(cfg)
        try:
            gmacs: float | None = count_macs(cfg.replace(image_size=image_size)).total / 1e9
        except ValueError:  # the model's patch size (times its stem's stride) does not divide image_size
            gmacs = None
        rows.append({"name": name, "params": params, "gmacs": gmacs, "image_size": image_size})
    return rows


def run_models(args: argparse.Namespace) -> int:
    from vitlab.cli import UserError

    if args.pretrained:
        from vitlab.cli.download import run_pretrained

        return run_pretrained(args)
    if args.image_size < 1:
        raise UserError(f"--image-size must be positive, not {args.image_size}")
    if args.memory:
        return print_memory(args)
    if args.name:
        raise UserError(f"a model name is read with --memory only: vitlab models {args.name} --memory")
    rows = model_rows(args.image_size)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    size = args.image_size
    print(f"{'name':<16} {'params':>13}  {f'GMACs@{size}':>11}")
    for r in rows:
        gmacs = "-" if r["gmacs"] is None else f"{r['gmacs']:.2f}"
        print(f"{r['name']:<16} {r['params']:>13,}  {gmacs:>11}")
    print("GMACs: multiply-adds per image, the unit the paper calls FLOPs (1 MAC = 2 FLOPs); "
          "'-': the size is not a multiple of the model's patch size.")
    return 0


_GIB = 2**30


def memory_rows(names: list[str], worlds: list[int], image_size: int, precision: str, optimizer: str,
                batch_size: int) -> list[dict[str, Any]]:
    """One row per model, world size and strategy (DDP, FSDP2): vitlab.models.memory's plan in bytes, with the
    total at the batch each process takes (with and without activation checkpointing)."""
    from vitlab.models import model_config
    from vitlab.models.memory import memory_plan

    rows = []
    for name in names:
        config = model_config(name, num_classes=1000, image_size=image_size)
        for world in worlds:
            for strategy in ("ddp", "fsdp"):
                plan = memory_plan(config, world, strategy, precision, optimizer)
                per_process = max(1, batch_size // world)
                rows.append({"name": name, "world": world, "strategy": strategy, "batch_per_process": per_process,
                             **plan.to_dict(), "total": plan.total(per_process),
                             "total_checkpointed": plan.total(per_process, checkpointed=True)})
    return rows


def print_memory(args: argparse.Namespace) -> int:
    from vitlab.cli import UserError
    from vitlab.models import model_config, variant_names
    from vitlab.models.config import ViTConfig
    from vitlab.models.registry import unknown_model

    plain = [n for n in variant_names() if isinstance(c := model_config(n), ViTConfig) and c.resnet is None]
    if args.name is not None and args.name not in variant_names():
        raise UserError(unknown_model(args.name))
    if args.name is not None and args.name not in plain:
        raise UserError(f"--memory counts the activations of plain ViTs, not of {args.name}; choose one of "
                        f"vitlab models (ViT-…)")
    if min(args.world) < 1 or args.batch_size < 1:
        raise UserError(f"--world and --batch-size must be positive, not {args.world} and {args.batch_size}")
    try:
        rows = memory_rows([args.name] if args.name else plain, args.world, args.image_size, args.precision,
                           args.optimizer, args.batch_size)
    except ValueError as err:  # the image size is not a multiple of the patch size
        raise UserError(f"{err}; choose another --image-size") from None
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'name':<11} {'world':>5} {'':<4} {'batch':>5} {'weights':>8} {'grads':>7} {'optim':>7} {'extra':>7} "
          f"{'act/img':>8} {'total':>8} {'ckpt-act':>8} {'ckpt/rank':>9}")
    for r in rows:
        gib = {k: r[k] / _GIB for k in ("parameters", "gradients", "optimizer", "total", "total_checkpointed",
                                         "checkpoint")}
        extra = (r["parallel"] + r["autocast"]) / _GIB
        print(f"{r['name']:<11} {r['world']:>5} {r['strategy']:<4} {r['batch_per_process']:>5} "
              f"{gib['parameters']:>8.2f} {gib['gradients']:>7.2f} {gib['optimizer']:>7.2f} {extra:>7.2f} "
              f"{r['activations_per_image'] / 2**20:>7.0f}M {gib['total']:>8.1f} {gib['total_checkpointed']:>8.1f} "
              f"{gib['checkpoint']:>9.2f}")
    print(f"GiB per process ({args.precision}, {args.optimizer}, image {args.image_size}, global batch "
          f"{args.batch_size}); extra: DDP's gradient buckets or FSDP2's gathered blocks, and autocast's weight "
          "casts; act/img in MiB; ckpt-act: total with activation checkpointing; ckpt/rank: what each process "
          "writes per checkpoint (DDP: rank 0 all of it). The plan's rules: vitlab.models.memory.")
    return 0
