"""Evaluation that reports true numbers or none.

- An undecodable image is left out of an evaluation and named in one warning line (fatal under --strict); the
  count and the metrics are those of the readable images, checked against the same folder without that file.
- A protocol that fits on one split and tests on another never tests on its fitting images: a folder without
  val/ holds out a stratified 20% of each class (seed 0), the split is printed and recorded in the JSON.
- Weights with NaN/inf values or a class_names list of the wrong length are refused on load (one line naming
  the tensor); outputs that overflow to NaN are an error, never a printed result with exit code 0.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.cli import main
from vitlab.data import EvalTransform, ShardSampler, TransformedSplit, build_datasets, load_split, make_loader
from vitlab.data.datasets import evaluation_splits
from vitlab.errors import DataError, WeightsError
from vitlab.eval.classify import evaluate
from vitlab.eval.fewshot_data import features_of
from vitlab.eval.metrics import require_finite
from vitlab.models import ViTConfig, build_model

CLASSES = ("a", "b", "c")
TINY = ViTConfig(image_size=8, patch_size=4, width=16, depth=1, mlp_dim=32, num_heads=2, num_classes=3)


def digest(path) -> str:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode() + f.read_bytes())
    return h.hexdigest()


def noise_folder(root, splits=("train", "val"), per_class=10, size=12):
    rng = np.random.default_rng(0)
    for split in splits:
        for name in CLASSES:
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                arr = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(arr).save(root / split / name / f"{i}.png")
    return root


def truncate_jpeg(path):
    """A JPEG whose header opens (the folder scan keeps it) but whose data ends early (decoding fails)."""
    arr = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path, format="JPEG", quality=95)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    return path


@pytest.fixture
def weights(tmp_path):
    torch.manual_seed(0)
    model = build_model(TINY)
    with torch.no_grad():  # a head that does something: the default zero head predicts class 0 for everything
        model.head.weight.normal_(0, 1.0)
    path = tmp_path / "tiny.safetensors"
    model.class_names = list(CLASSES)
    vitlab.save(model, path)
    return path


def error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in err)
    return err


# --- undecodable images in evaluation -------------------------------------------------------------------------
def test_eval_skips_undecodable_image_counts_truly_and_names_it(tmp_path, weights, capsys, caplog):
    root = noise_folder(tmp_path / "data")
    clean = tmp_path / "clean"
    shutil.copytree(root, clean)
    bad = truncate_jpeg(root / "val" / "b" / "bad.jpg")
    before = digest(root)
    with caplog.at_level(logging.WARNING, logger="vitlab.data"):
        assert main(["eval", "--weights", str(weights), "--data", str(root), "--json"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["eval", "--weights", str(weights), "--data", str(clean), "--json"]) == 0
    ref = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["count"] == 30 == ref["count"]  # 31 files, one undecodable: 30 evaluated, as without the file
    for key in ("top1", "loss"):  # (top-5 of these few classes is 100% by construction: not reported)
        assert got[key] == pytest.approx(ref[key], rel=1e-6)
    warnings = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert warnings == [f"evaluation skipped 1 unreadable image(s), not counted: {bad}"]
    assert digest(root) == before


def test_eval_strict_fails_on_undecodable_image(tmp_path, weights, capsys):
    root = noise_folder(tmp_path / "data", per_class=2)
    bad = truncate_jpeg(root / "val" / "c" / "bad.jpg")
    assert main(["eval", "--weights", str(weights), "--data", str(root), "--strict"]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and err[0].startswith("vitlab eval: error: 1 unreadable image(s) in evaluation")
    assert str(bad) in err[0] and "(--strict)" in err[0]


def test_evaluation_loader_marks_invalid_training_loader_substitutes(tmp_path):
    root = noise_folder(tmp_path / "data", per_class=2)
    bad = truncate_jpeg(root / "val" / "a" / "bad.jpg")
    val = load_split(str(root), "val")
    index = val.paths.index(str(bad))
    keys = [(index, 0), (index + 1, 0), (0, -1)]  # the bad image, a good one, the padding of a shard
    batch = TransformedSplit(val, EvalTransform((8, 8))).__getitems__(keys)
    assert batch["valid"].tolist() == [False, True, False] and batch["bad"] == [str(bad)]
    assert batch["images"].shape == (3, 3, 8, 8) and batch["labels"][0] == val.labels[index]
    only_bad = TransformedSplit(val, EvalTransform((8, 8))).__getitems__([(index, 0)])
    assert only_bad["images"].shape == (1, 3, 8, 8) and not only_bad["valid"].any()
    training = TransformedSplit(val, EvalTransform((8, 8)), skip_unreadable=False).__getitems__([(index, 0)])
    assert training["valid"].tolist() == [True] and training["labels"][0] == val.labels[index + 1]


@pytest.mark.parametrize("workers", [0, 1])
def test_training_validation_counts_readable_images_once_warns_once(tmp_path, caplog, workers):
    """The training loop's validation path: build_datasets' val split, an EvalTransform loader (as
    train/trainer.py builds it), evaluate() twice (a run evaluates many times); --strict makes it fatal."""
    root = noise_folder(tmp_path / "data", per_class=3)
    bad = truncate_jpeg(root / "val" / "a" / "bad.jpg")
    model = build_model(TINY)

    def run(loader) -> dict:
        return evaluate(model, loader, torch.device("cpu"), TINY.mean, TINY.std, 3).result()

    for strict in (False, True):
        data = build_datasets(str(root), strict=strict)
        loader = make_loader(TransformedSplit(data.val, EvalTransform((8, 8))), ShardSampler(len(data.val), 4),
                             workers, torch.device("cpu"))
        if strict:
            with pytest.raises(DataError, match=r"1 unreadable image\(s\) in evaluation: .*bad\.jpg \(--strict\)"):
                run(loader)
            continue
        with caplog.at_level(logging.WARNING, logger="vitlab.data"):
            counts = [run(loader)["count"], run(loader)["count"]]
        assert counts == [9, 9] and len(data.val) == 10
        assert [r.getMessage() for r in caplog.records].count(
            f"evaluation skipped 1 unreadable image(s), not counted: {bad}") == 1


def test_fewshot_features_leave_out_undecodable_images(tmp_path, caplog):
    root = noise_folder(tmp_path / "data", per_class=3)
    truncate_jpeg(root / "val" / "a" / "bad.jpg")
    model = build_model(TINY)
    with caplog.at_level(logging.WARNING, logger="vitlab.data"):
        feats, labels = features_of(model, load_split(str(root), "val"), batch_size=4)
    assert feats.shape == (9, 16) and sorted(labels.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert "bad.jpg" in caplog.text


# --- two splits never share an image --------------------------------------------------------------------------
def test_fewshot_on_folder_without_val_holds_out_stratified_20_percent(tmp_path, weights, capsys):
    root = noise_folder(tmp_path / "plain", splits=("",))
    before = digest(root)
    splits = evaluation_splits(str(root))
    assert not set(splits.train.paths) & set(splits.test.paths)
    assert sorted(splits.train.paths + splits.test.paths) == sorted(str(p) for p in root.rglob("*.png"))
    assert np.bincount(splits.test.labels).tolist() == [2, 2, 2]  # 20% of 10 per class
    out_json = tmp_path / "fewshot.json"
    assert main(["fewshot", "--weights", str(weights), "--data", str(root), "--shots", "1,5", "--seeds", "2",
                 "--json", str(out_json)]) == 0
    stdout = capsys.readouterr().out
    assert "accuracy on 6 test images: 20% of each class held out from the train split (stratified, seed 0" in stdout
    record = json.loads(out_json.read_text())
    assert (record["val_fraction"], record["holdout_seed"], record["train_images"], record["test_images"]) == (
        0.2, 0, 24, 6)
    assert "held out" in record["test_split"] and set(record["accuracy"]) == {"1", "5"}
    assert digest(root) == before


def test_fewshot_val_fraction_is_the_training_holdout(tmp_path):
    """--val-fraction draws what training's --val-fraction draws, so a run's validation images are found again;
    a folder with val/ uses val/ unless a fraction is given."""
    root = noise_folder(tmp_path / "data")
    trained = build_datasets(str(root), val_fraction=0.3)
    splits = evaluation_splits(str(root), val_fraction=0.3)
    assert splits.test.paths == trained.val.paths and splits.train.paths == trained.train.paths
    assert np.bincount(splits.test.labels).tolist() == [3, 3, 3]
    assert load_split(str(root), "val", val_fraction=0.3).paths == trained.val.paths
    own = evaluation_splits(str(root))
    assert own.val_fraction is None and all("/val/" in p for p in own.test.paths)
    assert evaluation_splits("digits").record()["test_images"] == 359  # the embedded test split


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, float("nan")])
def test_bad_holdout_fraction_is_refused(tmp_path, fraction):
    root = noise_folder(tmp_path / "plain", splits=("",), per_class=2)
    with pytest.raises(DataError, match=r"--val-fraction must be in \(0, 1\)"):
        evaluation_splits(str(root), val_fraction=fraction)


def test_eval_val_split_of_train_only_folder_names_both_fixes(tmp_path, weights, capsys):
    root = noise_folder(tmp_path / "data", splits=("train",), per_class=2)
    assert main(["eval", "--weights", str(weights), "--data", str(root)]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "has no val/ folder" in err[0] and "--val-fraction" in err[0]


# --- weights values and metadata ------------------------------------------------------------------------------
def saved(tmp_path, name, change=None, class_names=CLASSES):
    model = build_model(TINY)
    if change is not None:
        with torch.no_grad():
            change(model)
    path = tmp_path / name
    model.class_names = list(class_names)
    vitlab.save(model, path)
    return path


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path, capsys, value):
    def poison(m):
        m.blocks[0].mlp.fc1.weight[3, 2] = value

    path = saved(tmp_path, "bad.safetensors", poison)
    image = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(image)
    before = digest(path)
    with pytest.raises(WeightsError, match=r"tensor blocks\.0\.mlp\.fc1\.weight has 1 non-finite value\(s\)"):
        vitlab.load(path)
    for argv in (["predict", "--weights", str(path), str(image)],
                 ["eval", "--weights", str(path), "--data", str(noise_folder(tmp_path / "d", per_class=1))],
                 ["fewshot", "--weights", str(path), "--data", "digits"],
                 ["convert", str(path), str(tmp_path / "out.safetensors")],
                 ["info", str(path)]):  # info says so too, instead of reporting the file as fine
        assert main(argv) == 2
        err = error_lines(capsys)
        assert len(err) == 1 and "blocks.0.mlp.fc1.weight" in err[0] and "non-finite" in err[0]
    assert digest(path) == before and not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize("names", [("a", "b"), ("a", "b", "c", "d")])
def test_class_names_of_the_wrong_length_are_refused(tmp_path, capsys, names):
    path = saved(tmp_path, "names.safetensors", class_names=names)
    image = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(image)
    assert main(["predict", "--weights", str(path), str(image)]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and f"class_names lists {len(names)} names for a head of 3 classes" in err[0]


def test_zero_std_in_metadata_is_refused(tmp_path, capsys):
    from safetensors.torch import save_file

    model = build_model(TINY)
    config = {**TINY.to_dict(), "std": [0.5, 0.0, 0.5]}
    path = tmp_path / "std0.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path),
              metadata={"format": "vitlab", "config": json.dumps(config)})
    image = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(image)
    assert main(["predict", "--weights", str(path), str(image)]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "std" in err[0] and "positive" in err[0]


def test_overflowing_outputs_are_an_error_not_a_nan_result(tmp_path, capsys):
    """Finite weights whose logits overflow to inf: softmax gives NaN; eval's loss is NaN. Neither is printed
    as a result with exit code 0."""
    def overflow(m):
        m.head.weight.fill_(3e38)
        m.head.weight[1].fill_(-3e38)

    path = saved(tmp_path, "overflow.safetensors", overflow)
    image = tmp_path / "x.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(image)
    assert main(["predict", "--weights", str(path), str(image)]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "not finite" in err[0] and "nan" not in capsys.readouterr().out.lower()
    root = noise_folder(tmp_path / "d", per_class=2)
    assert main(["eval", "--weights", str(path), "--data", str(root)]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "not finite" in err[0]


def test_fewshot_non_finite_representation_is_an_error(tmp_path):
    def overflow(m):
        m.norm.weight.fill_(3e38)  # the final LayerNorm's scale: features overflow to inf

    model = vitlab.load(saved(tmp_path, "o.safetensors", overflow))
    with pytest.raises(ValueError, match="representation of the test split has NaN or inf values"):
        features_of(model, load_split("digits", "val"))


def test_require_finite():
    ok = {"loss": 0.5, "top1": 1.0, "top5": 1.0, "count": 3}
    assert require_finite(ok, "x") is ok
    with pytest.raises(ValueError, match="x: no image was evaluated"):
        require_finite({**ok, "count": 0}, "x")
    with pytest.raises(ValueError, match="x: loss is not finite"):
        require_finite({**ok, "loss": float("nan")}, "x")
