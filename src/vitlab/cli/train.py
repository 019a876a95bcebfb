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
from typing import Any

from vitlab.cli import UserError
from vitlab.cli.recipes import RecipeHelp
from vitlab.cli.types import device_name, flag_type, precision_name


def register(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a ViT (default: a small ViT on the embedded digits, minutes on a CPU)",
                           description="Train with a recipe (`vitlab recipes` lists them). A flag left out takes the "
                                       "recipe's value (shown below for the chosen recipe; --print-config shows every "
                                       "resolved value and its source).",
                           add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter)
    _training_flags(train, "train")
    train.set_defaults(func=_train)
    tune = sub.add_parser("finetune", help="fine-tune weights (official .npz, timm, HF, vitlab) on new data",
                          description="Fine-tune: new zero-init head, position embedding resized, SGD recipe.",
                          add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter)
    _training_flags(tune, "finetune")
    tune.set_defaults(func=_train)


def _training_flags(p: argparse.ArgumentParser, verb: str) -> None:
    """The verb's options: help, --config and --print-config, then one flag per declared setting the verb takes
    (vitlab.train.settings), in its --help group."""
    from vitlab.train.settings import flag_settings

    p.add_argument("-h", "--help", action=RecipeHelp)
    p.add_argument("--config", metavar="FILE",
                   help="replay a run: its config.json (or a JSON/YAML file of settings); flags still override it")
    p.add_argument("--print-config", nargs="?", const="text", choices=["text", "json"],
                   help="check the settings and data as the run would, print every resolved setting with where its "
                        "value came from (recipe, weights, preset, flag) and the schedule in steps and epochs, then "
                        "exit; `json`: the config.json the run would write")
    groups: dict[str | None, Any] = {None: p}
    for declared in flag_settings(verb):
        if declared.group not in groups:
            groups[declared.group] = p.add_argument_group(declared.group)
        add_flag(groups[declared.group], declared, verb)


def add_flag(p: Any, s: Any, verb: str) -> None:
    """The argparse option of declared setting `s` (a vitlab.train.settings.Setting): a switch for a bool (with its
    `--no-` twin where declared), the declared parser, range or choices otherwise; dest is the setting's name."""
    spellings = [s.option, *(f"--{a}" for a in s.aliases)]
    help_text = s.help_for(verb)
    if s.type is bool and s.parse is None:
        if s.negation:  # both spellings store a flag of their own; training_overrides turns them into the setting
            p.add_argument(f"--no-{s.name.replace('_', '-')}", dest=f"no_{s.name}", action="store_true",
                           help=s.negation)
            p.add_argument(*spellings, dest=s.name, action="store_true", help=help_text)
            return
        p.add_argument(*spellings, dest=s.name, action="store_true", default=None, help=help_text)
        return
    kw: dict[str, Any] = {"dest": s.name, "help": help_text}
    if s.choices is not None:
        kw["choices"] = list(s.choices)
    elif s.parse is not None:
        kw["type"] = _PARSERS[s.parse]
    elif s.range is not None:
        kw["type"] = flag_type(s.range)
    nargs = s.nargs
    if nargs is not None:
        kw["nargs"] = nargs
    if s.const is not None:
        kw["const"] = s.const
    metavar = s.metavar
    if metavar is None and s.option[2:] != s.name.replace("_", "-") and "choices" not in kw:
        metavar = s.option[2:].upper().replace("-", "_")  # as argparse would name it from the flag
    if metavar is not None:
        kw["metavar"] = metavar
    p.add_argument(*spellings, **kw)


def _lora_targets(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def training_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the user set on the command line, as vitlab.train.resolve takes them: TrainConfig fields,
    `epochs`, and the architecture flags gathered into model_args."""
    from vitlab.train.settings import flag_settings

    out: dict[str, Any] = {}
    model_args: dict[str, Any] = {}
    for s in flag_settings(args.verb):
        value = getattr(args, s.name)
        if s.negation:
            value = True if value else (False if getattr(args, f"no_{s.name}") else None)
        if value is None:
            continue
        if isinstance(value, list):
            value = tuple(value)
        if s.model_field:
            model_args[s.model_field] = value
        else:
            out[s.name] = value
    if model_args:
        out["model_args"] = model_args
    return out


def _resume_mode(text: str) -> str:
    if text != "auto":
        raise argparse.ArgumentTypeError(f"expected nothing or 'auto' after --resume, got {text!r}")
    return text


def build_config(args: argparse.Namespace) -> Any:
    """The run's settings resolved in one step (vitlab.train.resolve): recipe, initial weights, preset,
    --config file and the flags typed here, or the stored run with --resume."""
    from vitlab.train.resolution import resolve
    from vitlab.train.start import decide_start

    flags = training_overrides(args)
    if args.resume and not args.out:
        raise UserError("--resume needs --out RUN_DIR: the run to continue")
    if not args.out and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError("pass --out with torchrun: every process must write to the same run directory")
    start = decide_start(flags, config_file=args.config, recipe=args.recipe, verb=args.verb)
    resuming = start.case == "continue"
    if args.verb == "finetune" and not resuming and "init" not in flags:
        hint = (f"; to start from {flags['model']}'s published weights: --init {flags['model']} (`vitlab models "
                f"--pretrained --model {flags['model']}` lists them)") if "model" in flags else ""
        raise UserError(f"--init WEIGHTS is required for finetune: the weights to start from{hint}")
    if args.verb == "finetune" and not (resuming or args.config) and "data" not in flags:
        raise UserError("--data is required for finetune (an image folder, or digits / mnist)")
    return resolve(args.recipe, flags, config_file=args.config, verb=args.verb, start=start)


def _train(args: argparse.Namespace) -> int:
    from vitlab.train import TrainingDiverged

    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(message)s")
    from vitlab.train.fitting import planned_lines, planned_record, prepare, train_resolved

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
    from vitlab.train.distributed import Preempted, stop_exit_code

    try:
        result = train_resolved(resolved, args.verb, say=print)
    except Preempted as err:  # a sweep's run stopped by a signal, with its checkpoint
        print(f"vitlab {args.verb}: {err}", file=sys.stderr)
        return stop_exit_code()
    except TrainingDiverged as err:
        raise UserError(str(err)) from None
    except PeerLost as err:  # not the user's input (exit 2): the job failed around this process
        print(f"vitlab {args.verb}: error: {err}", file=sys.stderr)
        return 1
    # preempted (its result line says how to continue): not 0, which a scheduler would take for a finished run
    return stop_exit_code() if getattr(result, "status", None) == "preempted" else 0


def _lr_list(text: str) -> tuple[float, ...]:
    from vitlab.train.settings import SETTINGS

    allowed = SETTINGS["lr_sweep"].range
    try:
        return tuple(allowed.parse(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected learning rates like 0.003,0.01, each {allowed.allowed()}, got "
                                         f"{text!r}") from None


# The flag parsers a setting may name (Setting.parse), for values that are neither a range nor a choice.
_PARSERS = {"device": device_name, "precision": precision_name(int8=False), "words": _lora_targets,
            "learning rates": _lr_list, "resume": _resume_mode}
