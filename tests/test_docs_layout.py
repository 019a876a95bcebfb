"""docs/layout.md draws the package's layers as the import contract (pyproject.toml) enforces them: the same
layers, top to bottom, each with the same members."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def contract_layers() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (layers,) = [c["layers"] for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [{name.strip() for name in layer.split("|")} for layer in layers]


def drawn_layers() -> list[set[str]]:
    section = (ROOT / "docs" / "layout.md").read_text().split("## The layers", 1)[1]
    block = section.split("```", 2)[1]
    rows = [line for line in block.splitlines() if line.strip()]
    return [{name.strip() for name in re.split(r"\s{2,}", row.strip())[0].split("|")} for row in rows]


def test_the_layer_drawing_is_the_import_contract():
    assert drawn_layers() == contract_layers()

