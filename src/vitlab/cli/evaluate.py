"""`vitlab eval` and `vitlab predict`: trained weights on a dataset or on image files."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vitlab.cli.types import (
    DATA_SOURCES,
    PRECISION_HELP,
    add_compile_flags,
    batch_size,
    class_count,
    device_name,
    force_help,
    precision_name,
    workers,
)
from vitlab.constants import EVAL_RESIZE_HELP

WEIGHTS_HELP = ("weights file, checkpoint directory or run directory, or a .onnx file vitlab export wrote (run in "
                "ONNX Runtime with the pre-processing its metadata records; needs pip install 'vitlab[onnx]'; see "
                "docs/deployment.md, 'Serving an ONNX file')")
INFER_PRECISION_HELP = PRECISION_HELP + ", or int8 (dynamic int8 Linear layers, CPU)"
USE_EMA_HELP = ("read a training checkpoint's exponential-moving-average weights (timm's train.py state_dict_ema), "
                "as timm's validate.py --use-ema; default: its trained weights (state_dict)")


def register(sub: argparse._SubParsersAction) -> None:
    _register_eval(sub)
    _register_predict(sub)


def _register_eval(sub: argparse._SubParsersAction) -> None:
    from vitlab.constants import EVAL_RESIZES

    p = sub.add_parser("eval", help="top-1/top-5 and a confusion matrix of weights on a dataset",
                       description="Evaluate weights (file, checkpoint or run directory, or an ONNX file vitlab "
                                   "exported) on a dataset split.")
    p.add_argument("--weights", required=True, help=WEIGHTS_HELP)
    p.add_argument("--use-ema", action="store_true", help=USE_EMA_HELP)
    p.add_argument("--data", required=True, help=DATA_SOURCES)
    p.add_argument("--split", default="val", choices=["val", "train"],
                   help="split to evaluate (default val; embedded sets: their test split)")
    p.add_argument("--eval-resize", choices=EVAL_RESIZES,
                   help=EVAL_RESIZE_HELP + ". Default: the one recorded with vitlab weights, else official")
    p.add_argument("--batch-size", type=batch_size, default=256, help="images per forward pass (default 256)")
    p.add_argument("--workers", type=workers, default=0,
                   help="data-loading processes (default 0: in this process)")
    p.add_argument("--device", type=device_name, default="auto",
                   help="cpu, cuda or cuda:N (default auto: CUDA when available)")
    p.add_argument("--precision", type=precision_name(int8=True), default="auto", help=INFER_PRECISION_HELP)
    add_compile_flags(p)
    p.add_argument("--confusion", metavar="PATH",
                   help="write the confusion-matrix PNG here (default: confusion-DATA-SPLIT.png beside metrics.json "
                        "in --out, else no figure)")
    p.add_argument("--out", metavar="DIR",
                   help="folder for metrics.json and confusion-DATA-SPLIT.png (created if needed)")
    p.add_argument("--errors", metavar="PATH",
                   help="write the misclassified images as CSV (image, true, predicted, confidence); an earlier one "
                        "of vitlab eval's is replaced")
    p.add_argument("--strict", action="store_true", help="unreadable images are fatal")
    p.add_argument("--force", action="store_true",
                   help=force_help("--confusion and --errors"))
    p.add_argument("--json", action="store_true",
                   help="print the metrics as JSON (top1/top5 as fractions in [0, 1], top5 only for more than 5 "
                        "classes; the text output is in %%)")
    p.set_defaults(func=_eval)


# The record vitlab eval wrote before it said so (its metrics.json may be replaced by the next evaluation).
EVAL_RECORD_KEYS = frozenset({"top1", "top5", "loss", "count", "eval_resize", "weights", "data", "split"})


def _eval(args: argparse.Namespace) -> int:
    """Metrics first, files after: a destination that cannot be written costs the figure, never the numbers."""
    from vitlab.eval.classify import (
        confusion_destination,
        confusion_name,
        evaluate_weights,
        per_class_lines,
        per_class_metrics,
    )
    from vitlab.eval.metrics import CONFUSION_KIND, informative_metrics
    from vitlab.eval.prediction_files import ERRORS_KIND
    from vitlab.files.outputs import check_output, check_replaceable

    inputs = (args.weights, args.data)  # never replaced by what the evaluation writes
    png = confusion_destination(args.confusion, args.out, args.data, args.split)
    _distinct_outputs(args.errors, png, Path(args.out) / "metrics.json" if args.out else None)
    if args.confusion:  # before any work, as for --out: a file of the user's is never replaced unasked
        check_output(args.confusion, args.force, kind=CONFUSION_KIND, inputs=inputs)
    if args.errors:
        check_output(args.errors, args.force, kind=ERRORS_KIND, inputs=inputs)
    if args.out:  # before any work: a metrics.json or figure of the user's is never replaced
        check_replaceable(args.out, "metrics.json", "vitlab eval",
                          () if args.confusion else (confusion_name(args.data, args.split),),
                          legacy_keys=EVAL_RECORD_KEYS, inputs=inputs)
    r = evaluate_weights(args.weights, args.data, args.split, args.batch_size, args.workers, args.device,
                         None, args.strict, args.eval_resize, precision=args.precision, compile=args.compile,
                         errors=bool(args.errors), session=_session(args))
    m = informative_metrics(r.metrics, len(r.class_names))  # top-5 only where it is not 100% by construction
    record = {**m, "eval_resize": r.eval_resize, "weights": str(args.weights), "data": args.data,
              "split": args.split, "precision": r.precision.to_dict(),
              "compile": r.compiled.to_dict() if r.compiled else None,
              "per_class": per_class_metrics(r.confusion, r.class_names)}
    if not args.json:
        top5 = f"  top-5 {100 * m['top5']:.2f}%" if "top5" in m else ""
        print(f"top-1 {100 * m['top1']:.2f}%{top5}  loss {m['loss']:.4f}  "
              f"({m['count']} images)  eval resize: {r.eval_resize}  precision {r.precision.name} "
              f"({r.precision.reason})", flush=True)
        print("\n".join(per_class_lines(record["per_class"])), flush=True)
    failures = _write_outputs(args, r, record, png)
    if args.json:
        print(json.dumps({**record, "confusion_png": None if r.confusion_png is None else str(r.confusion_png)}))
    else:
        if r.confusion_png is not None:
            print(f"confusion matrix: {r.confusion_png}")
        elif png is None:
            print("confusion matrix: not written (pass --confusion PATH or --out DIR)")
        if args.errors:
            listed = "not written" if any(f.startswith(ERRORS_FAILED) for f in failures) else args.errors
            print(f"misclassified: {len(r.misclassified):,} images ({listed})")
    for failure in failures:
        print(f"vitlab eval: warning: {failure}; the metrics above are complete", file=sys.stderr)
    return 2 if failures else 0


ERRORS_FAILED = "cannot write the misclassified images to"


def _write_outputs(args: argparse.Namespace, r, record: dict, png) -> list[str]:
    """Write the misclassified images (--errors), metrics.json (--out) and the figure; returns one line per file
    that could not be written."""
    from vitlab.eval.classify import write_confusion
    from vitlab.eval.prediction_files import write_errors
    from vitlab.files.outputs import WRITTEN_BY, atomic_write

    failures = []
    if args.errors:
        try:
            write_errors(r.misclassified, args.errors, args.force, (args.weights, args.data))
        except OSError as err:
            failures.append(f"{ERRORS_FAILED} {args.errors}: {_why(err)}")
    if args.out:
        path = Path(args.out) / "metrics.json"
        text = json.dumps({WRITTEN_BY: "vitlab eval", **record}, indent=2) + "\n"
        try:
            atomic_write(path, lambda tmp: Path(tmp).write_text(text))
        except OSError as err:
            failures.append(f"cannot write {path}: {_why(err)}")
    if png is not None:
        try:
            write_confusion(r, png, f"Confusion matrix: {args.data} ({args.split}), top-1 "
                                    f"{100 * r.metrics['top1']:.2f}%", user_named=bool(args.confusion),
                            force=args.force, inputs=(args.weights, args.data))
        except OSError as err:
            failures.append(f"cannot write the confusion matrix to {png}: {_why(err)}")
    return failures


def _session(args: argparse.Namespace):
    """The session --weights needs opened here: the ONNX Runtime session of a .onnx file (`deploy.onnx_serve`), or
    one on a training checkpoint's EMA weights (--use-ema); None: the evaluation opens the weights itself."""
    from vitlab.weights.tensors import is_onnx_path

    if is_onnx_path(args.weights):
        from vitlab.deploy.onnx_serve import open_onnx_session
        from vitlab.errors import WeightsError

        if args.use_ema:
            raise WeightsError(args.weights, "holds no EMA weights (an ONNX file is one graph)", "leave out --use-ema")
        return open_onnx_session(args.weights, device=args.device, precision=args.precision, compile=args.compile)
    if not args.use_ema:
        return None
    from vitlab.runtime.session import open_session
    from vitlab.weights.load import load

    return open_session(load(args.weights, use_ema=True), device=args.device, precision=args.precision,
                        compile=args.compile)


