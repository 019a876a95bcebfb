"""A refused resume names the flag the user typed, spelled as the command line takes it; the run's own `--init`
given by another spelling is the same file, not a contradiction."""

from __future__ import annotations

import pytest

import vitlab
from tests.conftest import TINY_TRAIN_FLAGS
from vitlab.cli import main
from vitlab.train.config import flag_text


@pytest.mark.parametrize("name,value,text", [
    ("lora_rank", 8, "--lora 8"),
    ("lora_targets", ("qkv", "fc2"), "--lora-targets qkv,fc2"),
    ("ema_warmup", True, "--ema-warmup"),
    ("ema_warmup", False, "no --ema-warmup"),
    ("weight_decay", 0.05, "--wd 0.05"),
    ("crop_scale", (0.08, 1.0), "--crop-scale 0.08 1"),
])
def test_a_setting_is_spelled_as_its_flag(name, value, text):
    assert flag_text(name, value) == text


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("messages") / "run"
    assert main(["-q", "train", "--out", str(out), *TINY_TRAIN_FLAGS, "--steps", "2", "--eval-every", "0"]) == 0
    return out


def test_a_contradicting_switch_is_named_as_typed(finished, capsys):
    assert main(["-q", "train", "--out", str(finished), "--resume", "--ema", "0.9", "--ema-warmup"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--ema-warmup True" not in err and "contradicts the run" in err


def test_too_few_epochs_on_resume_names_epochs(finished, capsys):
    assert main(["-q", "train", "--out", str(finished), "--resume", "--epochs", "0.001"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: --epochs 0.001 (1 steps) is below the run's 2 steps" in err[0], err


def test_the_runs_init_by_another_spelling_resumes(tmp_path, monkeypatch, capsys):
    base = tmp_path / "base"
    assert main(["-q", "train", "--out", str(base), *TINY_TRAIN_FLAGS, "--steps", "2", "--eval-every", "0"]) == 0
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "ft"
    flags = ["--image-size", "8", "--batch-size", "32", "--warmup", "1", "--workers", "0", "--eval-every", "0",
             "--data", "digits"]
    assert main(["-q", "finetune", "--init", "base/model.safetensors", "--out", str(run), *flags, "--steps", "2"]) == 0
    monkeypatch.chdir(run)  # another folder, the absolute spelling of the same file
    assert main(["-q", "finetune", "--init", str(base / "model.safetensors"), "--out", str(run), "--resume",
                 "--steps", "3"]) == 0, capsys.readouterr().err
    assert vitlab.load(run).config.depth == 1
