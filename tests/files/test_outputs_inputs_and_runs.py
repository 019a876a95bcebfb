"""No output replaces what a verb reads or what holds a model, --force or not.

- An output that is one of the verb's inputs (the same file by inode: a hard link, a relative spelling) or an
  existing file inside an input folder is refused in one line, exit code 2.
- A run's own files (final and checkpoint weights, state, config.json, metrics) are written only by its training:
  export, predict, eval, fewshot, convert, `vitlab.save` and `vitlab.export_onnx` refuse them.
- Weights are replaced only by weights; a file vitlab wrote is replaced unasked only by an output of its own kind
  (an ONNX file by export, a confusion PNG by eval), another kind needs --force.
Every case checks the user's files by SHA-256.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitlab
from tests.conftest import TINY_TRAIN_FLAGS
from vitlab.cli import main
from vitlab.errors import OutputRefused
from vitlab.files.outputs import written_by

CHECKPOINT = "checkpoints/step_00000002"
RUN_FILES = ["model.safetensors", "config.json", "metrics.jsonl", f"{CHECKPOINT}/model.safetensors",
             f"{CHECKPOINT}/state.pt", f"{CHECKPOINT}/manifest.json"]


def tree_sha(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".vitlab.lock"}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished tiny run with one checkpoint: what every verb reads and none may replace."""
    out = tmp_path_factory.mktemp("outputs") / "run"
    assert main(["-q", "train", "--out", str(out), *TINY_TRAIN_FLAGS, "--steps", "2", "--save-every", "2",
                 "--eval-every", "0"]) == 0
    assert all((out / name).is_file() for name in RUN_FILES)
    return out


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("images") / "digit.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path)
    return path


def one_line(capsys, verb: str, words: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"vitlab {verb}: error: ") and words in err[0], err[0]
    assert "Traceback" not in err[0] and "vitlab-tmp" not in err[0]
    return err[0]


FORCE = [[], ["--force"]]


@pytest.mark.parametrize("force", FORCE, ids=["", "force"])
@pytest.mark.parametrize("target", RUN_FILES)
def test_predict_never_replaces_a_runs_files(run, image, capsys, target, force):
    before = tree_sha(run)
    assert main(["-q", "predict", "--weights", str(run), str(image), "--json-out", str(run / target), *force]) == 2
    one_line(capsys, "predict", "which only its training writes")
    assert tree_sha(run) == before


@pytest.mark.parametrize("force", FORCE, ids=["", "force"])
@pytest.mark.parametrize("target", ["model.safetensors", f"{CHECKPOINT}/model.safetensors", "config.json"])
def test_eval_confusion_never_replaces_a_runs_files(run, capsys, target, force):
    before = tree_sha(run)
    assert main(["-q", "eval", "--weights", str(run), "--data", "digits", "--confusion", str(run / target),
                 *force]) == 2
    one_line(capsys, "eval", "which only its training writes")
    assert tree_sha(run) == before


def test_eval_out_into_a_checkpoint_is_refused(run, capsys):
    before = tree_sha(run)
    assert main(["-q", "eval", "--weights", str(run), "--data", "digits", "--out", str(run / CHECKPOINT)]) == 2
    one_line(capsys, "eval", "which only its training writes")
    assert tree_sha(run) == before


@pytest.mark.parametrize("force", FORCE, ids=["", "force"])
def test_fewshot_json_never_replaces_a_runs_config(run, capsys, force):
    before = tree_sha(run)
    assert main(["-q", "fewshot", "--weights", str(run), "--data", "digits", "--json", str(run / "config.json"),
                 *force]) == 2
    one_line(capsys, "fewshot", "which only its training writes")
    assert tree_sha(run) == before


@pytest.mark.parametrize("force", FORCE, ids=["", "force"])
@pytest.mark.parametrize("target", ["model.safetensors", f"{CHECKPOINT}/model.safetensors"])
def test_convert_never_replaces_a_runs_weights(run, tmp_path, capsys, target, force):
    other = tmp_path / "other.safetensors"
    vitlab.save(vitlab.load(run), other)
    before = tree_sha(run)
    assert main(["-q", "convert", str(other), str(run / target), *force]) == 2
    one_line(capsys, "convert", "which only its training writes")
    assert tree_sha(run) == before


@pytest.mark.parametrize("force", [False, True])
def test_the_api_save_never_replaces_a_runs_weights(run, force):
    before = tree_sha(run)
    with pytest.raises(OutputRefused, match="which only its training writes"):
        vitlab.save(vitlab.load(run), run / "model.safetensors", force=force)
    assert tree_sha(run) == before


