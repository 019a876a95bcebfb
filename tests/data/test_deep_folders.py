"""A folder nested 1,500 deep (deeper than Python's recursion limit) is walked, not a RecursionError: `vitlab
predict` finds the image at its bottom, `vitlab eval` and `vitlab shards` read a dataset whose class folders hold
one, and the walk matches os.walk's entries on an ordinary tree."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitlab
from tests.conftest import TINY_VIT_ARGS
from vitlab.cli import main
from vitlab.data import load_split
from vitlab.data.folder import walk

DEPTH = 1_500


def deep_image(folder: Path, value: int) -> Path:
    """folder/d/d/…/d/x.png, DEPTH folders down (3,000 characters of path: within PATH_MAX)."""
    folder.mkdir(parents=True)
    bottom = folder
    for _ in range(DEPTH):  # one level at a time: mkdir(parents=True) recurses itself
        bottom = bottom / "d"
        bottom.mkdir()
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(bottom / "x.png")
    return bottom / "x.png"


def remove_tree(top: Path) -> None:
    """Delete a tree bottom-up without recursion (shutil.rmtree recurses once per level: a RecursionError at 1,500
    levels)."""
    for root, dirs, files in reversed(list(walk(top))):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            os.rmdir(os.path.join(root, name))
    top.rmdir()


@pytest.fixture(scope="module")
def deep() -> Path:
    """The tree lives outside pytest's temporary folders, whose clean-up (shutil.rmtree) cannot delete it."""
    root = Path(tempfile.mkdtemp(prefix="vitlab-deep-"))
    assert DEPTH > sys.getrecursionlimit()
    for split in ("train", "val"):
        for value, name in ((40, "a"), (200, "b")):
            deep_image(root / "data" / split / name, value)
            Image.fromarray(np.full((8, 8, 3), value + 10, np.uint8)).save(root / "data" / split / name / "top.png")
    model = vitlab.create_model("ViT-Ti/4", num_classes=2, image_size=8, **TINY_VIT_ARGS)
    model.class_names = ["a", "b"]
    vitlab.save(model, root / "w.safetensors")
    try:
        yield root
    finally:
        remove_tree(root)


def test_predict_walks_a_folder_nested_1500_deep(deep, tmp_path):
    out = tmp_path / "p.json"
    assert main(["predict", "--weights", str(deep / "w.safetensors"), str(deep / "data" / "val" / "a"),
                 "--json-out", str(out)]) == 0
    images = [p["image"] for p in json.loads(out.read_text())["predictions"]]
    assert len(images) == 2 and any(i.endswith("/d" * DEPTH + "/x.png") for i in images)


def test_eval_and_shards_read_a_dataset_nested_1500_deep(deep, tmp_path, capsys):
    assert main(["eval", "--weights", str(deep / "w.safetensors"), "--data", str(deep / "data"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 4
    assert main(["shards", str(deep / "data"), str(tmp_path / "shards")]) == 0
    assert len(load_split(str(tmp_path / "shards"), "train")) == 4  # both deep images and both shallow ones


def test_the_walk_lists_what_os_walk_lists(tmp_path):
    for path in ("a/b/c.txt", "a/d.txt", "e/f/g/h.txt", "i.txt", "a/b/j/k.txt"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "a")

    def entries(walker):
        return sorted((root, sorted(dirs), sorted(files)) for root, dirs, files in walker)

    assert entries(walk(tmp_path)) == entries(os.walk(tmp_path))
