"""No output lands inside a run or sweep it did not read: `shards SRC OUT` never inside a run (its checkpoints/ or
the run folder), `analyze --out` and `export` only into the run whose weights they read. Paths are taken as the
OS resolves them (a link to `run/checkpoints`, `L/..`); a refused case leaves every file and folder of the run
as it was (by SHA-256 and listing). A folder output through `L/../new` outside any run is written where the OS
puts it, not refused with a missing-folder error.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitlab.cli import main


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder`: files by SHA-256, folders by name (a new empty folder is a change too)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*")) if p.name != ".vitlab.lock"}


@pytest.fixture()
def run(trained_run, tmp_path) -> Path:
    """A copy of the trained run, with L a link to its checkpoints folder and other.safetensors beside it."""
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy, symlinks=True)
    (tmp_path / "L").symlink_to(copy / "checkpoints")
    shutil.copy(copy / "model.safetensors", tmp_path / "other.safetensors")
    return copy


@pytest.fixture()
def data(tmp_path) -> Path:
    root = tmp_path / "data"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(np.random.default_rng(i).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(
                root / name / f"{i}.png")
    return root


@pytest.mark.parametrize("out", ["L", "L/..", "L/../new", "L/step_00000002"])
def test_shards_never_land_inside_a_run(run, data, tmp_path, capsys, out):
    before = snapshot(run)
    assert main(["-q", "shards", str(data), str(tmp_path / out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vitlab shards: error: {tmp_path / out}: lies inside the run in {run}")
    assert "write the output outside the run" in err
    assert len(err.strip().splitlines()) == 1 and "ENOENT" not in err
    assert snapshot(run) == before


def test_shards_through_a_link_and_dotdot_outside_any_run_go_where_the_os_puts_them(data, tmp_path):
    (tmp_path / "real" / "inner").mkdir(parents=True)
    (tmp_path / "M").symlink_to(tmp_path / "real" / "inner")
    assert main(["-q", "shards", str(data), str(tmp_path / "M" / ".." / "new")]) == 0
    assert (tmp_path / "real" / "new" / "_info.json").is_file() and not (tmp_path / "new").exists()


def test_analyze_writes_into_a_run_only_from_its_weights(run, data, tmp_path, capsys):
    before = snapshot(run)
    image = data / "a" / "0.png"
    assert main(["-q", "analyze", "--weights", str(tmp_path / "other.safetensors"), "--images", str(image),
                 "--out", str(tmp_path / "L" / "..")]) == 2
    assert f"{tmp_path / 'L' / '..'}: lies inside the run in {run}, which this command did not read" in (
        capsys.readouterr().err)
    assert snapshot(run) == before
    assert main(["-q", "analyze", "--weights", str(run / "model.safetensors"), "--images", str(image),
                 "--out", str(run / "analysis")]) == 0
    assert (run / "analysis" / "summary.json").is_file()


def test_export_writes_into_a_run_only_from_its_weights(run, tmp_path, capsys):
    before = snapshot(run)
    for force in ([], ["--force"]):
        assert main(["-q", "export", str(tmp_path / "other.safetensors"), str(tmp_path / "L" / ".." / "x.onnx"),
                     *force]) == 2
        assert f"lies inside the run in {run}" in capsys.readouterr().err
    assert snapshot(run) == before
    assert main(["-q", "export", str(run / "model.safetensors"), str(run / "model.onnx")]) == 0
    assert (run / "model.onnx").is_file()


def test_a_missing_folder_while_packing_is_named_without_advising_free_space(data, tmp_path, monkeypatch, capsys):
    import errno

    import vitlab.data.pack as pack

    def vanished(*args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(tmp_path / "out" / "_info.json"))

    monkeypatch.setattr(pack, "_pack", vanished)
    assert main(["-q", "shards", str(data), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / "out") in err and "ENOENT" in err
    assert "free" not in err and "check that OUT's folders exist" in err


@pytest.mark.parametrize("verb", [
    ["predict", "--weights", "{w}", "{img}", "--csv", "{o}/p.csv"],
    ["predict", "--weights", "{w}", "{img}", "--json-out", "{o}/p.json"],
    ["eval", "--weights", "{w}", "--data", "{data}", "--out", "{o}/evaluation"],
    ["eval", "--weights", "{w}", "--data", "{data}", "--confusion", "{o}/c.png"],
    ["eval", "--weights", "{w}", "--data", "{data}", "--errors", "{o}/e.csv"],
    ["convert", "{w}", "{o}/c.safetensors"],
])
def test_a_verb_writes_into_a_run_only_from_its_weights(run, data, tmp_path, capsys, verb):
    """Every user-named output takes the rule (`check_output`, `check_replaceable`), not only shards, analyze and
    export: another model's predictions or evaluation inside a run would be read as the run's own."""
    before = snapshot(run)
    fill = {"img": str(data / "a" / "0.png"), "data": "digits"}  # the run's own classes
    other = [a.format(w=tmp_path / "other.safetensors", o=tmp_path / "L" / "..", **fill) for a in verb]
    assert main(["-q", *other]) == 2
    err = capsys.readouterr().err.strip()
    assert f"lies inside the run in {run}, which this command did not read" in err and len(err.splitlines()) == 1
    assert snapshot(run) == before
    own = [a.format(w=run / "model.safetensors", o=run, **fill) for a in verb]
    assert main(["-q", *own]) == 0
    assert snapshot(run) != before
