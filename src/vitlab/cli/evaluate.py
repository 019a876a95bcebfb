"""`vitlab eval` and `vitlab predict`: trained weights on a dataset or on image files."""

from __future__ import annotations

import argparse
import json

from .train import EVAL_RESIZE_HELP
from .types import device_name, non_negative_int, positive_int


def register(sub: argparse._SubParsersAction) -> None:
    _register_eval(sub)
    _register_predict(sub)


def _register_eval(sub: argparse._SubParsersAction) -> None:
    from ..data.transforms import EVAL_RESIZES

    p = sub.add_parser("eval", help="top-1/top-5 and a confusion matrix of weights on a dataset",
                       description="Evaluate weights (file, checkpoint or run directory) on a dataset split.")
    p.add_argument("--weights", required=True, help="weights file, checkpoint directory or run directory")
    p.add_argument("--data", required=True, help="embedded dataset (digits, mnist) or image folder")
    p.add_argument("--split", default="val", choices=["val", "train"], help="embedded sets: val = test split")
    p.add_argument("--eval-resize", choices=EVAL_RESIZES,
                   help=EVAL_RESIZE_HELP + ". Default: the one recorded with vitlab weights, else official")
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--workers", type=non_negative_int, default=0)
    p.add_argument("--device", type=device_name, default="auto")
    p.add_argument("--confusion", default="confusion.png", help="where to write the confusion-matrix PNG")
    p.add_argument("--strict", action="store_true", help="unreadable images are fatal")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.set_defaults(func=_eval)


def _eval(args: argparse.Namespace) -> int:
    from ..train import evaluate_weights

    r = evaluate_weights(args.weights, args.data, args.split, args.batch_size, args.workers, args.device,
                         args.confusion, args.strict, args.eval_resize)
    if args.json:
        print(json.dumps({**r.metrics, "eval_resize": r.eval_resize, "confusion_png": str(r.confusion_png)}))
    else:
        m = r.metrics
        print(f"top-1 {100 * m['top1']:.2f}%  top-5 {100 * m['top5']:.2f}%  loss {m['loss']:.4f}  "
              f"({m['count']} images)  eval resize: {r.eval_resize}")
        print(f"confusion matrix: {r.confusion_png}")
    return 0


def _register_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="top-5 classes of images", description="Classify images with weights.")
    p.add_argument("--weights", required=True, help="weights file, checkpoint directory or run directory")
    p.add_argument("images", nargs="+", help="image files")
    p.add_argument("--top-k", type=positive_int, default=5, help="classes shown per image (at most the model's)")
    p.add_argument("--device", type=device_name, default="auto")
    p.add_argument("--json", action="store_true", help="one JSON document with every image's predictions")
    p.set_defaults(func=_predict)


def _predict(args: argparse.Namespace) -> int:
    from ..train import predict

    results = predict(args.weights, args.images, args.top_k, args.device)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for r in results:
        tops = ", ".join(f"{t['class']} {t['probability']:.3f}" for t in r["top"])
        print(f"{r['image']}: {tops}")
    return 0
