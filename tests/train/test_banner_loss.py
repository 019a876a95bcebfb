"""A sigmoid-loss recipe on a small folder says in its banner what the loss implies (it starts near 10 with the
−10 head bias, where softmax starts at log K), and the number it states is the loss the run then logs."""

import json
import math

import numpy as np
from PIL import Image

from tests.conftest import TINY_VIT_FLAGS
from vitlab.cli import main

TINY = [*TINY_VIT_FLAGS, "--image-size",
        "8", "--batch-size", "12", "--warmup", "1", "--workers", "0", "--log-every", "1", "--eval-every", "2"]


def six_class_folder(root):
    rng = np.random.default_rng(0)
    for split, n in (("train", 2), ("val", 1)):
        for c in range(6):
            (root / split / f"class{c}").mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(
                    root / split / f"class{c}" / f"{i}.png")
    return root


def first_train_loss(out) -> float:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return next(r["loss"] for r in records if r.get("split") == "train")


def test_sigmoid_recipe_on_six_classes_states_its_first_loss(tmp_path, caplog):
    caplog.set_level("INFO", logger="vitlab")
    data, out = six_class_folder(tmp_path / "photos"), tmp_path / "run"
    assert main(["train", "--recipe", "pretrain", "--data", str(data), "--out", str(out), "--steps", "1",
                 "--lr", "1e-9", *TINY]) == 0
    expected = math.log1p(math.exp(10)) + 5 * math.log1p(math.exp(-10))  # the true class, then five others
    line = " ".join(next(r.getMessage() for r in caplog.records if "sigmoid cross" in r.getMessage()).split())
    assert line.startswith("loss sigmoid cross-entropy summed over 6 classes, head bias -10: the first steps' loss "
                           f"is about {expected:.2f}, not softmax's log 6 = 1.79"), line
    assert abs(first_train_loss(out) - expected) < 1e-3  # what the banner said is what the run computed


def test_softmax_runs_have_no_loss_line(tmp_path, caplog):
    caplog.set_level("INFO", logger="vitlab")
    assert main(["train", "--data", str(six_class_folder(tmp_path / "p")), "--out", str(tmp_path / "run"),
                 "--steps", "1", *TINY]) == 0
    assert "loss    sigmoid" not in caplog.text and "model   ViT/4" in caplog.text
