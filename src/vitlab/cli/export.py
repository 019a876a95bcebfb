"""`vitlab export`: weights as an ONNX file, checked against ONNX Runtime before it is written."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.types import flag_type, force_help
from vitlab.ranges import EXPORT_BATCH, ONNX_OPSET


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write weights as ONNX (checked against ONNX Runtime)",
                       description="Write weights as an ONNX file with a dynamic batch dimension: input 'pixels' "
                                   "(N, 3, H, W) normalised as the weights expect, output 'logits'. ONNX Runtime "
                                   "runs the file on sample images at two batch sizes before it is written; its "
                                   "output must agree with PyTorch's float32 (fp32: 1e-5 relative, int8: 10%), "
                                   "otherwise nothing is written. Needs pip install 'vitlab[onnx]'.")
    p.add_argument("weights", help="weights file or folder, run or checkpoint directory, or a published name")
    p.add_argument("out", help="the .onnx file to write")
    p.add_argument("--precision", type=_precision, default="auto", metavar="{" + ",".join(PRECISIONS) + "}",
                   help="fp32 (auto: fp32, the runtime then picks its own precision) or int8: ONNX Runtime's "
                        "dynamic quantization of the encoder's MatMul weights, head kept float32. No bf16: ONNX "
                        "Runtime's CPU provider has no bf16 kernels to check the file with")
    p.add_argument("--batch-size", type=flag_type(EXPORT_BATCH), default=2,
                   help=f"batch of the traced sample, {EXPORT_BATCH.allowed()}; the check also runs batch + 1 "
                        "(default 2)")
    p.add_argument("--opset", type=flag_type(ONNX_OPSET),
                   help=f"ONNX opset, {ONNX_OPSET.allowed()}: attention needs {ONNX_OPSET.low}, torch's exporter "
                        f"writes up to {ONNX_OPSET.high} (default: the exporter's own)")
    p.add_argument("--force", action="store_true",
                   help=force_help("the export"))
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run_export)


PRECISIONS = ("auto", "fp32", "int8")  # what export offers; bf16 is passed on, for the library's refusal to explain


def _precision(text: str) -> str:
    if text not in (*PRECISIONS, "bf16"):
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(PRECISIONS)})")
    return text


def run_export(args: argparse.Namespace) -> int:
    from vitlab.deploy import export_weights

    report = export_weights(args.weights, args.out, precision=args.precision, batch_size=args.batch_size,
                            opset=args.opset, force=args.force)
    if args.json:
        c = report.check
        print(json.dumps({"path": str(report.path), "precision": report.precision, "bytes": report.bytes,
                          "batch_sizes": list(c.batch_sizes), "relative_error": c.error, "bound": c.bound,
                          "float32_rounding": c.float32_rounding, "note": report.note}))
    else:
        print(report.line())
    return 0
