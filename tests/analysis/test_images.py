"""`vitlab analyze` on every data source the trainer accepts, with labelled figures, the images listed in
summary.json, a rollout grid instead of a strip, and the embedding-filter diagnostics (untrained filters, colour
differences left untrained by grey data)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
import vitlab.cli
from vitlab.analysis.embeddings import diagnostic_messages, filter_diagnostics
from vitlab.analysis.figures import RowLabel, short_name
from vitlab.analysis.images import dataset_inputs, is_grey, pick_per_class
from vitlab.models import VisionTransformer, ViTConfig

CLASSES = ["blue", "red"]


@pytest.fixture(autouse=True)
def only_analyze(monkeypatch):
    monkeypatch.setattr(vitlab.cli, "VERB_MODULES", ["analyze"])


def tiny_vit(**kw) -> VisionTransformer:
    base = dict(image_size=16, patch_size=4, width=32, depth=2, mlp_dim=64, num_heads=2, num_classes=2, name="tiny")
    return VisionTransformer(ViTConfig(**{**base, **kw}))


def colour_folder(root, splits=("train", "val"), per_class=3):
    """root/<split>/{blue,red}/k.png: solid colours, so a class is obvious from any pixel."""
    for split in splits:
        for name, rgb in zip(CLASSES, [(20, 40, 220), (220, 30, 20)], strict=True):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for k in range(per_class):
                shade = tuple(min(255, v + 10 * k) for v in rgb)
                Image.new("RGB", (20, 20), shade).save(root / split / name / f"{k}.png")
    return root


def colour_model(tmp_path):
    """A model that answers by colour: the head reads red minus blue from a mean-pooled, attention-free path."""
    torch.manual_seed(0)
    model = tiny_vit(classifier="gap")
    with torch.no_grad():
        for block in model.blocks:  # blocks add nothing: tokens stay the patch embeddings (+ position)
            for p in block.parameters():
                p.zero_()
        model.pos_embed.zero_()
        w = model.patch_embed.proj.weight  # (D, 3, 4, 4)
        w.zero_()
        w[0, 0] = 1.0  # feature 0: red
        w[0, 2] = -1.0  # minus blue
        model.norm.weight.fill_(1.0)
        model.head.weight.zero_()
        model.head.weight[1, 0], model.head.weight[0, 0] = 5.0, -5.0
    model.class_names = CLASSES
    path = tmp_path / "colour.safetensors"
    vitlab.save(model, path)
    return str(path)


def run_cli(argv, capsys):
    try:
        rc = vitlab.cli.main(argv)
    except SystemExit as stop:
        rc = stop.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_image_folder_is_analysed_with_labels(tmp_path, capsys):
    data = colour_folder(tmp_path / "data")
    out = tmp_path / "out"
    rc, stdout, stderr = run_cli(["analyze", "--weights", colour_model(tmp_path), "--data", str(data),
                                  "--out", str(out), "--num-images", "4"], capsys)
    assert rc == 0, stderr
    assert "analysed 4 validation images of" in stdout
    images = json.loads((out / "summary.json").read_text())["input"]["images"]
    # one per class in turn, from val/: blue/0, red/0, blue/1, red/1
    assert [short_name(im["file"]) for im in images] == ["blue/0.png", "red/0.png", "blue/1.png", "red/1.png"]
    assert [im["true_class"] for im in images] == ["blue", "red", "blue", "red"]
    assert [im["predicted_class"] for im in images] == ["blue", "red", "blue", "red"] and all(
        im["correct"] for im in images)
    assert all(0.5 < im["probability"] <= 1.0 for im in images)
    for name in ["attention_rollout.png", "last_layer_heads.png", "embedding_filters.png"]:
        assert (out / name).stat().st_size > 0


def test_train_only_folder_plain_tree_and_single_file(tmp_path, capsys):
    weights = colour_model(tmp_path)
    train_only = colour_folder(tmp_path / "t", splits=("train",))
    plain = colour_folder(tmp_path / "p", splits=("train",)) / "train"  # root/<class>/ directly
    for data, phrase in [(train_only, "training images (no val/ folder) of"), (plain, "validation images of")]:
        rc, stdout, stderr = run_cli(["analyze", "--weights", weights, "--data", str(data), "--out",
                                      str(tmp_path / "o"), "--num-images", "2"], capsys)
        assert rc == 0 and f"analysed 2 {phrase}" in stdout, stderr
    red = str(train_only / "train" / "red" / "1.png")
    rc, stdout, _ = run_cli(["analyze", "--weights", weights, "--data", red, "--out", str(tmp_path / "o")], capsys)
    (image,) = json.loads((tmp_path / "o" / "summary.json").read_text())["input"]["images"]
    assert rc == 0 and image["file"] == red and image["true_class"] == "red"  # the class folder names it
    stray = tmp_path / "stray.png"
    Image.new("RGB", (16, 16), (200, 0, 0)).save(stray)
    rc, _, _ = run_cli(["analyze", "--weights", weights, "--images", str(stray), "--out", str(tmp_path / "o")],
                       capsys)
    (image,) = json.loads((tmp_path / "o" / "summary.json").read_text())["input"]["images"]
    assert rc == 0 and image["true_class"] is None and image["correct"] is None and image["predicted_class"] == "red"


def test_unknown_data_is_one_line(tmp_path, capsys):
    rc, _, stderr = run_cli(["analyze", "--weights", colour_model(tmp_path), "--data", str(tmp_path / "nope"),
                             "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and "does not exist" in stderr and stderr.count("\n") == 1


def test_rollout_is_a_grid_not_a_strip(tmp_path, capsys):
    weights = tmp_path / "m.safetensors"
    vitlab.save(tiny_vit(in_chans=1, num_classes=10, mean=(0.5,) * 3, std=(0.5,) * 3), weights)
    rc, _, stderr = run_cli(["analyze", "--weights", str(weights), "--out", str(tmp_path / "o")], capsys)
    assert rc == 0, stderr
    with Image.open(tmp_path / "o" / "attention_rollout.png") as img:
        w, h = img.size
    assert 0.6 < w / h < 2.0, (w, h)  # 8 images: 3 × 3 cells (the old layout was 8 rows: 569 × 2286)


def test_pick_per_class_cycles_through_classes():
    labels = np.array([0, 0, 0, 1, 2, 2])
    assert pick_per_class(labels, 5) == [0, 3, 4, 1, 5]  # firsts of each class, then seconds, …
    assert pick_per_class(labels, 10) == [0, 3, 4, 1, 5, 2]  # never more than there are


def test_dataset_inputs_label_embedded_images():
    cfg = ViTConfig(image_size=8, patch_size=4)
    inputs = dataset_inputs("digits", cfg, (8, 8), 3)
    assert inputs.x.shape == (3, 3, 8, 8) and [im["true_class"] for im in inputs.images] == ["0", "1", "2"]
    assert inputs.images[0]["file"].startswith("digits:test[") and is_grey(inputs.x, cfg)
    assert not is_grey(torch.rand(1, 3, 8, 8) * 2 - 1, cfg)


def test_row_labels():
    label = RowLabel("/data/val/cat/001.jpg", "cat", "dog 61%", False)
    assert label.lines() == ["cat/001.jpg", "true: cat", "pred: dog 61%"] and label.color == "firebrick"
    assert RowLabel("digits:test[4]").lines() == ["digits:test[4]"] and RowLabel("x").color == "black"


def _pc1_share_numpy(filters: np.ndarray) -> float:
    centred = filters - filters.mean(axis=0)
    s = np.linalg.svd(centred, compute_uv=False)
    return float(s[0] ** 2 / (s**2).sum())


def test_filter_diagnostics_tell_structure_from_noise():
    torch.manual_seed(0)
    fresh = tiny_vit(width=64)
    diag = filter_diagnostics(fresh)
    w = fresh.patch_embed.proj.weight.detach().double().numpy().reshape(64, -1)
    assert diag["pc1_share"] == pytest.approx(_pc1_share_numpy(w), rel=1e-9)
    assert diag["looks_untrained"] and diag["std_over_init"] == pytest.approx(1.0, abs=0.1)  # LeCun-normal init
    assert "look untrained" in diagnostic_messages(diag)[0]
    # Planted structure: every filter a multiple of one pattern plus a little noise.
    pattern = torch.randn(3, 4, 4)
    with torch.no_grad():
        fresh.patch_embed.proj.weight.copy_(torch.randn(64, 1, 1, 1) * pattern + 0.01 * torch.randn(64, 3, 4, 4))
    trained = filter_diagnostics(fresh)
    assert not trained["looks_untrained"] and trained["pc1_share"] > 0.9 and diagnostic_messages(trained) == []


def test_grey_training_leaves_colour_differences_untrained():
    # What training on R = G = B images leaves: a learned grey part (here rank one, the same in every channel)
    # plus the initial noise, whose colour differences no gradient ever touched.
    torch.manual_seed(0)
    model = tiny_vit(width=64)
    init = model.patch_embed.proj.weight.detach().clone()
    learned = torch.randn(64, 1, 1, 1) * torch.randn(1, 1, 4, 4).expand(1, 3, 4, 4)  # grey: equal channels
    with torch.no_grad():
        model.patch_embed.proj.weight.copy_(init + learned)
    diag = filter_diagnostics(model)
    assert diag["colour_untrained"] and not diag["looks_untrained"]
    colour = (init - init.mean(dim=1, keepdim=True)).double().numpy().reshape(64, -1)
    assert diag["colour_pc1_share"] == pytest.approx(_pc1_share_numpy(colour), rel=1e-6)  # float32 sum: the init's
    assert "grey images (R = G = B)" in diagnostic_messages(diag)[0]


def test_grey_inputs_are_named_on_the_filter_figure(tmp_path):
    from vitlab.analysis import analyze

    model = tiny_vit(num_classes=10)
    grey = torch.rand(2, 1, 16, 16).expand(2, 3, 16, 16) * 2 - 1  # R = G = B
    summary = analyze(model, grey, tmp_path)
    assert any("analysed images are grey" in note for note in summary["notes"])
    assert "analysed images are grey" in summary["figures"]["embedding_filters.png"]
