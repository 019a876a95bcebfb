"""`vitlab fewshot`: the paper's few-shot linear evaluation of saved weights."""

from __future__ import annotations

import argparse

from vitlab.cli.types import (
    DATA_SOURCES,
    PRECISION_HELP,
    add_compile_flags,
    batch_size,
    device_name,
    float_range,
    force_help,
    fraction,
    int_range,
    new_file,
    precision_name,
)
from vitlab.constants import EVAL_RESIZE_HELP

MAX_SHOTS = 1_000_000  # examples per class
l2_value = float_range(0.0, 1e12, low_open=True)  # the ridge penalty: big_vision sweeps 2^-20 to 2^10


def parse_shots(text: str) -> tuple[int | str, ...]:
    """argparse type of --shots: positive integers or 'all', comma-separated."""
    shots: list[int | str] = []
    for part in text.split(","):
        part = part.strip()
        if part == "all":
            shots.append("all")
        elif part.isdigit() and 0 < int(part) <= MAX_SHOTS:
            shots.append(int(part))
        else:
            raise argparse.ArgumentTypeError(
                f"must be integers from 1 to {MAX_SHOTS:,} or 'all', comma-separated (e.g. 1,5,10,25), got {text!r}")
    return tuple(shots)


def parse_floats(text: str) -> list[float]:
    """argparse type of --l2-sweep: numbers > 0, comma-separated."""
    try:
        return [l2_value(v) for v in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be numbers (> 0 and <= 1e12), comma-separated (e.g. 1,32,1024), got {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    from vitlab.constants import EVAL_RESIZES, FEWSHOT_RESIZE

    p = sub.add_parser("fewshot", help="few-shot linear evaluation (closed-form ridge; paper Section 4.1)",
                       description="Few-shot linear evaluation of a frozen representation: draws k examples per "
                                   "class from the train split (3 seeds), fits closed-form ridge regression, "
                                   "reports accuracy on the val/test split.")
    p.add_argument("--weights", required=True, help="weights file, folder or run directory")
    p.add_argument("--data", default="digits", help=DATA_SOURCES + " (default digits)")
    p.add_argument("--shots", default="1,5,10,25", type=parse_shots,
                   help="shots per class, comma-separated; 'all' = linear probe (default 1,5,10,25)")
    p.add_argument("--seeds", type=int_range(1, 1000), default=3, help="random draws per shot count (default 3)")
    p.add_argument("--l2", type=l2_value, default=2.0**10, help="ridge L2 (default 1024: big_vision's 2^10)")
    p.add_argument("--l2-sweep", type=parse_floats,
                   help="also report the best of these L2 values (chosen on test: optimistic)")
    p.add_argument("--random-init", action="store_true",
                   help="evaluate a freshly initialised model of the same architecture (a baseline)")
    p.add_argument("--eval-resize", default=FEWSHOT_RESIZE, choices=[FEWSHOT_RESIZE, *EVAL_RESIZES],
                   help="fewshot (default; big_vision common_fewshot: resize to 256x256 ignoring the aspect ratio, "
                        "central crop 224, scaled by 8/7 for other sizes), or an " + EVAL_RESIZE_HELP)
    p.add_argument("--batch-size", type=batch_size, default=256, help="images per forward pass (default 256)")
    p.add_argument("--device", type=device_name, default="auto",
                   help="cpu, cuda or cuda:N (default auto: CUDA when available)")
    p.add_argument("--precision", type=precision_name(int8=False), default="auto",
                   help=PRECISION_HELP + " of the features (the ridge regression is float64)")
    add_compile_flags(p)
    p.add_argument("--val-fraction", type=fraction, metavar="F",
                   help="test on this stratified share of each class of the train split (seed 0), shots drawn "
                        "from the rest (default: the folder's val/ or the embedded test split; a folder without "
                        "val/: 0.2)")
    p.add_argument("--json", dest="json_out", metavar="PATH", type=new_file,
                   help="also write the table as JSON here (accuracies as fractions in [0, 1]; printed in %%)")
    p.add_argument("--force", action="store_true",
                   help=force_help("--json"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vitlab.eval.fewshot_data import FEWSHOT_KIND, fewshot_from_weights, write_fewshot_json
    from vitlab.files.outputs import check_output

    inputs = (args.weights, args.data)  # never replaced by the table
    if args.json_out:  # before minutes of features: a file of the user's is never replaced unasked
        check_output(args.json_out, args.force, kind=FEWSHOT_KIND, inputs=inputs)
    result = fewshot_from_weights(args.weights, args.data, args.shots, args.seeds, args.l2, args.l2_sweep,
                                  args.batch_size, resize=args.eval_resize, val_fraction=args.val_fraction,
                                  device=args.device, precision=args.precision, random_init=args.random_init,
                                  progress=True, compile=args.compile)
    chosen = result.precision
    label = "random init of " if args.random_init else ""
    print(f"few-shot linear accuracy, {label}{args.weights} on {args.data} ({args.eval_resize} pre-processing, "
          f"precision {chosen.name}: {chosen.reason})")
    split = result.splits
    print(f"shots from {split['train_images']} train images; accuracy on {split['test_images']} test images: "
          f"{split['test_split']}")
    print(result.format())
    if args.json_out:
        write_fewshot_json(result, args.json_out, {"weights": str(args.weights), "data": args.data,
                                           "random_init": args.random_init, "eval_resize": args.eval_resize},
                   force=args.force, inputs=inputs)
        print(f"wrote {args.json_out}")
    return 0


__all__ = ["register"]
