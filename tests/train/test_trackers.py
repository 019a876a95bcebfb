"""Experiment tracking beside metrics.jsonl: TensorBoard (optional extra `vitlab[tb]`) and Weights & Biases
(`enable_wandb`, offline unless WANDB_MODE says otherwise). Stand-ins record what the real libraries would be
told; the real TensorBoard is checked too where it is installed."""

from __future__ import annotations

import json
import sys
import types

import pytest

from vitlab.train import trackers
from vitlab.train.runlog import RunLog
from vitlab.train.trackers import enable_wandb

RECORDS = [{"step": 1, "split": "train", "loss": 2.5, "lr": 1e-3},
           {"step": 2, "split": "val", "loss": 2.0, "top1": 0.25, "count": 8, "ema": False}]
EXPECTED = [("train/loss", 2.5, 1), ("train/lr", 1e-3, 1), ("val/loss", 2.0, 2), ("val/top1", 0.25, 2),
            ("val/count", 8, 2)]  # bools are flags, not curves


class FakeWriter:
    def __init__(self, log_dir: str):
        self.log_dir, self.scalars, self.closed = log_dir, [], False

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def close(self):
        self.closed = True


@pytest.fixture
def fake_tensorboard(monkeypatch):
    made = []
    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = lambda log_dir: made.append(FakeWriter(log_dir)) or made[-1]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    monkeypatch.setitem(trackers._TENSORBOARD, "enabled", True)  # as `vitlab train --tb` sets it
    return made


@pytest.fixture
def fake_wandb(monkeypatch):
    calls = {"init": [], "log": [], "finished": 0}

    class Run:
        def log(self, data, step):
            calls["log"].append((data, step))

        def finish(self):
            calls["finished"] += 1

    module = types.ModuleType("wandb")
    module.init = lambda **kw: calls["init"].append(kw) or Run()
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.setitem(trackers._WANDB, "enabled", False)
    monkeypatch.setitem(trackers._WANDB, "project", None)
    return calls


def run_log(run_dir, records=RECORDS):
    log = RunLog(run_dir, total_steps=2, start_step=0, enabled=True)
    for r in records:
        log.record(r)
    log.close()
    return log


def test_tensorboard_writer_gets_every_numeric_value(tmp_path, fake_tensorboard):
    run_log(tmp_path)
    (writer,) = fake_tensorboard
    assert writer.log_dir == str(tmp_path / "tensorboard") and writer.closed
    assert writer.scalars == EXPECTED
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == RECORDS


def test_tensorboard_only_when_asked_even_when_installed(tmp_path, fake_tensorboard, monkeypatch):
    monkeypatch.setitem(trackers._TENSORBOARD, "enabled", False)  # installed (the fake), not asked for
    log = run_log(tmp_path)
    assert fake_tensorboard == [] and log.writers == [] and not (tmp_path / "tensorboard").exists()


def test_tb_flag_without_tensorboard_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails: not installed
    with pytest.raises(ValueError, match=r"^--tb needs the tensorboard package: pip install 'vitlab\[tb\]'$"):
        trackers.enable_tensorboard()


def test_without_tensorboard_the_run_logs_as_before(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails: not installed
    monkeypatch.setitem(trackers._TENSORBOARD, "enabled", True)
    log = run_log(tmp_path)
    assert log.writers == [] and len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_real_tensorboard_events_hold_the_values(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_log(tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    got = [(tag, e.value, e.step) for tag in events.Tags()["scalars"] for e in events.Scalars(tag)]
    assert [(tag, step) for tag, _, step in sorted(got)] == [(tag, step) for tag, _, step in sorted(EXPECTED)]
    assert [v for _, v, _ in sorted(got)] == pytest.approx([v for _, v, _ in sorted(EXPECTED)], rel=1e-6)  # float32


def test_wandb_is_offline_by_default_and_gets_the_run_config(tmp_path, fake_wandb, fake_tensorboard, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    (tmp_path / "config.json").write_text(json.dumps({"lr": 0.002, "model": "ViT-Ti/4"}))
    enable_wandb()
    run_log(tmp_path)
    (init,) = fake_wandb["init"]
    assert init["mode"] == "offline" and init["dir"] == str(tmp_path) and init["project"] == "vitlab"
    assert init["config"] == {"lr": 0.002, "model": "ViT-Ti/4"} and init["name"] == tmp_path.name
    assert [(tag, v, step) for data, step in fake_wandb["log"] for tag, v in data.items()] == EXPECTED
    assert fake_wandb["finished"] == 1


def test_wandb_mode_from_the_environment_wins(tmp_path, fake_wandb, fake_tensorboard, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    enable_wandb(project="mine")
    run_log(tmp_path)
    assert fake_wandb["init"][0]["mode"] == "online" and fake_wandb["init"][0]["project"] == "mine"


def test_wandb_is_never_required(tmp_path, fake_tensorboard, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    monkeypatch.setitem(trackers._WANDB, "enabled", False)
    with pytest.raises(ValueError, match=r"pip install 'vitlab\[wandb\]'"):
        enable_wandb()
    assert not trackers._WANDB["enabled"]
    run_log(tmp_path)  # a run without it works as before


def test_training_bar_respects_quiet(tmp_path, fake_tensorboard, monkeypatch):
    import io

    from vitlab import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    assert RunLog(tmp_path, 10, 0, True).bar is not None
    progress.set_verbosity(-1)
    try:
        assert RunLog(tmp_path, 10, 0, True).bar is None
    finally:
        progress.set_verbosity(0)
