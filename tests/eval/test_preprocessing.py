"""The pre-processing choices travel with a run: config.json, the weights' metadata, `vitlab eval` and
`vitlab fewshot` use them; files without a record evaluate as the official code does."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from tests.conftest import TINY_TRAIN_FLAGS, TINY_VIT_ARGS
from vitlab.cli import main
from vitlab.data import load_split, normalize
from vitlab.train.config import config_from_json
from vitlab.train.recipes import RECIPES
from vitlab.weights.load import preprocessing


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("resize") / "run"
    assert main(["train", "--out", str(out), "--steps", "2", "--train-crop", "inception",
                 "--eval-resize", "big_vision", *TINY_TRAIN_FLAGS]) == 0
    return out


def test_run_records_its_choices(run_dir):
    cfg = json.loads((run_dir / "config.json").read_text())
    assert (cfg["train_crop"], cfg["eval_resize"]) == ("inception", "big_vision")
    assert preprocessing(run_dir / "model.safetensors")[1] == "big_vision"
    step = sorted((run_dir / "checkpoints").iterdir())[-1]
    assert preprocessing(step / "model.safetensors")[1] == "big_vision"


def test_eval_uses_the_recorded_resize_unless_overridden(run_dir, tmp_path, capsys):
    final = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in final if r["split"] == "val"][-1]  # the training loop's own evaluation
    png = str(tmp_path / "c.png")
    assert main(["eval", "--weights", str(run_dir), "--data", "digits", "--json", "--confusion", png]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["eval_resize"] == "big_vision" and got["count"] == final["count"]
    assert got["top1"] == final["top1"] and got["loss"] == pytest.approx(final["loss"], rel=1e-5)
    assert main(["eval", "--weights", str(run_dir), "--data", "digits", "--json", "--confusion", png,
                 "--eval-resize", "official"]) == 0
    assert json.loads(capsys.readouterr().out)["eval_resize"] == "official"


def test_files_without_a_record_evaluate_officially(tmp_path):
    model = vitlab.models.build_model(vitlab.ViTConfig(
        image_size=8, patch_size=4, **TINY_VIT_ARGS, num_classes=10))
    vitlab.save(model, tmp_path / "m.safetensors")
    assert preprocessing(tmp_path / "m.safetensors")[1] == "official"
    from vitlab.weights.jax_npz import write_jax_npz

    with pytest.warns(UserWarning):  # exact GELU: not the official numerics
        write_jax_npz(model, tmp_path / "official.npz")
    assert preprocessing(tmp_path / "official.npz")[1] == "official"


def test_recipes_and_older_runs(tmp_path):
    for name in ("pretrain", "finetune", "mpp"):
        assert (RECIPES[name]["train_crop"], RECIPES[name]["eval_resize"]) == ("inception", "official")
    assert RECIPES["demo"]["train_crop"] == "inception-subpixel"
    old = tmp_path / "config.json"  # recorded before the settings existed: what those runs did
    old.write_text(json.dumps({"recipe": "demo", "steps": 5}))
    cfg = config_from_json(old)
    assert (cfg.train_crop, cfg.eval_resize) == ("inception-subpixel", "resize-short-crop")


def test_bad_choice_is_one_line(tmp_path, capsys):
    from vitlab.train import resolve_config

    with pytest.raises(ValueError, match="unknown --train-crop 'random'"):
        resolve_config("demo", train_crop="random")
    with pytest.raises(SystemExit):  # argparse: invalid choice
        main(["train", "--out", str(tmp_path / "r"), "--eval-resize", "bicubic"])
    assert "invalid choice" in capsys.readouterr().err


def test_fewshot_features_use_big_vision_fewshot_preprocessing():
    from vitlab.eval.fewshot_data import split_features

    torch.manual_seed(0)
    model = vitlab.models.build_model(vitlab.ViTConfig(
        image_size=16, patch_size=4, **TINY_VIT_ARGS, num_classes=10)).eval()
    feats, labels = split_features(model, "digits", "val")
    arrays = load_split("digits", "val").arrays[:32]
    # reference: each 8×8 digit resized to 18×18 (round(16·8/7)), aspect ignored, central 16×16 crop
    ref = np.stack([np.asarray(Image.fromarray(a).resize((18, 18), Image.Resampling.BILINEAR))[1:17, 1:17]
                    for a in arrays])
    x = normalize(torch.from_numpy(ref)[:, None].expand(-1, 3, -1, -1), model.config.mean, model.config.std)
    with torch.no_grad():
        want = model.forward_head(model.forward_features(x), pre_logits=True).double().numpy()
    np.testing.assert_allclose(feats[:32], want, rtol=1e-5, atol=1e-5)
    official, _ = split_features(model, "digits", "val", resize="official")
    assert not np.allclose(official[:32], feats[:32])
