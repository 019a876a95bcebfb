"""`vitlab eval` outputs: the numbers first, the confusion figure only where the user's run or --out is (never
the working directory unless asked), and a destination that cannot be written costs the figure, not the numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import vitlab
from tests.conftest import TINY_VIT_ARGS
from vitlab.cli import main
from vitlab.data import load_split
from vitlab.eval.classify import confusion_destination
from vitlab.files.rundir import run_dir_of as run_directory
from vitlab.models import VisionTransformer, ViTConfig
from vitlab.weights.vitlab_format import save

# 8×8 inputs: the digits' own size, so the official resize is the identity and a numpy reference is exact.
CFG = ViTConfig(image_size=8, patch_size=4, **TINY_VIT_ARGS, num_classes=10,
                mean=(0.5,) * 3, std=(0.5,) * 3, name="tiny")


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict:
    """A tiny model saved twice: as a plain file and inside a run directory (metrics.jsonl marks a run)."""
    torch.manual_seed(0)
    model = VisionTransformer(CFG)
    torch.nn.init.normal_(model.head.weight, std=1.0)  # the zero-initialised head would tie every logit
    root = tmp_path_factory.mktemp("eval")
    run = root / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    save(model, run / "model.safetensors", user_named=False)  # as a run's training writes them
    vitlab.save(model, root / "plain.safetensors")
    return {"model": model, "run": run, "file": root / "plain.safetensors"}


@pytest.fixture
def in_empty_cwd(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def reference_top1(model: VisionTransformer) -> float:
    """Top-1 on the digits test split computed by hand: grey arrays to RGB, [-1, 1], forward, argmax."""
    split = load_split("digits", "val")
    x = np.repeat(split.arrays[..., None], 3, axis=-1).astype(np.float32) / 255.0  # (N, 8, 8, 3)
    x = torch.from_numpy((x - 0.5) / 0.5).permute(0, 3, 1, 2)
    with torch.no_grad():
        pred = model.eval()(x).argmax(-1).numpy()
    return float((pred == split.labels).mean())


def test_run_directory_gets_the_figure_and_the_cwd_nothing(weights, in_empty_cwd, capsys):
    assert main(["eval", "--weights", str(weights["run"]), "--data", "digits"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("top-1 ") and "%" in out[0]  # the numbers come first
    assert out[-1] == f"confusion matrix: {weights['run'] / 'confusion-digits-val.png'}"  # after the per-class table
    assert (weights["run"] / "confusion-digits-val.png").stat().st_size > 1000
    assert list(in_empty_cwd.iterdir()) == []


def test_plain_file_writes_no_figure_unless_asked(weights, in_empty_cwd, capsys):
    assert main(["eval", "--weights", str(weights["file"]), "--data", "digits"]) == 0
    out = capsys.readouterr().out
    assert "confusion matrix: not written (pass --confusion PATH or --out DIR)" in out
    assert list(in_empty_cwd.iterdir()) == [] and not (weights["file"].parent / "confusion.png").exists()
    assert main(["eval", "--weights", str(weights["file"]), "--data", "digits", "--confusion", "cm.png"]) == 0
    assert (in_empty_cwd / "cm.png").stat().st_size > 1000  # asked for: there it is


def test_out_folder_holds_metrics_and_figure_matching_a_reference(weights, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["eval", "--weights", str(weights["file"]), "--data", "digits", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["top1"] == pytest.approx(reference_top1(weights["model"]), abs=1e-12)  # fractions in JSON
    assert saved["count"] == 359 and saved["split"] == "val" and saved["data"] == "digits"
    assert f"top-1 {100 * saved['top1']:.2f}%" in printed  # percentages for people
    assert (out / "confusion-digits-val.png").stat().st_size > 1000


def test_unwritable_destination_keeps_the_numbers(weights, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # a folder cannot be created here, even by root
    argv = ["eval", "--weights", str(weights["run"]), "--data", "digits", "--confusion", str(blocker / "cm.png")]
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out.startswith("top-1 ") and "top-5" in cap.out
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitlab eval: warning: cannot write the confusion matrix to")
    assert f"{blocker} is a file, not a folder; the metrics above are complete" in err[0]
    assert not list(tmp_path.glob("**/*vitlab-tmp*"))  # the atomic write left no temporary behind


def test_json_output_is_fractions_and_names_the_figure(weights, tmp_path, capsys):
    argv = ["eval", "--weights", str(weights["file"]), "--data", "digits", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["confusion_png"] is None and 0.0 <= doc["top1"] <= doc["top5"] <= 1.0
    assert main([*argv, "--out", str(tmp_path / "o")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["confusion_png"] == str(tmp_path / "o" / "confusion-digits-val.png")


def test_run_directory_rules(weights, tmp_path):
    run = weights["run"]
    step = run / "checkpoints" / "step_00000010"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text("{}")
    assert run_directory(run) == run
    assert run_directory(run / "model.safetensors") == run  # a file directly in the run
    assert run_directory(step) == run  # a checkpoint of the run
    assert run_directory(weights["file"]) is None and run_directory(tmp_path) is None
    assert confusion_destination(run, None, None) == run / "confusion.png"
    assert confusion_destination(run, None, tmp_path) == tmp_path / "confusion.png"  # --out wins
    assert confusion_destination(run, tmp_path / "x.png", tmp_path) == tmp_path / "x.png"  # --confusion wins
    assert confusion_destination(weights["file"], None, None) is None
