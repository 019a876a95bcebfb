"""Which ONNX opsets torch's exporter writes for each vitlab family and ONNX Runtime then agrees with: the
evidence for `vitlab.ranges.ONNX_OPSET` (BENCHMARKS.md "int8, ONNX and compile").

    python benchmarks/onnx_opsets.py [--opsets 7-23] [--precision fp32]

Small models of each family (ViT, R50 hybrid, BiT) are traced at each opset as `vitlab export` traces them, outside
its range check, and checked in ONNX Runtime as it checks them. Prints one line per family and opset: ok with the
relative error, "ok, torch warns" where torch says the opset is above what its exporter supports, or the first
line of the failure.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import torch

import vitlab
from vitlab.deploy import onnx_check, onnx_export
from vitlab.models import ResNetConfig

FAMILIES = {
    "ViT-Ti/16 (1 block)": ("ViT-Ti/16", {"depth": 1}),
    "R50+ViT-B/16 (stages (1, 1), width 32)": ("R50+ViT-B/16", {
        "depth": 1, "width": 32, "num_heads": 2, "mlp_dim": 64,
        "resnet": ResNetConfig(layers=(1, 1), width_factor=0.5)}),
    "BiT-R50x1 (one unit per stage)": ("BiT-R50x1", {"layers": (1, 1, 1, 1)}),
}


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.text = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.text += record.getMessage()


def measure(model: torch.nn.Module, opset: int, precision: str) -> str:
    inputs = onnx_check.sample_inputs(model, (2, 3))
    said = _Said()
    onnx_export.log.addHandler(said)
    onnx_export.log.setLevel(logging.DEBUG)
    try:
        with tempfile.TemporaryDirectory() as work:
            traced = Path(work) / "float32.onnx"
            onnx_export._trace(model, inputs[0], traced, opset)
            if precision == "int8":
                onnx_check.quantize_graph(traced, Path(work) / "int8.onnx")
                traced = Path(work) / "int8.onnx"
            check = onnx_check.compare(onnx_check.session(traced), model, inputs, precision)
    except Exception as err:  # what the exporter or ONNX Runtime said, first line
        return "fails: " + (str(err).splitlines() or [type(err).__name__])[0][:160]
    finally:
        onnx_export.log.removeHandler(said)
    verdict = "ok" if check.passed else "disagrees"
    warned = ", torch warns" if "is not supported" in said.text else ""
    return f"{verdict}{warned} ({check.error:.2g} relative, bound {check.bound:.2g})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--opsets", default="7-23", help="LOW-HIGH (default 7-23)")
    parser.add_argument("--precision", choices=["fp32", "int8"], default="fp32")
    args = parser.parse_args()
    low, high = (int(v) for v in args.opsets.split("-"))
    print(f"torch {torch.__version__}")
    for label, (name, overrides) in FAMILIES.items():
        torch.manual_seed(0)
        model = vitlab.create_model(name, num_classes=5, image_size=32, **overrides).eval()
        torch.nn.init.normal_(model.head.weight, std=0.5)  # the zero-initialised head would make every logit 0
        for opset in range(low, high + 1):
            print(f"{label}, opset {opset}: {measure(model, opset, args.precision)}", flush=True)


if __name__ == "__main__":
    main()
