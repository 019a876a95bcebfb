"""`vitlab predict` serving a folder: unreadable files under it skipped with a warning each (a named one is still
an error), batches, --csv / --json-out files under the output rule, and a summary line (images, skipped, img/s)."""

import csv
import hashlib
import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from tests.conftest import TINY_VIT_ARGS
from vitlab.cli import main
from vitlab.eval.prediction import predict
from vitlab.files.marks import CSV, Kind, kind_of

CLASSES = ["cat", "dog", "fox"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    model = vitlab.create_model("ViT-Ti/4", num_classes=3, image_size=8, **TINY_VIT_ARGS)
    with torch.no_grad():  # a head that discriminates: the default zero head gives every class 1/3
        model.head.weight.normal_(0, 1, generator=torch.Generator().manual_seed(0))
    model.class_names = CLASSES
    path = tmp_path_factory.mktemp("w") / "w.safetensors"
    vitlab.save(model, path)
    return str(path)


def photo_folder(root, n=23, broken=("sub/b1.jpg", "zz.png")):
    rng = np.random.default_rng(0)
    for i in range(n):
        path = root / ("sub" if i % 2 else "") / f"img{i:03d}.{'jpg' if i % 3 else 'png'}"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (10 + i, 12, 3), dtype=np.uint8)).save(path)
    for name in broken:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"not an image")
    return root


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_folder_with_unreadable_files_to_csv(weights, tmp_path, capsys, caplog):
    caplog.set_level("INFO", logger="vitlab")
    folder = photo_folder(tmp_path / "photos")
    out = tmp_path / "preds.csv"
    assert main(["predict", "--weights", weights, str(folder), "--csv", str(out), "--batch-size", "4",
                 "--top-k", "2"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # the rows went to the file
    err = captured.err.strip().splitlines()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sorted(warned) == [f"skipping unreadable image {folder / name} (UnidentifiedImageError: not an image "
                              "format Pillow can decode)" for name in ("sub/b1.jpg", "zz.png")]
    assert err[-1].startswith("predicted 23 images, skipped 2 unreadable, in ") and " img/s; written to " in err[-1]
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["image", "class_1", "probability_1", "class_2", "probability_2"]
    assert len(rows) == 1 + 23 and not any("b1.jpg" in r[0] or "zz.png" in r[0] for r in rows)
    expected = predict(weights, [str(folder / "sub"), str(folder / "img000.png")], top_k=2, device="cpu",
                       batch_size=1)  # one at a time, a different grouping
    by_image = {r["image"]: r for r in expected}
    assert len(by_image) == 12 and set(by_image) <= {r[0] for r in rows[1:]}
    for row in rows[1:]:
        if row[0] in by_image:
            top = by_image[row[0]]["top"]
            assert [row[1], row[3]] == [t["class"] for t in top]
            assert np.allclose([float(row[2]), float(row[4])], [t["probability"] for t in top], atol=1e-5)


def test_json_out_and_csv_are_replaced_by_a_rerun_and_a_users_csv_needs_force(weights, tmp_path, capsys):
    folder = photo_folder(tmp_path / "photos", n=5)
    record = tmp_path / "preds.json"
    for _ in range(2):  # the second run replaces its own earlier record
        assert main(["predict", "--weights", weights, str(folder), "--json-out", str(record)]) == 0
    data = json.loads(record.read_text())
    assert list(data)[0] == "written_by" and data["written_by"] == "vitlab predict"
    assert data["images"] == 5 and len(data["predictions"]) == 5 and len(data["predictions"][0]["top"]) == 3
    assert sorted(s["image"].rsplit("/", 1)[-1] for s in data["skipped"]) == ["b1.jpg", "zz.png"]
    out = tmp_path / "p.csv"
    assert main(["predict", "--weights", weights, str(folder), "--csv", str(out)]) == 0
    assert kind_of(out) == Kind("vitlab predict", CSV)  # its header row is its mark
    assert main(["predict", "--weights", weights, str(folder), "--csv", str(out), "--top-k", "1"]) == 0
    assert out.read_text().splitlines()[0] == "image,class_1,probability_1"  # replaced: now one class per row
    capsys.readouterr()
    for theirs in ("image,class,probability\r\nx.png,cat,0.5\r\n",  # another header: a user's table
                   "image,class_1,probability_1,note\nx.png,cat,0.5,mine\n",  # vitlab's columns and one more
                   "name,score\n"):
        out.write_bytes(theirs.encode())
        assert main(["predict", "--weights", weights, str(folder), "--csv", str(out)]) == 2
        assert capsys.readouterr().err.strip().endswith("exists and vitlab did not write it; pass --force to "
                                                        "replace it, or choose a new name")
        assert out.read_bytes() == theirs.encode()
    assert main(["predict", "--weights", weights, str(folder), "--csv", str(out), "--force"]) == 0


def test_a_users_file_is_refused_before_any_work(weights, tmp_path, capsys):
    folder = photo_folder(tmp_path / "photos", n=2)
    mine = tmp_path / "notes.json"
    mine.write_text('{"mine": 1}')
    assert main(["predict", "--weights", weights, str(folder), "--json-out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert "notes.json: exists and vitlab did not write it" in err and "skipping" not in err
    assert mine.read_text() == '{"mine": 1}'


def test_named_unreadable_file_is_an_error_and_an_all_broken_folder_too(weights, tmp_path, capsys):
    folder = photo_folder(tmp_path / "photos", n=1)
    assert main(["predict", "--weights", weights, str(folder / "zz.png")]) == 2
    assert capsys.readouterr().err.startswith(f"vitlab predict: error: cannot read image {folder / 'zz.png'}")
    broken = photo_folder(tmp_path / "broken", n=0)
    assert main(["predict", "--weights", weights, str(broken)]) == 2
    assert "error: none of the 2 images could be read" in capsys.readouterr().err


def test_text_output_keeps_its_lines_and_adds_the_summary(weights, tmp_path, capsys):
    folder = photo_folder(tmp_path / "photos", n=3, broken=())
    assert main(["predict", "--weights", weights, str(folder), "--top-k", "1"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 3 and all(line.split(": ")[1].split()[0] in CLASSES for line in lines)
    assert captured.err.strip().startswith("predicted 3 images, skipped 0 unreadable, in ")


@pytest.fixture
def three_class_weights(tmp_path):
    import vitlab

    model = vitlab.create_model("ViT-Ti/4", num_classes=3, image_size=8, **TINY_VIT_ARGS)
    path = tmp_path / "three.safetensors"
    vitlab.save(model, path)  # no class names: a model built in Python, never trained on named data
    return path


def test_weights_without_class_names_name_classes_by_index(three_class_weights):
    import numpy as np

    import vitlab

    model = vitlab.load(three_class_weights)
    assert model.class_names == ["0", "1", "2"]
    x = vitlab.transforms(model)(np.zeros((8, 8, 3), dtype=np.uint8))  # the README quick start, line by line
    probs = model(x[None]).softmax(-1)[0]
    assert model.class_names[probs.argmax()] in ("0", "1", "2")


def test_predict_takes_a_folder_and_warns_about_top_k_only_when_given(tmp_path, three_class_weights, capsys,
                                                                       caplog):
    import numpy as np
    from PIL import Image

    for name in ("b/2.png", "a/1.png", "a/notes.txt"):
        (tmp_path / "imgs" / name).parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".png"):
            Image.fromarray(np.full((8, 8, 3), 9, dtype=np.uint8)).save(tmp_path / "imgs" / name)
        else:
            (tmp_path / "imgs" / name).write_text("not an image")
    with caplog.at_level("WARNING", logger="vitlab"):
        assert main(["predict", "--weights", str(three_class_weights), str(tmp_path / "imgs")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == [str(tmp_path / "imgs" / "a" / "1.png"),
                                                       str(tmp_path / "imgs" / "b" / "2.png")]
    assert all(line.count("%") == 3 for line in lines)  # a 3-class model shows its 3 classes
    assert "top-k" not in caplog.text  # the default was not the user's choice: no warning
    with caplog.at_level("WARNING", logger="vitlab"):
        assert main(["predict", "--weights", str(three_class_weights), "--top-k", "5",
                     str(tmp_path / "imgs" / "a" / "1.png")]) == 0
    assert "top-k 5 is more than the model's 3 classes: showing all 3" in caplog.text
    capsys.readouterr()  # the calls above end with their summary line on stderr
    (tmp_path / "empty").mkdir()
    assert main(["predict", "--weights", str(three_class_weights), str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'empty'} is a folder without images" in err and err.count("\n") == 1
