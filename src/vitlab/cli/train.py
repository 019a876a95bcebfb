"""`vitlab train` and `vitlab finetune`: flags onto `vitlab.train` functions.

Every training flag defaults to None, meaning "the recipe's value" (or, with --resume, the recorded run's), so
only the flags a user types change anything.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from vitlab.cli import UserError
from vitlab.cli.recipes import RecipeHelp
from vitlab.cli.types import (
    DATA_SOURCES,
    MODEL_SIZES,
    PRECISION_HELP,
    device_name,
    flag_type,
    positive_int,
    precision_name,
    setting_type,
)
from vitlab.ranges import EPOCHS, MODEL_FLAGS, SETTINGS

EVAL_RESIZE_HELP = ("evaluation pre-processing: official (whole image to the input size, aspect ignored; vit_jax), "
                    "big_vision (short side to 8/7 of it: 256 for 224, 448 for 384; central crop), "
                    "resize-short-crop (short side to the input size, central crop)")

# flag dest -> TrainConfig field, where the names differ
_RENAMED = {"wd": "weight_decay", "clip": "grad_clip", "tb": "tensorboard", "wandb": "wandb_project"}
_MODEL_ARGS = MODEL_FLAGS  # --depth, --width, --heads, --mlp-dim: argparse dest -> model_args field
_NOT_CONFIG = {"func", "verb", "verbosity", "recipe", "flip", "no_flip", "config", "print_config",
               *_MODEL_ARGS}


def register(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a ViT (default: a small ViT on the embedded digits, minutes on a CPU)",
                           description="Train with a recipe (`vitlab recipes` lists them). A flag left out takes the "
                                       "recipe's value (shown below for the chosen recipe; --print-config shows every "
                                       "resolved value and its source).",
                           add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter)
    _training_flags(train, default_recipe="demo")
    train.set_defaults(func=_train)
    tune = sub.add_parser("finetune", help="fine-tune weights (official .npz, timm, HF, vitlab) on new data",
                          description="Fine-tune: new zero-init head, position embedding resized, SGD recipe.",
                          add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter)
    tune.add_argument("--init", metavar="WEIGHTS",
                      help="weights file or folder to start from (required; --resume of a run may leave it out: the "
                           "run records it)")
    _training_flags(tune, default_recipe="finetune")
    _protocol_flags(tune)
    tune.set_defaults(func=_train)


def _training_flags(p: argparse.ArgumentParser, default_recipe: str) -> None:
    from vitlab.constants import setting_words
    from vitlab.train import RECIPES

    a = p.add_argument
    a("-h", "--help", action=RecipeHelp)
    a("--recipe", choices=sorted(RECIPES),
      help=f"the paper's settings to start from (default {default_recipe}; `vitlab recipes` lists their values and "
           "sources)")
    a("--config", metavar="FILE",
      help="replay a run: its config.json (or a JSON/YAML file of settings); flags still override it")
    a("--print-config", nargs="?", const="text", choices=["text", "json"],
      help="check the settings and data as the run would, print every resolved setting with where its value came "
           "from (recipe, weights, preset, flag) and the schedule in steps and epochs, then exit; `json`: the "
           "config.json the run would write")
    g = p.add_argument_group("data")
    g.add_argument("--data", help=DATA_SOURCES)
    g.add_argument("--val-fraction", type=setting_type("val_fraction"),
                   help="hold out this fraction of train for validation")
    g.add_argument("--strict", action="store_true", default=None, help="unreadable images are fatal")
    g.add_argument("--num-classes", type=setting_type("num_classes"),
                   help="expected class count (checked against the data)")
    g.add_argument("--workers", type=setting_type("workers"),
                   help="data-loading processes (default: CPUs - 1; on CPU at most 8)")
    g.add_argument("--crop-scale", type=setting_type("crop_scale"), nargs=2, metavar=("MIN", "MAX"),
                   help="inception-crop area range")
    g.add_argument("--train-crop", choices=setting_words("train_crop"),
                   help="inception: TF's sample_distorted_bounding_box (official code); inception-subpixel: "
                        "uniform area, fractional boxes (tiny images); resize-random-crop: BiT-HyperRule")
    g.add_argument("--train-resize", choices=setting_words("train_resize"),
                   help="what resamples the training crop: pil (default) or tensor (torch's uint8 kernel: within "
                        "one grey level of PIL; speed: BENCHMARKS.md)")
    g.add_argument("--eval-resize", choices=setting_words("eval_resize"), help=EVAL_RESIZE_HELP)
    g.add_argument("--no-flip", dest="no_flip", action="store_true", help="no random horizontal flip")
    g.add_argument("--flip", dest="flip", action="store_true", help="random horizontal flip")
    m = p.add_argument_group("model")
    m.add_argument("--model", help="variant name, e.g. ViT-B/16 (`vitlab models`)")
    for flag, parse in MODEL_SIZES.items():
        m.add_argument(f"--{flag}", type=parse, help=f"override the variant's {flag}")
    m.add_argument("--image-size", type=setting_type("image_size"), help="training resolution")
    m.add_argument("--dropout", type=setting_type("dropout"),
                   help="dropout after the position embedding and each Dense (fine-tuning: the official model "
                        "config's)")
    m.add_argument("--drop-path-rate", type=setting_type("drop_path_rate"), metavar="RATE",
                   help="stochastic depth: the last block's residual branches are dropped with this probability, "
                        "linearly less in earlier blocks (DeiT: 0.1; AugReg: 0 or 0.1)")
    m.add_argument("--representation-size", type=setting_type("representation_size"), metavar="N",
                   help="`pre_logits` Dense(N) + tanh before the head of a model built from scratch (0: none; "
                        "pre-training recipes: the model's width)")
    m.add_argument("--mean", type=setting_type("mean"), nargs=3,
                   help="input mean (default: what the weights expect)")
    m.add_argument("--std", type=setting_type("std"), nargs=3, help="input std")
    o = p.add_argument_group("optimisation")
    o.add_argument("--optimizer", choices=setting_words("optimizer"),
                   help="adam (decoupled weight decay, i.e. AdamW; pre-training) or sgd with momentum (fine-tuning); "
                        "adamw is accepted and recorded as adam")
    o.add_argument("--lr", type=setting_type("lr"), help="base learning rate")
    o.add_argument("--wd", type=setting_type("weight_decay"), help="decoupled weight decay")
    o.add_argument("--betas", type=setting_type("betas"), nargs=2, help="Adam betas")
    o.add_argument("--momentum", type=setting_type("momentum"), help="SGD momentum")
    o.add_argument("--warmup", type=setting_type("warmup"), help="linear warm-up steps")
    o.add_argument("--decay", choices=setting_words("decay"),
                   help="after warm-up: linear (to --linear-end), cosine (to 0), or step (x0.1 at --lr-drops)")
    o.add_argument("--linear-end", type=setting_type("linear_end"),
                   help="LR at the end of linear decay (official pre-training: 1e-5)")
    o.add_argument("--lr-drops", type=setting_type("lr_drops"), nargs="*", metavar="F",
                   help="step decay: fractions of --steps after which the LR drops x0.1 (BiT-HyperRule 0.3 0.6 0.9)")
    o.add_argument("--clip", type=setting_type("grad_clip"), help="global gradient-norm clipping (0: off)")
    o.add_argument("--objective", choices=setting_words("objective"),
                   help="classify (default) or mpp: masked patch prediction, self-supervised (recipe mpp)")
    o.add_argument("--mpp-target", choices=setting_words("mpp_target"),
                   help="mpp: 3-bit mean colour (paper), its 4x4 downsized variant, or L2 on the pixels")
    o.add_argument("--loss", choices=setting_words("loss"),
                   help="softmax cross-entropy, or sigmoid cross-entropy summed over classes (upstream pre-training)")
    o.add_argument("--head-bias-init", type=setting_type("head_bias_init"), metavar="B",
                   help="initial classifier bias of a model built from scratch (pre-training recipes: -10)")
    o.add_argument("--label-smoothing", type=setting_type("label_smoothing"),
                   help="label smoothing in [0, 1) (the paper: 0)")
    o.add_argument("--mixup", type=setting_type("mixup"), metavar="ALPHA",
                   help="MixUp: λ ~ Beta(α, α) per step (BiT-HyperRule: 0.1 above 20k images); 0: off")
    o.add_argument("--cutmix", type=setting_type("cutmix"), metavar="ALPHA",
                   help="CutMix: a box of 1 - λ of the image from another, λ ~ Beta(α, α), labels mixed by its "
                        "pixels (DeiT: 1.0); with --mixup, each step is one of the two at random; 0: off")
    o.add_argument("--randaug-ops", type=setting_type("randaug_ops"), metavar="N",
                   help="RandAugment: operations per image (AugReg, DeiT: 2; torchvision's RandAugment); 0: off")
    o.add_argument("--randaug-magnitude", type=setting_type("randaug_magnitude"), metavar="M",
                   help="RandAugment level on TF's 0-10 scale, to 20 (AugReg 0/10/15/20, DeiT 9)")
    o.add_argument("--randaug-mstd", type=setting_type("randaug_mstd"), metavar="STD",
                   help="per-image standard deviation of the RandAugment level (DeiT: 0.5)")
    o.add_argument("--random-erasing", type=setting_type("random_erasing"), metavar="P",
                   help="probability of replacing one random box of the image with noise (DeiT: 0.25)")
    o.add_argument("--batch-size", type=setting_type("batch_size"),
                   help="global batch size (all processes, all accumulation steps)")
    o.add_argument("--accum", type=setting_type("accum"), help="gradient accumulation steps")
    o.add_argument("--steps", type=setting_type("steps"), help="optimiser steps")
    o.add_argument("--epochs", type=flag_type(EPOCHS), metavar="N",
                   help="the run's length in passes over the training set: steps = N × training images / batch "
                        "(rounded up); the recipe's warm-up keeps its share; instead of --steps")
    _tuning_flags(p)
    r0 = p.add_argument_group("tracking")
    r0.add_argument("--tb", action="store_true", default=None,
                    help="write TensorBoard events into RUN/tensorboard (pip install 'vitlab[tb]'); off unless given; "
                         "recorded in config.json, so --resume goes on writing them")
    r0.add_argument("--wandb", nargs="?", const="vitlab", metavar="PROJECT",
                    help="also log to Weights & Biases (offline unless WANDB_MODE says otherwise; "
                         "pip install 'vitlab[wandb]'); recorded in config.json, --resume continues the W&B run")
    r = p.add_argument_group("run")
    r.add_argument("--out", help="run directory (default runs/<recipe>-<time>)")
    r.add_argument("--resume", nargs="?", const=True, default=None, type=_resume_mode, metavar="auto",
                   help="continue the run in --out (refused if it holds none: a typo in --out starts nothing); "
                        "--resume auto: continue it, or start it when there is none (supervisors, make demo)")
    r.add_argument("--seed", type=setting_type("seed"),
                   help="seed of the initialisation, data order and augmentation (default 0)")
    r.add_argument("--device", type=device_name, help="auto, cpu, cuda, cuda:N (default auto: CUDA when available)")
    r.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    r.add_argument("--precision", type=precision_name(int8=False),
                   help=PRECISION_HELP + "; bf16 trains under autocast with float32 weights and optimizer state. "
                        "Recorded in config.json; --resume keeps the run's")
    r.add_argument("--fsdp", action="store_true", default=None, help="shard parameters (FSDP2) instead of DDP")
    r.add_argument("--eval-every", type=setting_type("eval_every"), help="evaluate every N steps (0: at the end)")
    r.add_argument("--eval-batch-size", type=setting_type("eval_batch_size"),
                   help="images per evaluation batch (default 256)")
    r.add_argument("--fewshot-every", type=setting_type("fewshot_every"),
                   help="5-shot linear accuracy of the representation every N steps (the paper's pre-training signal)")
    r.add_argument("--save-every", type=setting_type("save_every"),
                   help="checkpoint every N steps (default: with evaluations)")
    r.add_argument("--keep-last", type=setting_type("keep_last"), help="step checkpoints to keep")
    r.add_argument("--log-every", type=setting_type("log_every"),
                   help="steps between training log lines and metrics.jsonl records")


def _lora_targets(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _tuning_flags(p: argparse.ArgumentParser) -> None:
    """Fine-tuning tools: EMA weights, layer-wise lr decay, a frozen backbone, LoRA (docs/training.md)."""
    from vitlab.constants import FREEZE_CHOICES

    f = p.add_argument_group("fine-tuning tools")
    f.add_argument("--ema-decay", "--ema", dest="ema", type=setting_type("ema"), metavar="D",
                   help="EMA of the weights (timm ModelEmaV3): validation, best.safetensors and model.safetensors "
                        "hold them, e.g. 0.9998")
    f.add_argument("--ema-warmup", action="store_true", default=None,
                   help="warm the EMA decay up as timm does: min(D, 1 - k^(-2/3)) at update k")
    f.add_argument("--layer-decay", type=setting_type("layer_decay"), metavar="F",
                   help="layer-wise lr decay (BEiT/MAE/timm): the head at --lr, block i of L at lr * F^(L - i), the "
                        "embeddings at lr * F^(L + 1); e.g. 0.75")
    f.add_argument("--freeze", choices=FREEZE_CHOICES,
                   help="backbone: train the classifier only (head, and pre_logits if any), a linear probe; the "
                        "backbone runs without dropout")
    f.add_argument("--lora", dest="lora_rank", type=positive_int, metavar="RANK",
                   help="LoRA adapters of this rank on the blocks' Linear layers, via peft (pip install "
                        "'vitlab[lora]'); the head trains too, the rest is frozen; saved weights are merged")
    f.add_argument("--lora-alpha", type=setting_type("lora_alpha"), metavar="A",
                   help="LoRA alpha: the adapters are scaled by A / RANK (default RANK: scale 1)")
    f.add_argument("--lora-targets", type=_lora_targets, metavar="qkv,proj,...",
                   help="the Linear layers of each block LoRA adapts: qkv, proj, fc1, fc2 (default qkv)")


def training_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig fields the user set on the command line."""
    values = {k: v for k, v in vars(args).items() if k not in _NOT_CONFIG and v is not None}
    out = {_RENAMED.get(k, k): v for k, v in values.items()}
    for key in ("crop_scale", "betas", "mean", "std", "lr_drops"):
        if key in out:
            out[key] = tuple(out[key])
    model_args = {field: getattr(args, dest) for dest, field in _MODEL_ARGS.items() if getattr(args, dest) is not None}
    if model_args:
        out["model_args"] = model_args
    if args.no_flip or args.flip:
        out["flip"] = bool(args.flip)
    return out


