"""`vitlab eval` outputs: the numbers first, the confusion figure beside the metrics in --out or where --confusion
says (never unasked into the working directory or the run's folder), the misclassified images as a CSV (--errors),
each output replaced by a rerun, and a destination that cannot be written costs the file, not the numbers."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from tests.conftest import TINY_VIT_ARGS
from vitlab.cli import build_parser, main
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


def test_neither_the_run_directory_nor_the_cwd_gets_an_unasked_figure(weights, in_empty_cwd, capsys):
    before = sorted(p.name for p in weights["run"].iterdir())
    assert main(["eval", "--weights", str(weights["run"]), "--data", "digits"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("top-1 ") and "%" in out[0]  # the numbers come first
    assert out[-1] == "confusion matrix: not written (pass --confusion PATH or --out DIR)"  # after the table
    assert sorted(p.name for p in weights["run"].iterdir()) == before  # the run holds what its training wrote
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
    assert confusion_destination(None, None) is None  # no figure unasked, whatever the weights
    assert confusion_destination(None, tmp_path) == tmp_path / "confusion.png"  # beside metrics.json in --out
    assert confusion_destination(None, tmp_path, "digits", "val") == tmp_path / "confusion-digits-val.png"
    assert confusion_destination(tmp_path / "x.png", tmp_path) == tmp_path / "x.png"  # --confusion wins


def softmax_reference(model: VisionTransformer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(predicted class, its softmax probability, label) per digits test image, computed as `reference_top1`."""
    split = load_split("digits", "val")
    x = np.repeat(split.arrays[..., None], 3, axis=-1).astype(np.float32) / 255.0
    x = torch.from_numpy((x - 0.5) / 0.5).permute(0, 3, 1, 2)
    with torch.no_grad():
        probs = model.eval()(x).softmax(-1)
    confidence, predicted = probs.max(-1)
    return predicted.numpy(), confidence.numpy(), split.labels


def test_errors_lists_the_misclassified_images_and_is_replaced_by_a_rerun(weights, tmp_path, capsys):
    errors = tmp_path / "errors.csv"
    argv = ["eval", "--weights", str(weights["file"]), "--data", "digits", "--errors", str(errors)]
    assert main(argv) == 0
    predicted, confidence, labels = softmax_reference(weights["model"])
    wrong = np.flatnonzero(predicted != labels)
    assert 0 < len(wrong) < len(labels)
    rows = list(csv.reader(errors.open()))
    assert rows[0] == ["image", "true", "predicted", "confidence"]
    assert [r[0] for r in rows[1:]] == [f"test[{i}]" for i in wrong]  # embedded images by index, in order
    assert [(int(r[1]), int(r[2])) for r in rows[1:]] == [(labels[i], predicted[i]) for i in wrong]
    assert np.allclose([float(r[3]) for r in rows[1:]], confidence[wrong], atol=1e-5)
    assert f"misclassified: {len(wrong)} images ({errors})" in capsys.readouterr().out
    assert main(argv) == 0  # its own earlier CSV: replaced without --force
    mine = tmp_path / "mine.csv"
    mine.write_text("image,label\nx.png,3\n")
    assert main([*argv[:-1], str(mine)]) == 2
    assert capsys.readouterr().err.strip().endswith("exists and vitlab did not write it; pass --force to replace "
                                                    "it, or choose a new name")
    assert mine.read_text() == "image,label\nx.png,3\n"
    predictions = tmp_path / "preds.csv"  # vitlab predict's CSV is another kind of output
    predictions.write_text("image,class_1,probability_1\nx.png,3,0.5\n")
    assert main([*argv[:-1], str(predictions)]) == 2
    assert "is a CSV file written by vitlab predict, not a CSV file written by vitlab eval" in capsys.readouterr().err


def test_every_output_of_eval_is_replaced_by_the_same_command(weights, tmp_path, capsys):
    out, cm, errors = tmp_path / "o", tmp_path / "cm.png", tmp_path / "e.csv"
    argv = ["eval", "--weights", str(weights["file"]), "--data", "digits", "--out", str(out), "--confusion", str(cm),
            "--errors", str(errors)]
    for _ in range(2):
        assert main(argv) == 0
    capsys.readouterr()
    assert main(["eval", "--weights", str(weights["file"]), "--data", "digits", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["confusion-digits-val.png", "metrics.json"]
    assert main([*argv[:-1], str(cm)]) == 2  # one file for two outputs
    assert capsys.readouterr().err.strip().endswith(f"two outputs of vitlab eval are {cm}; give --errors, "
                                                    "--confusion and --out different files")


def test_top5_is_reported_only_for_more_than_5_classes(weights, tmp_path, capsys):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in ("ant", "bee", "cat"):
            folder = tmp_path / "data" / split / name
            folder.mkdir(parents=True)
            for i in range(2):
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    torch.manual_seed(0)
    model = VisionTransformer(dataclasses.replace(CFG, num_classes=3))
    model.class_names = ["ant", "bee", "cat"]
    vitlab.save(model, tmp_path / "three.safetensors")
    argv = ["eval", "--weights", str(tmp_path / "three.safetensors"), "--data", str(tmp_path / "data")]
    assert main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("top-1 ") and "top-5" not in first  # 100% by construction: not shown
    assert main([*argv, "--json"]) == 0
    assert "top5" not in json.loads(capsys.readouterr().out)
    assert main(["eval", "--weights", str(weights["file"]), "--data", "digits", "--json"]) == 0
    assert "top5" in json.loads(capsys.readouterr().out)  # 10 classes: top-5 says something


def test_eval_and_predict_help_point_to_sections_that_exist():
    verbs = {a.dest: a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)}
    parsers = next(iter(verbs.values())).choices
    texts = [parsers[verb].description or "" for verb in ("eval", "predict")]
    texts += [a.help or "" for verb in ("eval", "predict") for a in parsers[verb]._actions]
    refs = [ref for text in texts for ref in re.findall(r"(README|docs/[\w-]+\.md)[,:]? '([^']+)'", text)]
    assert refs  # the weights and precision help point to the deployment page
    root = Path(__file__).resolve().parents[2]
    for page, section in refs:
        headings = re.findall(r"^#+ (.+)$", (root / (page if page != "README" else "README.md")).read_text(), re.M)
        assert section in headings, f"{page} has no section {section!r}"
