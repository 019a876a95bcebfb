"""What people read on the console: `vitlab -q/-v`, progress bars (terminal only, never under -q), accuracies in
percent in every human-readable table (fractions stay in JSON), and MPP validation lines that count patches."""

from __future__ import annotations

import io
import logging
import re
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import vitlab
from tests.conftest import TINY_VIT_ARGS
from vitlab import progress
from vitlab.cli import main
from vitlab.eval.fewshot_lsr import FewshotResult
from vitlab.models import ViTConfig, build_model
from vitlab.train.trainer import Classification, MaskedPatches


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, so that tqdm draws its bar into it."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def default_verbosity():
    yield
    progress.set_verbosity(0)  # main() sets it per call; leave the process as found


def test_quiet_and_verbose_set_the_vitlab_logger(capsys):
    logger = logging.getLogger("vitlab")
    assert main(["-q", "recipes"]) == 0
    assert logger.level == logging.WARNING and progress.quiet()
    assert "demo" in capsys.readouterr().out  # results are still printed
    assert main(["-v", "recipes"]) == 0
    assert logger.level == logging.DEBUG and progress.verbosity() == 1
    assert main(["recipes"]) == 0
    assert logger.level == logging.NOTSET and progress.verbosity() == 0  # whoever configured logging decides
    with pytest.raises(SystemExit):
        main(["-q", "-v", "recipes"])  # one or the other


def test_bars_only_on_a_terminal_and_never_under_quiet(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    for _ in progress.progress(range(3), desc="demo"):
        pass
    assert "\rdemo:   0%|" in sys.stderr.getvalue()  # a bar, redrawn in place
    progress.set_verbosity(-1)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert list(progress.progress(range(3), desc="demo")) == [0, 1, 2]
    assert sys.stderr.getvalue() == ""
    progress.set_verbosity(0)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a pipe or a log file
    list(progress.progress(range(3), desc="demo"))
    assert sys.stderr.getvalue() == ""


@pytest.fixture
def saved_digits_model(tiny_vit_config):
    """`saved_digits_model(path)`: the tiny digits ViT (seed 0) saved at `path`."""

    def save(path):
        torch.manual_seed(0)
        vitlab.save(build_model(tiny_vit_config), path)
        return path

    return save


def test_eval_draws_a_bar_on_a_terminal_and_not_with_quiet(tmp_path, monkeypatch, capsys, saved_digits_model):
    weights = str(saved_digits_model(tmp_path / "m.safetensors"))
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["eval", "--weights", weights, "--data", "digits", "--batch-size", "100"]) == 0
    assert "eval val" in term.getvalue() and "batch" in term.getvalue()  # 4 batches of the 359 test images
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["-q", "eval", "--weights", weights, "--data", "digits", "--batch-size", "100"]) == 0
    assert term.getvalue() == ""
    assert capsys.readouterr().out.startswith("top-1 ")


def test_fewshot_table_is_in_percent_and_json_in_fractions():
    res = FewshotResult(1024.0, {"5": {"mean": 0.5, "per_seed": [0.25, 0.75]}},
                        {"5": {"l2": 1.0, "mean": 0.875}})
    lines = res.format().splitlines()
    assert lines[1].split() == ["5", "50.00%", "25.00%", "75.00%"]
    assert lines[-1].split()[:2] == ["5", "87.50%"]
    assert res.to_dict()["accuracy"]["5"]["per_seed"] == [0.25, 0.75]


def test_predict_prints_percentages(tmp_path, capsys, saved_digits_model):
    from PIL import Image

    weights = str(saved_digits_model(tmp_path / "m.safetensors"))
    img = tmp_path / "x.png"
    Image.new("RGB", (8, 8), (200, 10, 10)).save(img)
    assert main(["predict", "--weights", weights, str(img), "--top-k", "2"]) == 0
    line = capsys.readouterr().out.strip()
    shares = [float(v) for v in re.findall(r" (\d+\.\d)%", line)]
    assert len(shares) == 2 and all(0 <= v <= 100 for v in shares)
    assert main(["predict", "--weights", weights, str(img), "--top-k", "10", "--json"]) == 0
    import json

    probs = [t["probability"] for t in json.loads(capsys.readouterr().out)[0]["top"]]
    assert sum(probs) == pytest.approx(1.0, abs=1e-5)  # JSON keeps fractions


def test_mpp_validation_counts_corrupted_patches_not_images():
    encoder = build_model(ViTConfig(image_size=16, patch_size=4, **TINY_VIT_ARGS,
                                    num_classes=0))
    objective = MaskedPatches("mean-color")
    module = objective.wrap(encoder)
    images = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    batch = {"images": images, "labels": torch.zeros(2, dtype=torch.long), "valid": torch.ones(2, dtype=torch.bool),
             "bad": []}  # as the loader yields them
    metrics = objective.evaluate(module, [batch], torch.device("cpu"), 0, SimpleNamespace(seed=0))
    assert metrics["count"] == 2 * 16 // 2  # half of each image's 16 patches are corrupted
    line = objective.summary(metrics, 0)
    assert line.endswith("(16 corrupted patches)") and "images" not in line
    assert MaskedPatches("mean-color-4x4").summary(metrics, 0).endswith("(16 colour cells, 16 per corrupted patch)")
    assert MaskedPatches("pixels").summary(metrics, 0).startswith("val L2 loss")
    cls = Classification().summary({"loss": 0.5, "top1": 0.25, "top5": 1.0, "count": 8}, 10)
    assert cls == "val loss 0.5000  top-1 25.00%  top-5 100.00%  (8 images)"
    assert np.isfinite(metrics["loss"])


def test_convert_draws_read_and_write_bars_on_a_terminal(tmp_path, monkeypatch, tiny_vit_config):
    from vitlab.weights.jax_npz import write_jax_npz

    model = build_model(tiny_vit_config.replace(gelu="tanh"))
    write_jax_npz(model, tmp_path / "m.npz")
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["convert", str(tmp_path / "m.npz"), str(tmp_path / "m.safetensors")]) == 0
    drawn = term.getvalue()
    assert "read m.npz" in drawn and "tensor" in drawn  # one step per array of the archive
    assert "convert m.npz" in drawn and "/2 [" in drawn and "phase" in drawn  # read, then write
