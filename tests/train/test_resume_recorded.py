"""On --resume the run's recorded state is the truth: a setting its config.json lacks is read from the checkpoint
that recorded it (never a default: a bf16 run goes on in bf16), and a recorded value training refuses is one line
naming config.json and the setting, never a flag nobody passed."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from tests.train.test_resume import tiny
from tests.train.test_resume_tamper import edit_json, refused
from vitlab.cli import main
from vitlab.files.rundir import checkpoint_settings
from vitlab.train import run
from vitlab.train.rules import steps_for

CHECKPOINT = "checkpoints/step_00000002"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished 2-step bf16 run (bf16 is emulated on a CPU without it: slow, but two tiny steps), its checkpoint
    at step 2; each test works on a copy."""
    out = tmp_path_factory.mktemp("bf16") / "run"
    run(tiny(out, steps=2, precision="bf16"))
    return out


@pytest.fixture
def copy(trained, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


def delete_from_config(out: Path, *keys: str) -> None:
    record = json.loads((out / "config.json").read_text())
    for key in keys:
        del record[key]
    (out / "config.json").write_text(json.dumps(record))


def planned(out: Path, capsys, *flags: str) -> dict:
    """The config.json a resume of `out` would write (--print-config json: nothing is trained)."""
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", *flags, "--print-config", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("key", ["precision", "steps", "lr", "batch_size", "model_args", "eval_resize"])
def test_a_setting_config_json_lacks_is_the_one_the_checkpoint_recorded(copy, capsys, caplog, key):
    recorded = checkpoint_settings(copy / CHECKPOINT)[key]
    delete_from_config(copy, key)
    caplog.set_level(logging.WARNING, logger="vitlab")
    assert planned(copy, capsys)[key] == recorded
    assert (f"{copy / 'config.json'} lacks {key}: continuing with what checkpoint {copy / CHECKPOINT} recorded"
            in caplog.text)


def test_a_bf16_run_whose_config_json_lacks_precision_goes_on_in_bf16(copy, caplog):
    delete_from_config(copy, "precision")
    caplog.set_level(logging.INFO, logger="vitlab")
    assert main(["train", "--out", str(copy), "--resume", "--steps", "3"]) == 0
    assert f"compute bf16 (checkpoint {copy / CHECKPOINT} (config.json lacks it))" in caplog.text
    assert json.loads((copy / "config.json").read_text())["precision"] == "bf16"  # recorded again


def test_epochs_on_resume_use_the_batch_the_checkpoint_recorded(copy, capsys):
    delete_from_config(copy, "batch_size")
    record = planned(copy, capsys, "--epochs", "3")
    assert record["batch_size"] == 32
    assert record["steps"] == steps_for(3, record["train_images"], 32)


RECORDED = {  # a recorded value training refuses: (edit to config.json, what the line says after naming the file)
    "int8 against the checkpoint's bf16": ({"precision": "int8"}, 'config.json says precision "int8" but checkpoint'),
    "a log interval of 0": ({"log_every": 0}, "config.json: log_every must be an integer in [1, "),
    "an unknown device": ({"device": "tpu"}, "config.json: unknown device 'tpu'; use auto, cpu, cuda or cuda:N"),
}


@pytest.mark.parametrize("case", list(RECORDED))
def test_a_recorded_value_training_refuses_names_config_json_not_a_flag(copy, capsys, case):
    edit, expected = RECORDED[case]
    edit_json(copy / "config.json", **edit)
    line = refused(copy, capsys)
    assert expected in line, line
    assert f"--{next(iter(edit)).replace('_', '-')}" not in line, line


def test_a_recorded_precision_without_checkpoints_is_named_by_its_file(copy, capsys):
    """Without checkpoints (the run continues from its final weights) config.json is the only record."""
    shutil.rmtree(copy / "checkpoints")
    edit_json(copy / "config.json", precision="int8")
    line = refused(copy, capsys)
    assert f"{copy / 'config.json'}: precision int8 is for the inference verbs only" in line, line
    assert "--precision" not in line
