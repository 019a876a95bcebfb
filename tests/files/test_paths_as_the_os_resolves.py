"""Paths are compared as the OS resolves them, and nothing vitlab reads can block.

- `L/../x` with L a link into a run names the run's file, as the OS opens it: refused, --force or not, the run's
  files unchanged (by SHA-256).
- A sweep's sweep.json and sweep.png are its own files; no output lands inside a dataset being read.
- A FIFO given as weights, as --config or as a shard folder's _info.json is refused in one line, never waited on.
- A file name that is not UTF-8 is escaped in --csv, not fatal.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitlab
from tests.conftest import TINY_TRAIN_FLAGS
from vitlab.cli import main
from vitlab.errors import OutputRefused


def tree_sha(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".vitlab.lock"}


@pytest.fixture(scope="module")
def run(trained_run) -> Path:
    """The module's run (tests/files/conftest.py); a test that changes it works on a copy."""
    return trained_run


@pytest.fixture()
def linked(run, tmp_path) -> tuple[Path, Path]:
    """(a link to the run's checkpoints folder, other weights to write)."""
    link = tmp_path / "L"
    link.symlink_to(run / "checkpoints")
    other = tmp_path / "other.safetensors"
    shutil.copy(run / "model.safetensors", other)
    return link, other


def data_folder(root: Path) -> Path:
    for split in ("train", "val"):
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
            for i in range(2):
                Image.fromarray(np.random.default_rng(i).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(
                    root / split / name / f"{i}.png")
    return root


def test_convert_through_a_link_and_dotdot_never_replaces_a_runs_weights(run, linked, capsys):
    link, other = linked
    before = tree_sha(run)
    for force in ([], ["--force"]):
        assert main(["-q", "convert", str(other), f"{link}/../model.safetensors", *force]) == 2
        assert "which only its training writes" in capsys.readouterr().err
    assert tree_sha(run) == before


def test_vitlab_save_through_a_link_and_dotdot_is_refused_naming_the_keyword(run, linked):
    link, other = linked
    before = tree_sha(run)
    model = vitlab.load(other)
    for target in ("model.safetensors", "checkpoints/step_00000002/model.safetensors"):
        rel = Path(target).relative_to("checkpoints") if target.startswith("checkpoints") else Path("..") / target
        with pytest.raises(OutputRefused, match=r"force=True does not replace them"):
            vitlab.save(model, link / rel, force=True)
    assert tree_sha(run) == before


@pytest.mark.parametrize("verb", ["predict", "eval", "fewshot"])
def test_forced_outputs_through_a_link_never_replace_run_files(run, linked, tmp_path, capsys, verb):
    link, other = linked
    data = data_folder(tmp_path / "data")
    args = {"predict": ["predict", "--weights", str(other), str(data / "val" / "a" / "0.png"), "--json-out",
                        f"{link}/../config.json"],
            "eval": ["eval", "--weights", str(other), "--data", "digits", "--confusion", f"{link}/../curves.png"],
            "fewshot": ["fewshot", "--weights", str(other), "--data", "digits", "--json",
                        f"{link}/../metrics.jsonl"]}[verb]
    before = tree_sha(run)
    assert main(["-q", *args, "--force"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "which only its training writes" in err[0], err
    assert tree_sha(run) == before


def test_a_sweeps_record_is_its_own_file(run, tmp_path, capsys):
    sweep = tmp_path / "S"
    shutil.copytree(run, sweep / "lr_0.1")
    (sweep / "sweep.json").write_text('{"written_by": "vitlab train --lr-sweep", "chosen_lr": 0.1, "rows": []}')
    image = data_folder(tmp_path / "data") / "val" / "a" / "0.png"
    before = tree_sha(sweep)
    for name in ("sweep.json", "sweep.png"):
        assert main(["-q", "predict", "--weights", str(sweep), str(image), "--json-out", str(sweep / name),
                     "--force"]) == 2
        assert "files of the sweep in" in capsys.readouterr().err
    assert tree_sha(sweep) == before


def test_a_sweep_or_run_is_never_made_inside_another(run):
    from vitlab.train import resolve_config
    from vitlab.train.sweep import run_sweep

    before = tree_sha(run)
    cfg = resolve_config("finetune", data="digits", out=str(run), lr_sweep=(0.01, 0.03), dev_fraction=0.1)
    with pytest.raises(ValueError, match="holds a run; a sweep writes its runs into a folder of its own"):
        run_sweep(cfg)
    assert main(["-q", "train", "--out", str(run / "inner"), *TINY_TRAIN_FLAGS, "--steps", "1"]) == 2
    assert tree_sha(run) == before and not (run / "inner").exists()


def test_outputs_never_land_inside_the_dataset_being_read(run, tmp_path, capsys):
    data = data_folder(tmp_path / "data")
    before = tree_sha(data)
    assert main(["-q", "eval", "--weights", str(run), "--data", str(data), "--confusion",
                 str(data / "val" / "a" / "x.png")]) == 2
    assert "lies inside" in capsys.readouterr().err
    assert main(["-q", "shards", str(data), str(data)]) == 2
    assert "lies inside" in capsys.readouterr().err
    assert tree_sha(data) == before and sorted(p.name for p in data.iterdir()) == ["train", "val"]


def test_a_name_that_is_not_utf8_is_escaped_in_the_csv(run, tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    name = os.fsdecode(b"x\xff.png")
    Image.new("RGB", (8, 8)).save(folder / name, format="PNG")
    assert main(["-q", "predict", "--weights", str(run), str(folder), "--csv", str(tmp_path / "p.csv")]) == 0
    assert "x\\xff.png" in (tmp_path / "p.csv").read_text(encoding="utf-8")


FIFO_CASES = {
    "info": lambda fifo, d: ["-m", "vitlab", "info", str(fifo)],
    "predict": lambda fifo, d: ["-m", "vitlab", "predict", "--weights", str(fifo), str(d)],
    "convert": lambda fifo, d: ["-m", "vitlab", "convert", str(fifo), str(d / "o.safetensors")],
    "eval": lambda fifo, d: ["-m", "vitlab", "eval", "--weights", str(fifo), "--data", "digits"],
    "fewshot": lambda fifo, d: ["-m", "vitlab", "fewshot", "--weights", str(fifo), "--data", "digits"],
    "finetune_init": lambda fifo, d: ["-m", "vitlab", "finetune", "--init", str(fifo), "--data", "digits", "--out",
                                      str(d / "r"), "--steps", "1"],
    "load": lambda fifo, d: ["-c", f"import vitlab; vitlab.load({str(fifo)!r})"],
    "config": lambda fifo, d: ["-m", "vitlab", "train", "--config", str(fifo), "--out", str(d / "r")],
    "config_file": lambda fifo, d: ["-c", f"import vitlab; vitlab.fit(config_file={str(fifo)!r}, out={str(d)!r})"],
    "shard_info": lambda fifo, d: ["-m", "vitlab", "train", "--data", str(fifo.parent), "--out", str(d / "r")],
}


@pytest.mark.parametrize("case", sorted(FIFO_CASES))
def test_a_fifo_is_refused_in_one_line_never_waited_on(tmp_path, case):
    folder = tmp_path / "f"
    folder.mkdir()
    fifo = folder / ("_info.json" if case == "shard_info" else "w.json" if "config" in case else "w.safetensors")
    os.mkfifo(fifo)
    (folder / "train-0.tar").touch()
    proc = subprocess.run([sys.executable, *FIFO_CASES[case](fifo, tmp_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    assert "a FIFO, not a regular file" in proc.stderr, proc.stderr[-1500:]
    if "-m" in FIFO_CASES[case](fifo, tmp_path)[:1]:
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["metrics.jsonl", "console.log"])
def test_a_fifo_among_a_runs_files_is_refused_on_resume_never_waited_on(run, tmp_path, name):
    """Resuming reads metrics.jsonl and appends to it and to console.log: a FIFO in either's place is one line
    naming it, before anything is opened."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / name).unlink()
    os.mkfifo(copy / name)
    argv = [sys.executable, "-m", "vitlab", "-q", "train", "--out", str(copy), "--resume", "--steps", "3"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert proc.stderr.strip().splitlines() == [
        f"vitlab train: error: cannot resume the run in {copy}: {copy / name} is a FIFO, not a regular file; a "
        "run's files are regular files (move it aside)"]


READS = {  # a record read from a place a user controls: (the FIFO's name, what reads it)
    "hub cache record": ("w.npz.vitlab.json",
                         "from vitlab.hub.cache import read_meta; print(read_meta(folder / 'w.npz'))"),
    "metrics.jsonl": ("metrics.jsonl", "from vitlab.train.metrics import read_metrics; read_metrics(fifo)"),
    "checkpoint digest": ("state.pt", "from vitlab.files.digest import sha256_file; sha256_file(fifo)"),
    "saved dataset state": ("state.json", "from vitlab.data.hf_files import _state_split; print(_state_split(folder))"),
}


@pytest.mark.parametrize("case", sorted(READS))
def test_a_fifo_in_place_of_a_record_is_never_waited_on(tmp_path, case):
    """Hub cache records, run logs, checkpoint files being hashed and a saved dataset's state.json are read
    through the one reader: a FIFO there is refused (or read as no record), within the timeout."""
    name, code = READS[case]
    os.mkfifo(tmp_path / name)
    script = f"from pathlib import Path; folder = Path({str(tmp_path)!r}); fifo = folder / {name!r}\n{code}"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 or "a FIFO, not a regular file" in proc.stderr, proc.stderr[-1500:]


@pytest.mark.parametrize("name", ["state.pt", "model.safetensors"])
def test_a_fifo_in_a_checkpoint_is_named_never_waited_on(run, tmp_path, name):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    step = copy / "checkpoints" / "step_00000002"
    (step / name).unlink()
    os.mkfifo(step / name)
    proc = subprocess.run([sys.executable, "-m", "vitlab", "-q", "info", str(step)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert f"damaged checkpoint ({name} is a FIFO, not a regular file)" in proc.stderr


@pytest.mark.parametrize("verb", [["info", "{run}"], ["eval", "--weights", "{run}", "--data", "digits"]])
def test_a_fifo_in_place_of_a_runs_weights_is_named_not_passed_over(run, tmp_path, verb):
    """A run's weights are its model.safetensors: a FIFO there is one line naming it, never a silent fall-back to
    the newest checkpoint's weights."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "model.safetensors").unlink()
    os.mkfifo(copy / "model.safetensors")
    argv = [sys.executable, "-m", "vitlab", "-q", *(a.format(run=copy) for a in verb)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert proc.stderr.strip().splitlines() == [
        f"vitlab {verb[0]}: error: {copy / 'model.safetensors'} is a FIFO, not a regular file"]