def _distinct_outputs(*paths: Path | str | None) -> None:
    """ValueError (one line) when two of eval's outputs would be the same file: the second would replace the first."""
    seen: dict[Path, str] = {}
    for path in filter(None, paths):
        key = Path(os.path.abspath(path))
        if key in seen:
            raise ValueError(f"two outputs of vitlab eval are {path}; give --errors, --confusion and --out "
                             "different files")
        seen[key] = str(path)


def _why(err: OSError) -> str:
    from vitlab.errors import OutputRefused

    if isinstance(err, OutputRefused):
        return err.strerror
    if isinstance(err, FileExistsError | NotADirectoryError):  # mkdir met a file where a folder should be
        return f"{err.filename} is a file, not a folder"
    return err.strerror or str(err)


def _register_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="top-5 classes of images", description="Classify images with weights.")
    p.add_argument("--weights", required=True, help=WEIGHTS_HELP)
    p.add_argument("--use-ema", action="store_true", help=USE_EMA_HELP)
    p.add_argument("images", nargs="+", help="image files or folders (every image under a folder, sorted)")
    p.add_argument("--top-k", type=class_count,
                   help="classes shown per image (default 5, or all of a model with fewer classes)")
    p.add_argument("--device", type=device_name, default="auto",
                   help="cpu, cuda or cuda:N (default auto: CUDA when available)")
    p.add_argument("--precision", type=precision_name(int8=True), default="auto", help=INFER_PRECISION_HELP)
    add_compile_flags(p)
    p.add_argument("--json", action="store_true",
                   help="one JSON document with every image's predictions (probabilities as fractions in [0, 1])")
    _register_predict_serving(p)
    p.set_defaults(func=_predict)


