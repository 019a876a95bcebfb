"""`vitlab predict` on a folder accounts for every entry and writes hostile names harmlessly.

- What it does not predict (a FIFO or a dangling link named like an image, a link to a folder, a file whose name is
  not an image) is counted in the summary and named, with why, in the JSON record's skipped list; a FIFO is never
  opened (it would block).
- A file name holding a newline or an escape sequence prints on one line, escaped; JSON keeps the exact name.
- CSV cells a spreadsheet would read as a formula (=, +, -, @) get a leading apostrophe (OWASP's advice).
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitlab
from vitlab.cli import main
from vitlab.models import ViTConfig, build_model

TINY = ViTConfig(image_size=8, patch_size=4, width=16, depth=1, mlp_dim=32, num_heads=2, num_classes=3)
HOSTILE = ["=HYPERLINK(1).png", "+1.png", "-2.png", "@cmd.png", "line\nbreak.png", "esc\x1b[31mred.png"]


@pytest.fixture
def weights(tmp_path) -> str:
    path = tmp_path / "w.safetensors"
    model = build_model(TINY)
    model.class_names = ["=cat", "dog", "@bird"]
    vitlab.save(model, path)
    return str(path)


@pytest.fixture
def folder(tmp_path) -> Path:
    root = tmp_path / "photos"
    (root / "real").mkdir(parents=True)
    for name in ["ok.png", *HOSTILE]:
        Image.fromarray(np.full((8, 8, 3), 50, np.uint8)).save(root / name)
    os.mkfifo(root / "fifo.png")
    os.symlink(root / "gone.png", root / "dangling.png")
    Image.fromarray(np.full((8, 8, 3), 9, np.uint8)).save(root / "real" / "inside.png")
    os.symlink(root / "real", root / "loop")  # a link to a folder: not followed
    (root / "README.txt").write_text("notes")
    return root


def test_every_entry_is_predicted_or_named_as_skipped(weights, folder, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["-q", "predict", "--weights", weights, str(folder), "--json-out", str(out)]) == 0
    record = json.loads(out.read_text())
    predicted = {Path(r["image"]).name for r in record["predictions"]}
    assert predicted == {"ok.png", "inside.png", *HOSTILE}
    skipped = {Path(s["image"]).name: s["reason"] for s in record["skipped"]}
    assert skipped == {"fifo.png": "a FIFO, not a regular file", "dangling.png": "a broken symbolic link",
                       "loop": "a link to a folder, not followed; name it to predict what it holds",
                       "README.txt": "not an image file name (.jpg, .jpeg, .png, .webp)"}
    summary = capsys.readouterr().err.strip().splitlines()[-1]
    assert summary.startswith("predicted 8 images, skipped 0 unreadable and 4 not images, in ")


def test_hostile_names_print_on_one_line_each(weights, folder, capsys):
    assert main(["-q", "predict", "--weights", weights, str(folder)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8  # one per image: the newline in a name is escaped
    assert any(line.startswith(f"{folder}/line\\nbreak.png: ") for line in lines)
    assert any(line.startswith(f"{folder}/esc\\x1b[31mred.png: ") for line in lines)
    assert not any("\x1b" in line for line in lines)


def test_csv_cells_that_would_be_formulas_are_neutralised(weights, tmp_path, monkeypatch):
    images = tmp_path / "in"
    images.mkdir()
    for name in HOSTILE[:4]:
        Image.fromarray(np.full((8, 8, 3), 50, np.uint8)).save(images / name)
    out = tmp_path / "p.csv"
    monkeypatch.chdir(images)  # relative names: the cell starts with the hostile character
    assert main(["-q", "predict", "--weights", weights, "--csv", str(out), "--top-k", "3", "--", *HOSTILE[:4]]) == 0
    rows = list(csv.reader(out.open(newline="")))
    cells = [cell for row in rows[1:] for cell in row if not cell.replace(".", "").replace("e-", "").isdigit()]
    assert {row[0] for row in rows[1:]} == {"'" + name for name in HOSTILE[:4]}
    assert not [cell for cell in cells if cell[:1] in "=+-@"]
    assert {"'=cat", "dog", "'@bird"} <= set(cells)