@pytest.mark.parametrize("force", FORCE, ids=["", "force"])
def test_export_never_replaces_its_own_input(run, capsys, force):
    pytest.importorskip("onnxruntime")
    before = tree_sha(run)
    assert main(["-q", "export", str(run), str(run / "model.safetensors"), *force]) == 2
    one_line(capsys, "export", "which only its training writes")
    assert tree_sha(run) == before


def test_the_api_export_never_replaces_weights(run, tmp_path):
    pytest.importorskip("onnxruntime")
    weights = tmp_path / "w.safetensors"
    vitlab.save(vitlab.load(run), weights)
    before, run_before = sha(weights), tree_sha(run)
    for target in (run / "model.safetensors", weights):
        with pytest.raises(OutputRefused):
            vitlab.export_onnx(vitlab.load(run), target, force=True)
    with pytest.raises(OutputRefused, match="which this command reads"):
        vitlab.export_onnx(weights, weights, force=True)
    assert sha(weights) == before and tree_sha(run) == run_before


# --- inputs, however they are spelled ---------------------------------------------------------------------------
def test_a_hard_link_to_the_weights_is_the_weights(run, image, tmp_path, capsys):
    weights = tmp_path / "w.safetensors"
    vitlab.save(vitlab.load(run), weights)
    link = tmp_path / "predictions.json"
    os.link(weights, link)
    before = sha(weights)
    assert main(["-q", "predict", "--weights", str(weights), str(image), "--json-out", str(link), "--force"]) == 2
    one_line(capsys, "predict", "which this command reads")
    assert sha(weights) == before and link.stat().st_ino == weights.stat().st_ino


def test_convert_onto_its_source_by_another_spelling(run, tmp_path, capsys, monkeypatch):
    weights = tmp_path / "w.safetensors"
    vitlab.save(vitlab.load(run), weights)
    before = sha(weights)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    assert main(["-q", "convert", str(weights), "sub/../w.safetensors", "--force"]) == 2
    one_line(capsys, "convert", "which this command reads")
    assert sha(weights) == before


@pytest.mark.parametrize("flag", ["--csv", "--json-out"])
def test_predict_never_writes_over_an_image_it_reads(run, tmp_path, capsys, flag):
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(2):
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(photos / f"{i}.png")
    before = tree_sha(photos)
    for source in (str(photos), str(photos / "0.png")):  # the folder, or the image named
        assert main(["-q", "predict", "--weights", str(run), source, flag, str(photos / "0.png"), "--force"]) == 2
        one_line(capsys, "predict", "which this command reads")
    assert tree_sha(photos) == before


def test_eval_never_writes_over_its_dataset(run, tmp_path, capsys):
    data = tmp_path / "data"
    for split in ("train", "val"):
        for c in ("a", "b"):
            (data / split / c).mkdir(parents=True)
            Image.fromarray(np.full((8, 8, 3), 9, np.uint8)).save(data / split / c / "0.png")
    before = tree_sha(data)
    target = data / "val" / "a" / "0.png"
    assert main(["-q", "eval", "--weights", str(run), "--data", str(data), "--confusion", str(target),
                 "--force"]) == 2
    one_line(capsys, "eval", "which this command reads")
    assert tree_sha(data) == before


# --- kinds: weights only by weights, a marked file by its own kind -----------------------------------------------
def test_weights_anywhere_are_replaced_only_by_weights(run, image, tmp_path, capsys):
    weights = tmp_path / "w.safetensors"
    vitlab.save(vitlab.load(run), weights)
    before = sha(weights)
    for force in FORCE:
        assert main(["-q", "predict", "--weights", str(run), str(image), "--json-out", str(weights), *force]) == 2
        one_line(capsys, "predict", "holds weights")
        assert main(["-q", "eval", "--weights", str(run), "--data", "digits", "--confusion", str(weights),
                     *force]) == 2
        one_line(capsys, "eval", "holds weights")
    assert sha(weights) == before
    assert main(["-q", "convert", str(run), str(weights)]) == 0  # weights by weights: vitlab's own, replaced
    assert written_by(weights) == "vitlab"


def test_a_marked_file_is_replaced_unasked_only_by_its_own_kind(run, image, tmp_path, capsys):
    png = tmp_path / "confusion.png"
    assert main(["-q", "eval", "--weights", str(run), "--data", "digits", "--confusion", str(png)]) == 0
    assert main(["-q", "eval", "--weights", str(run), "--data", "digits", "--confusion", str(png)]) == 0  # its own
    capsys.readouterr()
    before = sha(png)
    assert main(["-q", "predict", "--weights", str(run), str(image), "--json-out", str(png)]) == 2
    one_line(capsys, "predict", "is a PNG file written by vitlab eval, not a JSON file written by vitlab predict")
    assert sha(png) == before
    assert main(["-q", "predict", "--weights", str(run), str(image), "--json-out", str(png), "--force"]) == 0
    assert written_by(png) == "vitlab predict"