def _register_predict_serving(p: argparse.ArgumentParser) -> None:
    from vitlab.cli.types import int_range

    p.add_argument("--batch-size", type=int_range(1, 65536), default=32,
                   help="images per forward pass (default 32)")
    p.add_argument("--csv", metavar="PATH", help="write one row per image (image, class_1, probability_1, ...) "
                   "instead of printing them; an earlier one of vitlab predict's is replaced")
    p.add_argument("--json-out", metavar="PATH",
                   help="write the predictions and the skipped images as one JSON record instead of printing them; "
                        "an earlier one of vitlab predict's is replaced")
    p.add_argument("--force", action="store_true", help=force_help("--csv and --json-out"))


def _predict(args: argparse.Namespace) -> int:
    """Predictions on stdout (text or --json), or into --csv / --json-out files; then one summary line on stderr
    (images, skipped, img/s). Unreadable files under a folder are skipped with a warning each."""
    from vitlab.eval.prediction import predict_images
    from vitlab.eval.prediction_files import check_destinations, write_csv, write_predictions_json
    from vitlab.progress import printable

    inputs = (args.weights, *args.images)  # never replaced by the predictions
    check_destinations(args.csv, args.json_out, args.force, inputs)  # before any work: never a file of the user's
    run = predict_images(args.weights, args.images, args.top_k, args.device, args.precision, args.batch_size,
                         args.compile, session=_session(args))
    written = [write_csv(run, args.csv, args.force, inputs)] if args.csv else []
    written += [write_predictions_json(run, args.json_out, args.weights, args.force, inputs)] if args.json_out else []
    if args.json:
        print(json.dumps(run.results, indent=1))
    elif not written:
        for r in run.results:  # names escaped: a newline or terminal escape in a file name stays on its line
            tops = ", ".join(f"{printable(t['class'])} {100 * t['probability']:.1f}%" for t in r["top"])
            print(f"{printable(r['image'])}: {tops}")
    print(run.summary() + "".join(f"; written to {printable(str(path))}" for path in written), file=sys.stderr)
    return 0