def _resume_mode(text: str) -> str:
    if text != "auto":
        raise argparse.ArgumentTypeError(f"expected nothing or 'auto' after --resume, got {text!r}")
    return text


def build_config(args: argparse.Namespace) -> Any:
    """The run's settings resolved in one step (vitlab.train.resolve): recipe, initial weights, preset,
    --config file and the flags typed here, or the stored run with --resume."""
    from vitlab.train.resolve import resolve

    flags = training_overrides(args)
    if args.resume and not args.out:
        raise UserError("--resume needs --out RUN_DIR: the run to continue")
    if not args.out and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError("pass --out with torchrun: every process must write to the same run directory")
    resuming = bool(args.resume) and (Path(args.out) / "config.json").exists()
    if args.verb == "finetune" and not resuming and "init" not in flags:
        hint = (f"; to start from {flags['model']}'s published weights: --init {flags['model']} (`vitlab models "
                f"--pretrained --model {flags['model']}` lists them)") if "model" in flags else ""
        raise UserError(f"--init WEIGHTS is required for finetune: the weights to start from{hint}")
    if args.verb == "finetune" and not (resuming or args.config) and "data" not in flags:
        raise UserError("--data is required for finetune (an image folder, or digits / mnist)")
    return resolve(args.recipe, flags, config_file=args.config, verb=args.verb)


