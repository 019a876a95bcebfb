"""`vitlab eval` prints per-class precision and recall (checked against scikit-learn on the same predictions) and
names its confusion figure after the data and split, so a second evaluation of a run adds a figure instead of
replacing the first."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import precision_recall_fscore_support

from tests.conftest import TINY_VIT_ARGS
from vitlab.cli import main
from vitlab.data import load_split
from vitlab.eval.classify import confusion_name, per_class_lines
from vitlab.models import VisionTransformer, ViTConfig
from vitlab.weights.vitlab_format import save

CFG = ViTConfig(image_size=8, patch_size=4, **TINY_VIT_ARGS, num_classes=10,
                mean=(0.5,) * 3, std=(0.5,) * 3, name="tiny")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    torch.manual_seed(0)
    model = VisionTransformer(CFG)
    torch.nn.init.normal_(model.head.weight, std=1.0)  # the zero head would predict one class for everything
    run = tmp_path_factory.mktemp("eval") / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")  # marks a run directory
    save(model, run / "model.safetensors", user_named=False)  # as a run's training writes them
    return run, model


def reference_predictions(model):
    split = load_split("digits", "val")
    x = np.repeat(split.arrays[..., None], 3, axis=-1).astype(np.float32) / 255.0
    with torch.no_grad():
        pred = model.eval()(torch.from_numpy((x - 0.5) / 0.5).permute(0, 3, 1, 2)).argmax(-1).numpy()
    return split.labels, pred


@pytest.mark.parity
def test_per_class_precision_and_recall_match_sklearn(run, capsys):
    folder, model = run
    assert main(["eval", "--weights", str(folder), "--data", "digits", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["per_class"]
    labels, pred = reference_predictions(model)
    p, r, _, support = precision_recall_fscore_support(labels, pred, labels=range(10), zero_division=np.nan)
    assert [row["class"] for row in rows] == [str(k) for k in range(10)]
    assert [row["images"] for row in rows] == support.tolist()
    for row, pk, rk in zip(rows, p, r, strict=True):
        assert (row["precision"] is None) == bool(np.isnan(pk)) and (row["recall"] is None) == bool(np.isnan(rk))
        assert row["precision"] is None or row["precision"] == pytest.approx(pk, abs=1e-12)
        assert row["recall"] is None or row["recall"] == pytest.approx(rk, abs=1e-12)
    assert main(["eval", "--weights", str(folder), "--data", "digits"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["class", "precision", "recall", "images"] and len(out) == 1 + 11 + 1
    row3 = next(row for row in rows if row["class"] == "3")
    assert out[5].split()[0] == "3" and out[5].split()[-1] == str(row3["images"])


def test_the_figure_is_named_after_data_and_split(run, tmp_path, capsys):
    folder, _ = run
    out = tmp_path / "report"
    for split in ("val", "train"):
        assert main(["eval", "--weights", str(folder), "--data", "digits", "--split", split, "--out", str(out)]) == 0
        figure = out / f"confusion-digits-{split}.png"
        assert capsys.readouterr().out.splitlines()[-1] == f"confusion matrix: {figure}"
    assert (out / "confusion-digits-val.png").stat().st_size > 1000  # the first one is still there
    assert (out / "confusion-digits-train.png").stat().st_size > 1000
    assert confusion_name("/data/photos/", "val") == "confusion-photos-val.png"
    assert confusion_name("mnist:10", "train") == "confusion-mnist_10-train.png"
    assert confusion_name("hf:owner/cats & dogs", "val") == "confusion-cats_dogs-val.png"


def test_figure_names_of_datasets_in_different_folders_differ(tmp_path, monkeypatch):
    """`.` and `..` name the folder they stand for, and names in other alphabets stay what they are: otherwise
    `vitlab eval --data .` in two dataset folders, or datasets named 'фото' and '写真', share one figure, the
    second replacing the first."""
    (tmp_path / "cats" / "val").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cats")
    assert confusion_name(".", "val") == confusion_name("./", "val") == "confusion-cats-val.png"
    assert confusion_name("val/..", "val") == "confusion-cats-val.png"
    monkeypatch.chdir(tmp_path / "cats" / "val")
    assert confusion_name("..", "train") == "confusion-cats-train.png"
    assert confusion_name("/data/фото", "val") == "confusion-фото-val.png"
    assert confusion_name("写真", "val") == "confusion-写真-val.png"
    long = confusion_name("/data/" + "写" * 200, "train")
    assert len(long.encode()) <= 150 and long.startswith("confusion-写写") and long.endswith("-train.png")
    assert confusion_name("/", "val") == confusion_name("😀", "val") == "confusion-data-val.png"
    assert "/" not in confusion_name("digits", "val/../x")


def test_many_classes_show_the_lowest_recall():
    rows = [{"class": f"c{k}", "precision": 0.5, "recall": k / 100, "images": 10} for k in range(100)]
    lines = per_class_lines(rows, limit=5)
    assert "(5 of 100 classes, lowest recall first" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["c0", "c1", "c2", "c3", "c4"]


def test_long_confusion_titles_wrap_inside_the_figure(tmp_path):
    import torch
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from vitlab.eval.metrics import confusion_figure, plot_confusion_matrix

    title = "Confusion matrix of " + "/very/long/run/directory/name" * 6 + " on a dataset with a long name"
    names = ["a class whose name goes on and on and on", "b", "c"]
    fig = confusion_figure(torch.eye(3, dtype=torch.long), names, title)
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    box, frame = ax.title.get_window_extent(), fig.bbox
    assert "\n" in ax.title.get_text() and frame.x0 <= box.x0 and box.x1 <= frame.x1  # wrapped, not cut off
    assert "".join(ax.title.get_text().split()) == "".join(title.split())  # every character kept
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[0] == "a class whose name goes…" and ticks[1:] == ["b", "c"]
    assert plot_confusion_matrix(torch.eye(3, dtype=torch.long), names, tmp_path / "c.png", title).stat().st_size
