"""A training run imports what it uses: the modules the trainer, the weights entry and the data package need on
the embedded digits, and none of the foreign weights formats, the drawn/Hugging Face/shard data sources, few-shot
evaluation, prediction, self-supervision or the inference compile rule, which the runs that use them import
(checked in a fresh interpreter, since this test process has imported them already)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")
NOT_FOR_A_DIGITS_RUN = [
    "vitlab.weights.hf", "vitlab.weights.hf_bit", "vitlab.weights.timm", "vitlab.weights.jax_npz",
    "vitlab.weights.bit_npz", "vitlab.weights.sharded", "vitlab.data.fractal", "vitlab.data.strokes",
    "vitlab.data.fontglyphs", "vitlab.data.hf_split", "vitlab.data.shards", "vitlab.eval.fewshot_data",
    "vitlab.eval.fewshot_lsr", "vitlab.eval.prediction", "vitlab.selfsup.mpp", "vitlab.runtime.compiling",
]


def test_the_trainer_and_the_data_package_leave_other_features_unimported():
    code = """
import sys
import vitlab.train.fitting, vitlab.train.trainer, vitlab.weights.load, vitlab.data, vitlab.eval
from vitlab.data import build_datasets
build_datasets("digits")
print(" ".join(sorted(m for m in sys.modules if m.startswith("vitlab"))))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert "vitlab.train.trainer" in loaded and "vitlab.data.embedded" in loaded  # the probe ran
    assert sorted(loaded & set(NOT_FOR_A_DIGITS_RUN)) == []
