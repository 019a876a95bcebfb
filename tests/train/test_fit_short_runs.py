"""A short run can be watched: with --epochs it validates once per epoch and logs at least every tenth of the run
unless the user set the intervals (the banner names the rule as their source), and an EMA longer than the run
is warned about in one line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitlab
from tests.conftest import TINY_VIT_FLAGS
from vitlab.cli import main
from vitlab.errors import keyword_errors
from vitlab.train.finetune import ema_warning
from vitlab.train.resolution import resolve


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """train/ with 4 images of each of 2 classes, val/ with 1: 8 training images."""
    root = tmp_path_factory.mktemp("short")
    rng = np.random.default_rng(0)
    for split, n in (("train", 4), ("val", 1)):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")
    return root


def _records(out: Path, split: str) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def test_an_epochs_run_validates_every_epoch_and_logs_every_tenth(folder, tmp_path, caplog):
    out = tmp_path / "run"
    args = ["train", "--data", str(folder), "--out", str(out), *TINY_VIT_FLAGS, "--image-size", "8", "--batch-size",
            "4", "--workers", "0", "--epochs", "5"]  # 2 steps an epoch, 10 steps
    with caplog.at_level(logging.INFO, logger="vitlab"):
        assert main(args) == 0
    assert [r["step"] for r in _records(out, "val")] == [2, 4, 6, 8, 10]
    assert [r["step"] for r in _records(out, "train")] == list(range(1, 11))
    console = caplog.text
    assert "from flag --epochs 5: once per epoch (8 training images / batch 4): eval_every 2" in console
    assert "from a tenth of the run's 10 steps (recipe demo says 50): log_every 1" in console
    for step in (2, 4, 6, 8, 10):
        assert f"step {step}: val loss" in console
    assert (out / "curves.png").is_file()


def test_intervals_the_user_set_are_kept(folder):
    resolved = resolve("demo", {"data": str(folder), "epochs": 5, "batch_size": 4, "eval_every": 3, "log_every": 5,
                                "out": "unused"})
    assert (resolved.config.eval_every, resolved.config.log_every) == (3, 5)
    assert resolved.sources["eval_every"] == resolved.sources["log_every"] == "flag"


def test_a_long_recipe_interval_follows_a_run_of_steps(folder):
    resolved = resolve("finetune", {"data": str(folder), "steps": 30, "batch_size": 4, "out": "unused"},
                       verb="finetune")
    assert resolved.config.log_every == 3
    assert resolved.sources["log_every"] == "a tenth of the run's 30 steps (recipe finetune says 50)"
    assert resolved.config.eval_every == 1000  # without --epochs, the recipe's (the run validates at its end)


def test_the_ema_warning_rule():
    assert ema_warning(0.99, False, 7) == (
        "--ema-decay 0.99 averages over about 100 steps (1/(1 − decay)), more than this run's 7: the saved EMA "
        "weights are 93% the initial ones (0.99^7); add --ema-warmup, lower the decay below 0.857, or train longer")
    assert ema_warning(0.99, False, 100) is None  # as long as the horizon
    assert ema_warning(0.99, True, 7) is None  # the warm-up's first update copies the weights
    assert ema_warning(0.5, False, 7) is None


def test_an_ema_longer_than_the_run_is_warned_about_once(tmp_path, caplog):
    from tests.conftest import TINY_TRAIN

    with caplog.at_level(logging.INFO, logger="vitlab"):
        vitlab.fit(data="digits", out=tmp_path / "run", steps=7, ema=0.99, progress=False, **TINY_TRAIN)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    in_python = keyword_errors(ema_warning)(0.99, False, 7)  # the run was started from Python: its words
    assert warnings == ["warning: " + in_python] and "ema=0.99" in in_python and "--" not in in_python
