"""`--epochs` on every recipe, a banner that says when a recipe's schedule is out of
proportion to the data and how long the run will take, `--print-config` that shows exactly what the run records
(and refuses what it refuses); runs that remember their trackers; a sweep folder read as the run it chose, with a
warning when the choice sits at the edge of the grid; training from Python (`vitlab.fit`, the README example)."""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from tests.conftest import TINY_VIT_FLAGS
from vitlab.cli import main
from vitlab.errors import WeightsError
from vitlab.train import resolve
from vitlab.train.rules import proportion_warning, steps_for
from vitlab.train.runlog import estimate_line
from vitlab.train.sweep import SweepResult, SweepRow, format_table, grid_edge, write_sweep
from vitlab.weights.vitlab_format import save

ROOT = Path(__file__).resolve().parents[2]
TINY = [*TINY_VIT_FLAGS, "--image-size", "8",
        "--batch-size", "16", "--workers", "0", "--seed", "3"]


def photos(root: Path, per_class: int = 40, classes: int = 6, val: bool = True) -> Path:
    """root/train|val/<class>/*.jpg: `classes` × `per_class` training photos (240 by default, the issue's folder)."""
    rng = np.random.RandomState(0)
    for split, n in (("train", per_class), ("val", 2)) if val else (("train", per_class),):
        for c in range(classes):
            folder = root / split / f"c{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.randint(0, 256, (12, 14, 3), dtype=np.uint8)).save(folder / f"{i}.jpg")
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return photos(tmp_path_factory.mktemp("photos") / "photos")


# --- --epochs --------------------------------------------------------------------------------------------------


def test_epochs_set_the_steps_from_the_training_set_and_keep_the_warmup_share(folder):
    deit = resolve("deit", {"data": str(folder), "epochs": 300, "out": "unused"})
    assert deit.config.steps == math.ceil(300 * 240 / 1024) == 71  # 240 photos at DeiT's batch of 1,024
    assert deit.sources["steps"] == ("flag --epochs 300: 240 training images / batch 1,024, rounded "
                                       "up to whole batches: 303 epochs")
    assert deit.config.warmup == round(6255 * 71 / 375_341) == 1  # DeiT's 5 of 300 epochs: the same share
    tuned = resolve("finetune", {"data": str(folder), "epochs": 10, "out": "unused"}, verb="finetune")
    assert tuned.config.batch_size == 128  # the fine-tuning data rule's batch: no larger than the training set
    assert tuned.config.steps == math.ceil(10 * 240 / 128) == 19
    assert tuned.config.warmup == round(500 * 19 / 10_000) == 1  # recipe finetune: 500 of 10,000 steps
    held = resolve("demo", {"data": str(folder), "epochs": 4, "val_fraction": 0.25, "batch_size": 32, "out": "x"})
    assert held.config.steps == math.ceil(4 * 180 / 32) == 23  # the training images after --val-fraction
    assert steps_for(30, 240, 32) == 225  # exact: 30 × 240 / 32, not one more


def test_epochs_with_steps_is_refused_in_one_line(folder, capsys):
    assert main(["train", "--data", str(folder), "--epochs", "3", "--steps", "4", "--print-config"]) == 2
    assert capsys.readouterr().err.strip() == (
        "vitlab train: error: --epochs 3 and --steps 4 both set the run's length; pass one")


