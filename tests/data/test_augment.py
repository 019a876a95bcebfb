"""CutMix and RandAugment against their definitions, the AugReg and DeiT recipes against their sources, and an
AugReg run (RandAugment, MixUp, CutMix, random erasing, stochastic depth) resumed bit for bit after kill -9."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from torch import nn
from torchvision.transforms import v2

from vitlab.cli import main
from vitlab.data.augment import Augmented, LevelRandAugment, erase_with_noise, with_augmentation
from vitlab.data.mixup import CutMix, cutmix_box, draw_mixup
from vitlab.data.transforms import TrainTransform
from vitlab.train import RECIPES, resolve_config
from vitlab.train.trainer import Classification

# --- CutMix ---------------------------------------------------------------------------------------------------


class _FixedCentre:
    """A numpy-Generator stand-in whose `integers` returns a chosen centre (row, then column)."""

    def __init__(self, cy: int, cx: int):
        self.values = [cy, cx]

    def integers(self, high: int) -> int:
        return self.values.pop(0)


def test_cutmix_box_area_is_one_minus_lambda_and_is_clipped_at_the_border():
    # λ = 0.64: sides √0.36 · 100 = 60 pixels; centred inside, the box is 60 × 60 = 36% of the image
    assert cutmix_box(0.64, (100, 100), _FixedCentre(50, 50)) == (20, 20, 80, 80)
    # centred on the corner, three quarters of it fall outside: 30 × 30 pixels remain
    assert cutmix_box(0.64, (100, 100), _FixedCentre(0, 0)) == (0, 0, 30, 30)
    # a non-square image: each side scaled by √(1 − λ)
    top, left, bottom, right = cutmix_box(0.75, (40, 80), _FixedCentre(20, 40))
    assert (bottom - top, right - left) == (20, 40)


def test_cutmix_pastes_the_box_and_mixes_labels_by_the_pasted_pixels():
    n, h, w = 6, 12, 10
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 3, h, w).clone()  # image i is all i
    for step in range(40):
        mix = draw_mixup(0.0, n, seed=1, step=step, cutmix=1.0, size=(h, w))
        assert isinstance(mix, CutMix)
        mixed = mix.images(x)
        for i in range(n):
            own = (mixed[i, 0] == i).float().mean().item()
            partner = int(mix.perm[i])
            assert own == pytest.approx(mix.lam) or partner == i  # the label weight is the share of own pixels
            if partner != i:
                top, left, bottom, right = mix.box
                assert torch.all(mixed[i, :, top:bottom, left:right] == partner)
    # the loss is λ·CE(y) + (1 − λ)·CE(y[perm]) with λ the pixel share, i.e. CE against the mixed soft targets
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    mix = draw_mixup(0.0, n, seed=1, step=3, cutmix=1.0, size=(h, w))
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * h * w, 3))
    cfg = resolve_config("finetune")
    loss = Classification().loss(model, x, y, cfg, mix)
    logits = model(mix.images(x))
    soft = mix.lam * nn.functional.one_hot(y, 3) + (1 - mix.lam) * nn.functional.one_hot(y[mix.perm], 3)
    by_hand = -(soft * logits.log_softmax(-1)).sum(-1).mean()
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-6)


def test_mixup_and_cutmix_alternate_and_depend_only_on_seed_and_step():
    kinds = [type(draw_mixup(0.8, 8, seed=0, step=s, cutmix=1.0, size=(8, 8))) for s in range(2000)]
    share = kinds.count(CutMix) / len(kinds)
    assert 0.45 < share < 0.55  # timm's switch probability 0.5, as DeiT
    a = draw_mixup(0.8, 8, seed=2, step=5, micro=0, rank=0, cutmix=1.0, size=(8, 8))
    b = draw_mixup(0.8, 8, seed=2, step=5, micro=1, rank=1, cutmix=1.0, size=(8, 8))
    again = draw_mixup(0.8, 8, seed=2, step=5, micro=0, rank=0, cutmix=1.0, size=(8, 8))
    assert type(a) is type(b) and a.lam == b.lam == again.lam and torch.equal(a.perm, again.perm)
    assert getattr(a, "box", None) == getattr(b, "box", None)
    # MixUp alone draws exactly what it drew before CutMix existed (its λ is the stream's first draw)
    assert draw_mixup(0.1, 8, seed=2, step=5).lam == float(np.random.default_rng([0x4D49_5855, 2, 5]).beta(0.1, 0.1))


# --- RandAugment ------------------------------------------------------------------------------------------------


def _image(seed: int = 0, size: tuple[int, int] = (24, 20)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)


@pytest.mark.parametrize("level", [0, 5, 9, 10])
def test_levels_up_to_10_equal_torchvision_randaugment_with_11_bins(level):
    ours = LevelRandAugment(2, level)
    stock = v2.RandAugment(num_ops=2, magnitude=level, num_magnitude_bins=11, fill=128)
    img = Image.fromarray(_image())
    for seed in range(30):
        torch.manual_seed(seed)
        a = np.asarray(ours(img))
        torch.manual_seed(seed)
        b = np.asarray(stock(img))
        assert np.array_equal(a, b), (level, seed)


def test_levels_above_10_extend_the_geometric_ranges_and_cap_the_others():
    space = LevelRandAugment._AUGMENTATION_SPACE
    index = {level: round(level * 10) for level in (10, 15, 20)}
    bins = 201
    rotate = space["Rotate"][0](bins, 224, 224)
    assert [round(float(rotate[index[m]]), 4) for m in (10, 15, 20)] == [30.0, 45.0, 60.0]  # TF: level/10 · 30°
    shear = space["ShearX"][0](bins, 224, 224)
    assert float(shear[index[20]]) == pytest.approx(0.6)
    brightness = space["Brightness"][0](bins, 224, 224)
    assert float(brightness[index[10]]) == pytest.approx(0.9) and float(brightness[index[20]]) == pytest.approx(0.99)
    assert int(space["Posterize"][0](bins, 8, 8)[index[20]]) == 4
    assert float(space["Solarize"][0](bins, 8, 8)[index[15]]) == 0.0
    with pytest.raises(ValueError, match=r"magnitude must be in \[0, 20\], got 21"):
        LevelRandAugment(2, 21)


@pytest.mark.parametrize("num_ops", [1, 2, 3])
def test_randaugment_applies_n_operations_per_image(monkeypatch, num_ops):
    applied = []
    real = LevelRandAugment._apply_image_or_video_transform

    def counting(self, image, transform_id, magnitude, **kwargs):
        applied.append(transform_id)
        return real(self, image, transform_id, magnitude, **kwargs)

    monkeypatch.setattr(LevelRandAugment, "_apply_image_or_video_transform", counting)
    t = Augmented(TrainTransform((16, 16)), randaug_ops=num_ops, randaug_magnitude=9)
    for seed in range(20):
        t(Image.fromarray(_image(seed)), random.Random(seed))
    assert len(applied) == 20 * num_ops
    assert len(set(applied)) > 3  # drawn from the op set, not one fixed op


def test_augmentation_is_a_function_of_the_sample_seed_and_leaves_the_crop_alone():
    base = TrainTransform((16, 16))
    t = Augmented(base, randaug_ops=2, randaug_magnitude=15, randaug_mstd=0.5, random_erasing=0.5)
    img = Image.fromarray(_image())
    torch.manual_seed(123)  # the global stream is neither used nor disturbed
    state = torch.get_rng_state()
    a, b = t(img, random.Random(7)), t(img, random.Random(7))
    assert torch.equal(state, torch.get_rng_state())
    assert np.array_equal(a, b)
    assert sum(not np.array_equal(a, t(img, random.Random(s))) for s in range(8, 16)) >= 7
    # the crop and flip take the sample's first draws, as without RandAugment: level 0 on a single identity op
    # space would leave them; here: a transform without augmentation returns the base itself
    assert with_augmentation(base) is base
    rng_a, rng_b = random.Random(7), random.Random(7)
    base(img, rng_a)
    t.base(img, rng_b)
    assert rng_a.getstate() == rng_b.getstate()


def test_random_erasing_replaces_one_box_with_noise():
    x = torch.full((3, 40, 40), 7, dtype=torch.uint8)
    torch.manual_seed(0)
    out = erase_with_noise(x)
    changed = (out != x).any(0)
    rows, cols = changed.any(1).nonzero(), changed.any(0).nonzero()
    box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
    assert 0.02 * 1600 * 0.8 <= box <= 1600 / 3 * 1.2  # 2%–33% of the area (edge pixels may equal 7 by chance)
    inside = out[:, rows.min():rows.max() + 1, cols.min():cols.max() + 1].float()
    assert abs(inside.mean().item() - 127.5) < 25 and inside.std().item() > 60  # N(0, 1) in [-1, 1]: 127.5 ± 127.5


# --- recipes --------------------------------------------------------------------------------------------------

# big_vision configs/vit_i21k.py, transcribed: RANDAUG_DEF and MIXUP_DEF ('strong' is the paper's 'heavy').
BIG_VISION_RANDAUG = {"none": "", "light1": "randaug(2,0)", "light2": "randaug(2,10)", "medium1": "randaug(2,15)",
                      "medium2": "randaug(2,15)", "strong1": "randaug(2,20)", "strong2": "randaug(2,20)"}
BIG_VISION_MIXUP = {"none": 0.0, "light1": 0.0, "light2": 0.2, "medium1": 0.2, "medium2": 0.5, "strong1": 0.5,
                    "strong2": 0.8}


@pytest.mark.parametrize("level", ["none", "light1", "light2", "medium1", "medium2", "heavy1", "heavy2"])
def test_augreg_recipes_equal_big_vision(level):
    bv = level.replace("heavy", "strong")
    recipe = RECIPES[f"augreg-{level}"]
    spec = BIG_VISION_RANDAUG[bv]
    ops, magnitude = (0, 0.0) if not spec else tuple(float(v) for v in spec[len("randaug("):-1].split(","))
    assert (recipe["randaug_ops"], recipe["randaug_magnitude"]) == (ops, magnitude)
    assert recipe["mixup"] == BIG_VISION_MIXUP[bv]
    assert (recipe["dropout"], recipe["drop_path_rate"]) == (0.0, 0.0)
    # the optimiser of the study (§3.4): Adam, lr 1e-3, cosine, 10k warm-up, clip 1, batch 4096, weight decay 0.1
    assert (recipe["optimizer"], recipe["lr"], recipe["decay"], recipe["warmup"], recipe["grad_clip"],
            recipe["batch_size"], recipe["weight_decay"]) == ("adam", 1e-3, "cosine", 10_000, 1.0, 4096, 0.1)


def test_deit_recipe_equals_table_9():
    r = RECIPES["deit"]
    assert r["lr"] == pytest.approx(5e-4 * 1024 / 512) and r["batch_size"] == 1024
    assert (r["weight_decay"], r["label_smoothing"], r["drop_path_rate"], r["dropout"]) == (0.05, 0.1, 0.1, 0.0)
    assert (r["randaug_ops"], r["randaug_magnitude"], r["randaug_mstd"]) == (2, 9.0, 0.5)
    assert (r["mixup"], r["cutmix"], r["random_erasing"], r["grad_clip"]) == (0.8, 1.0, 0.25, 0.0)
    epoch = 1_281_167 // 1024
    assert r["steps"] == 300 * 1_281_167 // 1024 and r["warmup"] == 5 * epoch


def test_recipes_verb_lists_augreg_and_deit_with_sources(capsys):
    assert main(["recipes", "augreg-medium2", "deit"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # unwrapped: where the lines break is not the point
    assert "recipe augreg-medium2:" in out and "randaug_magnitude 15" in out
    assert "Steiner et al. 2021" in out and "big_vision configs/vit_i21k.py" in out
    assert "recipe deit:" in out and "Touvron et al. 2021 (DeiT) Table 9" in out
    assert "300 epochs × 1,281,167 images / batch 1,024" in out


def test_drop_path_rate_reaches_the_model_and_a_bit_refuses_it(tmp_path):
    from vitlab.train.trainer import build_run_model

    cfg = resolve_config("augreg-light1", model="ViT-Ti/4", model_args={"depth": 2, "width": 32, "num_heads": 2,
                                                                         "mlp_dim": 64}, image_size=8,
                         drop_path_rate=0.2, out=str(tmp_path / "r"))
    assert build_run_model(cfg, ["a", "b"]).config.drop_path_rate == 0.2
    bit = resolve_config("augreg-light1", model="BiT-R50x1", image_size=32, drop_path_rate=0.1,
                         out=str(tmp_path / "b"))
    with pytest.raises(ValueError, match="--drop-path-rate: BiT-R50x1 has no stochastic depth"):
        build_run_model(bit, ["a", "b"])


# --- an AugReg run resumes exactly after kill -9 ----------------------------------------------------------------


def _cli(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "vitlab", "train", "--recipe", "augreg-heavy2", "--data", "digits", "--out",
            str(out), "--model", "ViT-Ti/4", "--depth", "2", "--width", "32", "--heads", "2", "--mlp-dim", "64",
            "--image-size", "8", "--batch-size", "16", "--steps", "80", "--warmup", "5", "--eval-every", "0",
            "--save-every", "10", "--log-every", "50", "--workers", "0", "--drop-path-rate", "0.1",
            "--dropout", "0.1", "--cutmix", "1.0", "--random-erasing", "0.25", "--randaug-mstd", "0.5", *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


# Slow-marked for the default suite's 10 minutes on 2 cores: kill -9 then resume bit for bit stays checked by
# default in test_train_resume, and what makes an augmented run resume exactly (augmentation a function of the
# seed, step and sample only) by the tests above.
@pytest.mark.slow
def test_augreg_run_resumes_bit_for_bit_after_kill_9(tmp_path, monkeypatch):
    """RandAugment (level 20 ± 0.5), MixUp 0.8 alternating with CutMix 1.0, random erasing, dropout and stochastic
    depth: killed after its step-20 checkpoint, resumed, the weights of the uninterrupted run bit for bit."""
    from vitlab.cli import build_parser
    from vitlab.cli.train import build_config
    from vitlab.train import run

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the uninterrupted run here, on one thread like the subprocesses
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run(build_config(build_parser().parse_args(_cli(tmp_path / "ref")[3:])))
    finally:
        torch.set_num_threads(threads)
    config = json.loads((tmp_path / "ref" / "config.json").read_text())
    assert config["randaug_ops"] == 2 and config["randaug_magnitude"] == 20 and config["mixup"] == 0.8
    assert config["model_config"]["drop_path_rate"] == 0.1
    from tests.train.test_checkpoint import signal_at_checkpoint

    killed = signal_at_checkpoint(_cli(tmp_path / "run"), _env(), tmp_path / "run", signal.SIGKILL, after_step=20)
    assert killed.returncode == -signal.SIGKILL and not (tmp_path / "run" / "model.safetensors").exists()
    resumed = subprocess.run(_cli(tmp_path / "run", "--resume"), env=_env(), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stderr
    a = load_file(str(tmp_path / "ref" / "model.safetensors"))
    b = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
