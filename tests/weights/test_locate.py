"""A run directory wherever weights are read (vitlab.weights.locate): its newest intact checkpoint, then its final
weights, in load, info, convert and torch.hub; timm and HF folders are still read as folders, not runs. The
reference is the tensors written into the checkpoints."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import vitlab
from vitlab.cli import main
from vitlab.errors import WeightsError
from vitlab.files.rundir import step_dir
from vitlab.train.checkpoint import write_checkpoint
from vitlab.weights.convert import convert
from vitlab.weights.locate import locate as resolve_weights
from vitlab.weights.locate import weights_path
from vitlab.weights.vitlab_format import save

try:  # timm writes the folders of the folder test; the run-directory tests need no timm
    import timm
    import timm.data
except ImportError:
    timm = None
needs_timm = pytest.mark.skipif(timm is None, reason="timm is the reference")

REPO = Path(__file__).resolve().parents[2]


def same_weights(model: torch.nn.Module, reference: torch.nn.Module) -> bool:
    ref = reference.state_dict()
    return all(torch.equal(v, ref[k]) for k, v in model.state_dict().items())


# --- a run directory wherever weights are read -------------------------------------------------------------------
@pytest.fixture
def run(tmp_path, random_tiny_vit):
    """A run directory as training leaves it mid-way: config.json (a run config, not a timm/HF one), metrics,
    two checkpoints (steps 10 and 20), no final weights yet."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": "ViT-Ti/16", "steps": 30}))
    (run / "metrics.jsonl").write_text('{"step": 10}\n')
    models = {step: random_tiny_vit(step) for step in (10, 20)}
    for step, m in models.items():
        write_checkpoint(run, step, m.state_dict(), m.config, ["a", "b", "c"], {"step": step},
                         meta={"eval_resize": "big_vision"})  # fmt: skip
    return run, models


def test_run_directory_means_newest_intact_checkpoint_then_final_weights(run, random_tiny_vit):
    run, models = run
    assert weights_path(run) == step_dir(run, 20) / "model.safetensors"
    loaded = vitlab.load(run)
    assert same_weights(loaded, models[20]) and loaded.class_names == ["a", "b", "c"]
    assert loaded.eval_resize == "big_vision"  # recorded with the weights: vitlab.transforms repeats it
    assert same_weights(vitlab.load(step_dir(run, 10)), models[10])  # one checkpoint directory
    with open(step_dir(run, 20) / "model.safetensors", "r+b") as f:  # damage the newest: a bit flipped
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    assert same_weights(vitlab.load(run), models[10])  # falls back, as resuming does
    with pytest.raises(WeightsError, match=r"damaged checkpoint .*checksum.*; pass the run directory"):
        vitlab.load(step_dir(run, 20))
    final = random_tiny_vit(30)
    save(final, run / "model.safetensors", user_named=False)  # the run completed: its training wrote the weights
    assert same_weights(vitlab.load(run), final) and resolve_weights(run) == run / "model.safetensors"


def test_run_directory_without_weights_is_one_line(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text("")
    with pytest.raises(WeightsError, match=r"r: run directory has no final model.safetensors and no intact "
                                           r"checkpoint; wait for its first checkpoint"):  # fmt: skip
        vitlab.load(tmp_path / "r")


def test_run_directory_in_info_convert_and_hubconf(run, tmp_path, capsys):
    run, models = run
    assert main(["info", str(run), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["file"] == str(step_dir(run, 20) / "model.safetensors") and info["format"] == "vitlab"
    assert info["eval_resize"] == "big_vision" and info["params"] == sum(p.numel() for p in models[20].parameters())
    assert main(["convert", str(run), str(tmp_path / "c.safetensors")]) == 0
    converted = vitlab.load(tmp_path / "c.safetensors")
    assert same_weights(converted, models[20]) and converted.eval_resize == "big_vision"  # kept through convert
    # torch.hub's entry names an architecture: a run of another one is refused in one line
    with pytest.raises(ValueError, match=r"holds ViT/4 .* not ViT-Ti/16; use that architecture's entry point"):
        torch.hub.load(str(REPO), "vit_ti16", source="local", weights=str(run))
    (tmp_path / "empty").mkdir()
    assert main(["info", str(tmp_path / "empty")]) == 2
    assert "or a vitlab run directory" in capsys.readouterr().err


@needs_timm
def test_timm_and_hf_folders_still_load_as_folders(tmp_path, random_tiny_vit):
    """timm and HF folders also hold model.safetensors beside config.json: they must not be taken for runs."""
    model = random_tiny_vit(1)
    convert_to = {"timm": tmp_path / "t", "hf": tmp_path / "h"}
    vitlab.save(model, tmp_path / "m.safetensors")
    for fmt, folder in convert_to.items():
        convert(tmp_path / "m.safetensors", folder, to=fmt)
        assert weights_path(folder) == folder
        assert same_weights(vitlab.load(folder), model)