def test_a_recipe_far_out_of_proportion_to_the_data_says_so(folder, tmp_path, capsys):
    assert main(["train", "--recipe", "deit", "--data", str(folder), "--out", str(tmp_path / "r"),
                 "--print-config"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert ("schedule 375,341 steps of 1,024 images = 1,601,455 epochs of 240 training images (recipe deit)"
            in text)
    assert ("warning: recipe deit plans 375,341 steps of 1,024 = 1,601,455 epochs of these 240 training images "
            "(written for 300 epochs of 1,281,167); pass --epochs N to fit the schedule to this data, e.g. "
            "--epochs 300 (71 steps)") in text
    assert main(["train", "--recipe", "deit", "--data", str(folder), "--out", str(tmp_path / "r"),
                 "--print-config", "--epochs", "300"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "schedule 71 steps of 1,024 images = 303 epochs of 240 training images (flag --epochs 300" in text
    assert "warning" not in text
    cfg = resolve("augreg-medium2", {"data": str(folder), "out": "x"}).config
    warning = proportion_warning(cfg, "recipe augreg-medium2", 240)  # the 1,025,390 steps of 4,096
    assert "1,025,390 steps of 4,096 = 17,499,989 epochs of these 240" in warning
    assert proportion_warning(cfg, "recipe augreg-medium2", 14_000_000) is None  # the data it was written for
    assert proportion_warning(cfg, "flag", 240) is None  # steps the user typed are the user's


def test_print_config_refuses_a_folder_the_run_refuses(tmp_path, capsys):
    data = photos(tmp_path / "noval", per_class=3, val=False)
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "r"), "--print-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"vitlab train: error: missing split: {data} has no val/ folder; add {data}/val/<class>/*.jpg or "
                   "hold out part of the training images with --val-fraction 0.1")
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "r"), "--print-config", "--num-classes",
                 "4", "--val-fraction", "0.5"]) == 2
    assert "num_classes mismatch: --num-classes 4 but" in capsys.readouterr().err


def _console(run: Path) -> list[str]:
    """console.log's lines without their time stamps (a wrapped banner line continues without one)."""
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")
    return [stamp.sub("", line) for line in (run / "console.log").read_text().splitlines()]


def _data(kind: str, tmp_path: Path, folder: Path) -> Path:
    """The photos as an image folder, WebDataset shards (`vitlab shards`) or a Hugging Face dataset on disk."""
    if kind == "folder":
        return folder
    if kind == "shards":
        assert main(["shards", str(folder), str(tmp_path / "wds"), "--shard-size", "3KB"]) == 0
        return tmp_path / "wds"
    datasets = pytest.importorskip("datasets")
    from datasets import ClassLabel, Dataset, DatasetDict, Features
    from datasets import Image as ImageFeature

    from vitlab.data import load_split

    features = Features({"image": ImageFeature(), "label": ClassLabel(names=[f"c{c}" for c in range(6)])})

    def split(name: str) -> Dataset:
        ref = load_split(str(folder), name)
        return Dataset.from_dict({"image": [{"bytes": Path(p).read_bytes(), "path": None} for p in ref.paths],
                                  "label": ref.labels.tolist()}, features=features)

    datasets.disable_progress_bars()
    DatasetDict({"train": split("train"), "validation": split("val")}).save_to_disk(tmp_path / "hf")
    return tmp_path / "hf"


@pytest.mark.parametrize("kind", ["folder", "shards", "hf"])
def test_print_config_equals_the_recorded_config(kind, folder, tmp_path, capsys, monkeypatch):
    """`--print-config json` is config.json before the run: every value, source, note, the model's configuration,
    the classes and split sizes; the text form is the banner's schedule and settings lines (the banner counting the
    settings at their defaults that --print-config lists)."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    out = tmp_path / "run"
    args = ["train", "--data", str(_data(kind, tmp_path, folder)), "--out", str(out), *TINY, "--epochs", "0.2",
            "--log-every", "1"]
    capsys.readouterr()
    assert main([*args, "--print-config", "json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert main([*args, "--print-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not out.exists()  # printing runs nothing
    assert main(args) == 0
    recorded = json.loads((out / "config.json").read_text())
    assert planned == recorded
    assert recorded["steps"] == 3 and recorded["train_images"] == 240  # 0.2 × 240 / 16, rounded up
    assert recorded["sources"]["steps"] == "flag --epochs 0.2: 240 training images / batch 16"
    banner = _console(out)
    start = banner.index("settings " + lines[0])
    assert lines[1] in banner[:start] and lines[1].startswith("schedule 3 steps of 16 images = 0.2 epochs")
    defaults = next(i for i, line in enumerate(lines) if line.startswith("  from default: "))
    listed = next((i for i in range(defaults + 1, len(lines)) if not lines[i].startswith("      ")), len(lines))
    count = next(line for line in banner if line.startswith("  from default: "))
    assert re.fullmatch(r"  from default: \d+ other settings \(config.json lists every value\)", count)
    counted = lines[2:defaults] + [count] + lines[listed:]
    assert banner[start + 1: start + 1 + len(counted)] == counted  # every value by source, the notes
    assert "keep_last 2" in "\n".join(lines[defaults:listed])


def test_the_banner_estimates_the_time_from_a_measured_step_before_the_first_step_line(folder, tmp_path, capsys):
    assert main(["train", "--data", str(folder), "--out", str(tmp_path / "a"), *TINY, "--steps", "3",
                 "--log-every", "1"]) == 0
    log = _console(tmp_path / "a")
    at = next(i for i, line in enumerate(log) if line.startswith("time    about"))
    assert "for 3 of 3 steps:" in log[at] and "measured on step 1 " in log[at]  # the first log line is step 1's
    assert log[at + 1].startswith("step 1/3  loss") and not any(line.startswith("step 1/3") for line in log[:at])
    assert main(["train", "--data", str(folder), "--out", str(tmp_path / "b"), *TINY, "--steps", "3",
                 "--log-every", "2"]) == 0
    log = _console(tmp_path / "b")
    at = next(i for i, line in enumerate(log) if line.startswith("time    about"))
    assert "measured on step 2 " in log[at] and log[at + 1].startswith("step 2/3  loss")


def test_the_estimate_is_the_slower_of_compute_and_loading():
    step = {"seconds": 0.5, "wait": 0.1, "load": 1.2}  # the first step waited for the workers to start
    assert estimate_line(step, 2, 100, 2, 100).startswith("time    about 60 s for 100 of 100 steps: 0.6 s a step, "
                                                          "measured on step 2 (compute 0.4 s, 0.6 s of loading over "
                                                          "2 workers beside it)")
    assert estimate_line(step, 0, 20_000, 2, 20_000).startswith("time    about 2.8 h for 20,000")  # 0.5 s a step


# --- runs remember what the user asked -------------------------------------------------------------------------


@pytest.fixture
def trackers(monkeypatch):
    made = {"tb": [], "wandb": []}

    class Writer:
        def __init__(self, log_dir):
            made["tb"].append(log_dir)

        def add_scalar(self, tag, value, step):
            pass

        def close(self):
            pass

    class Run:
        def log(self, data, step):
            pass

        def finish(self):
            pass

    tb = types.ModuleType("torch.utils.tensorboard")
    tb.SummaryWriter = Writer
    wandb = types.ModuleType("wandb")
    wandb.init = lambda **kw: made["wandb"].append(kw) or Run()
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", tb)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    return made


def test_trackers_are_recorded_and_a_resumed_run_keeps_logging_to_them(folder, tmp_path, trackers, capsys,
                                                                         monkeypatch):
    run = tmp_path / "run"
    assert main(["train", "--data", str(folder), "--out", str(run), *TINY, "--steps", "2", "--tb", "--wandb",
                 "photos"]) == 0
    record = json.loads((run / "config.json").read_text())
    assert (record["tensorboard"], record["wandb_project"]) == (True, "photos")
    assert main(["train", "--out", str(run), "--resume", "--steps", "3"]) == 0  # neither flag typed again
    assert trackers["tb"] == [str(run / "tensorboard")] * 2
    first, resumed = trackers["wandb"]
    assert resumed["project"] == "photos" and resumed["id"] == first["id"] and resumed["resume"] == "allow"
    assert main(["train", "--data", str(folder), "--out", str(tmp_path / "plain"), *TINY, "--steps", "1"]) == 0
    assert len(trackers["tb"]) == 2  # a run that did not ask writes none
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # uninstalled since: one line, exit 2
    assert main(["train", "--out", str(run), "--resume", "--steps", "4"]) == 2
    assert capsys.readouterr().err.strip().endswith("--tb needs the tensorboard package: pip install 'vitlab[tb]'")


def _fake_sweep(tmp_path: Path, folder: Path, lrs=(0.01, 0.03), chosen=0.03) -> Path:
    """A sweep folder as `finetune --lr-sweep` leaves it: a run per lr in lr_*/ (copies of one tiny run, each
    with its own head bias so they differ) and sweep.json from the sweep's own writer."""
    base = tmp_path / "base"
    assert main(["train", "--data", str(folder), "--out", str(base), *TINY, "--steps", "1"]) == 0
    sweep = tmp_path / "sw"
    rows = []
    for lr in lrs:
        run = sweep / f"lr_{lr:g}"
        shutil.copytree(base, run)
        model = vitlab.load(run)
        with torch.no_grad():
            model.head.bias.fill_(lr)
        save(model, run / "model.safetensors", user_named=False)  # as its training would
        rows.append(SweepRow(lr, 0.9 if lr == chosen else 0.5, 0.8, str(run)))
    chosen_row = next(r for r in rows if r.lr == chosen)
    write_sweep(SweepResult(sweep, rows, chosen_row, 0.1))
    return sweep


def test_a_sweep_folder_reads_as_the_run_it_chose(folder, tmp_path, capsys):
    sweep = _fake_sweep(tmp_path, folder)
    model = vitlab.load(sweep)
    assert torch.equal(model.head.bias, torch.full_like(model.head.bias, 0.03))  # lr_0.03's weights
    assert main(["eval", "--weights", str(sweep), "--data", str(folder), "--workers", "0"]) == 0
    assert main(["predict", "--weights", str(sweep), str(folder / "val" / "c0" / "0.jpg")]) == 0
    capsys.readouterr()
    (sweep / "sweep.json").unlink()  # an interrupted sweep: which runs there are, in one line
    with pytest.raises(WeightsError) as err:
        vitlab.load(sweep)
    assert str(err.value) == (f"{sweep}: a learning-rate sweep that has not finished (no sweep.json); pass one of "
                              f"its runs: {sweep / 'lr_0.01'}, {sweep / 'lr_0.03'}")
    assert main(["predict", "--weights", str(sweep), str(folder / "val" / "c0" / "0.jpg")]) == 2
    assert capsys.readouterr().err.strip().endswith("pass one of its runs: "
                                                    f"{sweep / 'lr_0.01'}, {sweep / 'lr_0.03'}")


def test_a_choice_at_the_edge_of_the_grid_warns(tmp_path):
    rows = [SweepRow(lr, dev, 0.5, f"lr_{lr:g}") for lr, dev in ((0.003, 0.5), (0.01, 0.6), (0.03, 0.7))]
    assert grid_edge(rows, rows[2]) == ("chosen lr 0.03 is the largest of the grid; extend the grid upward (e.g. add "
                                        "0.09)")
    assert grid_edge(rows, rows[0]) == ("chosen lr 0.003 is the smallest of the grid; extend the grid downward (e.g. "
                                        "add 0.0009)")
    assert grid_edge(rows, rows[1]) is None and grid_edge(rows[:1], rows[0]) is None  # inside; a grid of one
    result = SweepResult(tmp_path, rows, rows[2], 0.1)
    write_sweep(result)
    assert json.loads((tmp_path / "sweep.json").read_text())["warning"] == grid_edge(rows, rows[2])
    assert f"warning: {grid_edge(rows, rows[2])}" in format_table(result).splitlines()


# --- training from Python --------------------------------------------------------------------------------------


def _readme_block(title: str) -> str:
    text = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")  # the README's section, moved to the docs
    section = text[text.index(f"\n## {title}\n"):]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def test_the_readme_training_from_python_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # a script that set up no logging (pytest has)
    namespace: dict = {}
    exec(compile(_readme_block("Training from Python"), "docs/training.md", "exec"), namespace)
    run, tuned = namespace["run"], namespace["tuned"]
    assert (run.status, run.step, run.out_dir) == ("completed", math.ceil(1438 / 128), Path("runs/py"))
    assert 0 <= run.metrics["top1"] <= 1 and run.metrics["count"] == 359  # digits' test split
    assert tuned.step == math.ceil(1438 / 512) and tuned.model.config.num_classes == 10
    assert namespace["logits"].shape == (1, 10)
    err = capsys.readouterr().err  # the command line's progress: banner, schedule, estimate, done
    assert "schedule 12 steps of 128 images" in err and "time    about" in err
    assert f"done: step 3, val top-1 {100 * tuned.metrics['top1']:.2f}%" in err
    assert torch.equal(vitlab.load("runs/py-ft").head.weight, tuned.model.head.weight)