def _train(args: argparse.Namespace) -> int:
    from vitlab.train import TrainingDiverged

    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(message)s")
    from vitlab.train.fit import planned_lines, planned_record, prepare, train_resolved

    resolved = prepare(build_config(args))  # the run's checks on the settings and data, before anything starts
    if args.print_config == "json":
        if resolved.config.lr_sweep:
            raise UserError("--print-config json prints the config.json of one run; a sweep writes one per learning "
                            "rate (lr_*/config.json): use --print-config")
        print(json.dumps(planned_record(resolved), indent=1))  # what config.json will hold
        return 0
    if args.print_config:
        print("\n".join(planned_lines(resolved)))
        return 0
    from vitlab.errors import PeerLost

    try:
        train_resolved(resolved, args.verb, say=print)
    except TrainingDiverged as err:
        raise UserError(str(err)) from None
    except PeerLost as err:  # not the user's input (exit 2): the job failed around this process
        print(f"vitlab {args.verb}: error: {err}", file=sys.stderr)
        return 1
    return 0


def _lr_list(text: str) -> tuple[float, ...]:
    allowed = SETTINGS["lr_sweep"]
    try:
        return tuple(allowed.parse(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected learning rates like 0.003,0.01, each {allowed.allowed()}, got "
                                         f"{text!r}") from None


def _protocol_flags(p: argparse.ArgumentParser) -> None:
    from vitlab.train.recipes import FINETUNE_PRESETS, describe

    g = p.add_argument_group("fine-tuning protocol (paper Appendix B.1.1, Table 4)")
    g.add_argument("--preset", choices=list(FINETUNE_PRESETS),
                   help="per-dataset settings over the recipe (flags still win): "
                        + "; ".join(describe(name) for name in FINETUNE_PRESETS).replace("%", "%%"))
    g.add_argument("--lr-sweep", type=_lr_list, metavar="LR,LR,...",
                   help="fine-tune once per learning rate on train minus the dev split, choose the best on dev, "
                        "report its test (val split) accuracy; writes sweep.json and sweep.png in --out")
    g.add_argument("--dev-fraction", type=setting_type("dev_fraction"),
                   help="share of each training class held out as the sweep's dev split (paper: 0.02 CIFAR, "
                        "0.1 Pets/Flowers, 0.01 ImageNet)")
    g.add_argument("--refit", action="store_true", default=None,
                   help="after the sweep, fine-tune the chosen lr on all of train (the paper's final runs)")
