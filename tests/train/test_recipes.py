"""Learning-rate schedules and training recipes against the official code and the paper.

References are transcriptions written here from the official sources (never vitlab's own functions):
- vit_jax `hyper.py` / `utils.py` `create_learning_rate_schedule` and the train loop that feeds `lr_fn(0)` to its
  first update (google-research/vision_transformer, `vit_jax/train.py`: `lr_prefetch_iter(lr_fn, 0, total_steps)`
  zipped with `range(1, total_steps + 1)`; the optax version passes `lr_fn` to `optax.sgd`, whose count starts at 0);
- big_transfer's `bit_hyperrule.get_lr(step, dataset_size, base_lr)`, called with step = 0, 1, ….
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import vitlab
from vitlab.train import resolve_config
from vitlab.train.optim import Schedule, build_optimizer, build_scheduler


def vit_jax_lr(step: int, total: int, base: float, decay: str, warmup: int, linear_end: float = 1e-5) -> float:
    """vit_jax `create_learning_rate_schedule(total_steps, base, decay_type, warmup_steps, linear_end)(step)`."""
    progress = float(np.clip((step - warmup) / float(total - warmup), 0.0, 1.0))
    lr = linear_end + (base - linear_end) * (1.0 - progress) if decay == "linear" else \
        base * 0.5 * (1.0 + np.cos(np.pi * progress))
    return lr * min(1.0, step / warmup) if warmup else lr


def bit_get_lr(step: int, dataset_size: int, base_lr: float = 0.003) -> float | None:
    """big_transfer `bit_hyperrule.get_lr`: warm-up, then /10 after each support; None at the end."""
    supports = [100, 200, 300, 400, 500] if dataset_size < 20_000 else (
        [500, 3000, 6000, 9000, 10_000] if dataset_size < 500_000 else [500, 6000, 12_000, 18_000, 20_000])
    if step < supports[0]:
        return base_lr * step / supports[0]
    if step >= supports[-1]:
        return None
    return base_lr / 10 ** sum(s < step for s in supports[1:])


def lrs_used(cfg, updates: int) -> list[float]:
    """The LR each optimiser update of the training loop applies (read before the step, as the loop logs it)."""
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg)
    used = []
    for _ in range(updates):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return used


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_schedule_is_the_official_vit_jax_schedule_and_step_numbering(decay):
    # Update k (1-based) of the official loop applies lr_fn(k - 1): the first update has LR 0 under warm-up.
    total, warmup, base = 60, 10, 1e-3
    cfg = resolve_config("pretrain", lr=base, steps=total, warmup=warmup, decay=decay, linear_end=1e-5)
    expected = [vit_jax_lr(k - 1, total, base, decay, warmup) for k in range(1, total + 1)]
    np.testing.assert_allclose(lrs_used(cfg, total), expected, rtol=1e-9, atol=1e-15)
    assert lrs_used(cfg, 2) == [0.0, pytest.approx(base / warmup)]


def test_linear_decay_reaches_linear_end():
    s = Schedule(warmup=0, total=100, decay="linear", end=1e-5 / 1e-3)
    assert s(100) * 1e-3 == pytest.approx(1e-5) and s(0) == 1.0
    assert s(50) * 1e-3 == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5)


@pytest.mark.parametrize("dataset_size, steps, warmup, drops", [
    (50_000, 10_000, 500, (0.3, 0.6, 0.9)),  # CIFAR-sized: supports 500, 3000, 6000, 9000, 10000
    (1_281_167, 20_000, 500, (0.3, 0.6, 0.9)),  # ImageNet-sized
    (5_000, 500, 100, (0.4, 0.6, 0.8)),  # < 20k images: supports 100, 200, 300, 400, 500
])
def test_step_decay_is_bit_hyperrule(dataset_size, steps, warmup, drops):
    s = Schedule(warmup, steps, "step", drops=drops)
    expected = np.array([bit_get_lr(t, dataset_size) for t in range(steps)])
    np.testing.assert_allclose([0.003 * s(t) for t in range(steps)], expected, rtol=1e-12, atol=0)
    assert bit_get_lr(steps, dataset_size) is None  # both end after `steps` updates


def test_step_decay_through_the_optimizer():
    cfg = resolve_config("finetune", optimizer="sgd", lr=0.003, steps=500, warmup=100, decay="step",
                         lr_drops=(0.4, 0.6, 0.8))
    np.testing.assert_allclose(lrs_used(cfg, 500), [bit_get_lr(t, 5_000) for t in range(500)], rtol=1e-12)


def test_resume_restores_the_schedule_including_old_checkpoints():
    cfg = resolve_config("pretrain", lr=1e-3, steps=40, warmup=5, linear_end=1e-5)
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg)
    for _ in range(17):
        opt.step()
        sched.step()
    state = sched.state_dict()
    fresh_opt = build_optimizer(model, cfg)
    fresh = build_scheduler(fresh_opt, cfg)
    fresh_opt.load_state_dict(opt.state_dict())
    fresh.load_state_dict(state)
    assert fresh.get_last_lr() == sched.get_last_lr()
    assert sched.get_last_lr()[0] == pytest.approx(vit_jax_lr(17, 40, 1e-3, "linear", 5))
    # A checkpoint from before `end` and `drops` existed holds only warmup/total/decay: it still loads, and the
    # schedule keeps its other settings from the config (linear decay to 0 for those runs).
    old = {**state, "lr_lambdas": [{"warmup": 5, "total": 40, "decay": "linear"} for _ in state["lr_lambdas"]]}
    legacy = build_scheduler(build_optimizer(model, cfg.replace(linear_end=0.0)), cfg.replace(linear_end=0.0))
    legacy.load_state_dict(old)
    assert legacy.last_epoch == 17 and legacy.lr_lambdas[0](20) == pytest.approx(1.0 - 15 / 35)
    legacy.optimizer.step()
    legacy.step()
    assert math.isclose(legacy.get_last_lr()[0], 1e-3 * (1.0 - 13 / 35))


# --- the upstream loss -----------------------------------------------------------------------------------------
def big_vision_sigmoid_xent(logits: np.ndarray, labels: np.ndarray) -> float:
    """big_vision `sigmoid_xent`: −Σ_classes [y·log σ(x) + (1 − y)·log σ(−x)], mean over the batch (float64)."""
    log_p, log_not_p = -np.logaddexp(0.0, -logits), -np.logaddexp(0.0, logits)
    return float(np.mean(-np.sum(labels * log_p + (1 - labels) * log_not_p, axis=-1)))


@pytest.mark.parametrize("scale, shift", [(1.0, 0.0), (3.0, -10.0), (0.1, -10.0)])
def test_sigmoid_loss_is_big_vision_sigmoid_xent(scale, shift):
    from vitlab.losses import classification_loss

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 21_843, generator=g) * scale + shift  # around the −10 head bias of pre-training
    labels = torch.randint(0, 21_843, (8,), generator=g)
    onehot = np.zeros((8, 21_843))
    onehot[np.arange(8), labels.numpy()] = 1.0
    ours = classification_loss(logits, labels, "sigmoid", 0.0).item()
    assert ours == pytest.approx(big_vision_sigmoid_xent(logits.double().numpy(), onehot), rel=1e-5)


# --- recipe values ---------------------------------------------------------------------------------------------
# Paper Table 3 (Dosovitskiy et al. 2021, Appendix B.1): (epochs, base LR, decay, weight decay, dropout) per row.
TABLE3 = {
    ("pretrain", "ViT-B/16"): (90, 1e-3, "linear", 0.03, 0.1),  # ViT-B/{16,32}, ImageNet-21k
    ("pretrain-i1k", "ViT-B/16"): (300, 3e-3, "cosine", 0.3, 0.1),  # ViT-*, ImageNet
    ("pretrain-i1k", "ViT-L/16"): (300, 3e-3, "cosine", 0.3, 0.1),
    ("pretrain-jft", "ViT-B/16"): (7, 8e-4, "linear", 0.1, 0.0),  # ViT-B/{16,32}, JFT-300M
    ("pretrain-jft", "ViT-B/32"): (7, 8e-4, "linear", 0.1, 0.0),
    ("pretrain-jft", "ViT-L/32"): (7, 6e-4, "linear", 0.1, 0.0),
    ("pretrain-jft", "ViT-L/16"): (7, 4e-4, "linear", 0.1, 0.0),
    ("pretrain-jft", "ViT-H/14"): (14, 3e-4, "linear", 0.1, 0.0),
    ("pretrain-jft", "R50+ViT-L/32"): (7, 2e-4, "linear", 0.1, 0.0),
}
IMAGES = {"pretrain": 14_000_000, "pretrain-i1k": 1_281_167, "pretrain-jft": 303_000_000}  # paper Section 4.1
WIDTH = {"B": 768, "L": 1024, "H": 1280}  # paper Table 1


@pytest.mark.parametrize("recipe, model", list(TABLE3))
def test_pretraining_presets_are_paper_table_3(recipe, model):
    epochs, lr, decay, wd, dropout = TABLE3[recipe, model]
    cfg = resolve_config(recipe, model=model)
    assert (cfg.lr, cfg.decay, cfg.weight_decay, cfg.dropout) == (lr, decay, wd, dropout)
    assert cfg.steps == epochs * IMAGES[recipe] // 4096
    # Appendix B.1: Adam β 0.9/0.999, batch 4096, 10k linear warm-up; clipping at global norm 1.
    assert (cfg.optimizer, cfg.betas, cfg.batch_size, cfg.warmup, cfg.grad_clip) == (
        "adam", (0.9, 0.999), 4096, 10_000, 1.0)
    size = model.split("ViT-")[1][0]
    assert cfg.representation_size == WIDTH[size]
    # Upstream (ImageNet-21k, JFT) as the released models: sigmoid, head bias −10, linear decay to 1e-5
    # (big_vision configs/vit_i21k.py; vit_jax linear_end); ImageNet-1k: softmax (big_vision configs/vit_i1k.py).
    upstream = ("sigmoid", -10.0, 1e-5) if recipe != "pretrain-i1k" else ("softmax", 0.0, 0.0)
    assert (cfg.loss, cfg.head_bias_init, cfg.linear_end) == upstream


def test_explicit_settings_beat_the_model_rows(tmp_path):
    cfg = resolve_config("pretrain-jft", model="ViT-H/14", lr=1e-4, representation_size=0, steps=5)
    assert (cfg.lr, cfg.steps, cfg.representation_size) == (1e-4, 5, 0)
    assert resolve_config("pretrain-jft", model="ViT-S/16").lr == 8e-4  # not in Table 3: the B row
    assert resolve_config("pretrain", model="ViT-Ti/16", model_args={"width": 96, "num_heads": 3}
                          ).representation_size == 96
    vitlab.save(vitlab.create_model("ViT-Ti/16", image_size=32, depth=1), tmp_path / "weights.safetensors")
    init = str(tmp_path / "weights.safetensors")
    assert resolve_config("pretrain", init=init).representation_size is None  # fine-tuning: no pre_logits
    assert resolve_config("finetune").representation_size is None and resolve_config("finetune").linear_end == 0


def test_every_recipe_is_listed_with_a_source():
    from vitlab.train import RECIPES
    from vitlab.train.recipes import RECIPE_SOURCES, describe_recipe

    for name in ("pretrain", "pretrain-i1k", "pretrain-jft", "mpp"):
        assert "Table 3" in RECIPE_SOURCES[name] or "B.1.2" in RECIPE_SOURCES[name]
    for name in RECIPES:
        text = describe_recipe(name)
        assert text.startswith(f"recipe {name}:") and "source:" in text


# --- through the command line ----------------------------------------------------------------------------------
def image_folder(root, classes=("cat", "dog", "eel"), per_split=(("train", 4), ("val", 2))):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in per_split:
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")
    return root


def test_one_pretraining_step_through_the_cli(tmp_path, capsys):
    import json

    from safetensors.torch import load_file

    from vitlab.cli import main

    data = image_folder(tmp_path / "images")
    out = tmp_path / "run"
    rc = main(["train", "--recipe", "pretrain", "--model", "ViT-Ti/16", "--depth", "1", "--width", "32", "--heads",
               "2", "--mlp-dim", "64", "--image-size", "32", "--batch-size", "8", "--steps", "1", "--data",
               str(data), "--out", str(out), "--workers", "0", "--device", "cpu", "--warmup", "0"])
    assert rc == 0 and "done: step 1" in capsys.readouterr().out
    recorded = json.loads((out / "config.json").read_text())
    assert (recorded["loss"], recorded["head_bias_init"], recorded["linear_end"]) == ("sigmoid", -10.0, 1e-5)
    assert recorded["representation_size"] == 32 and recorded["model_config"]["representation_size"] == 32
    weights = load_file(out / "model.safetensors")
    assert weights["pre_logits.0.weight"].shape == (32, 32)
    # The loss of the first step is the closed form for 3 classes: 3·log(1 + e^−10) + 10; without warm-up its
    # update moves the head bias off −10 (the official numbering with warm-up is tested with the schedule).
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert first["loss"] == pytest.approx(3 * math.log1p(math.exp(-10)) + 10, rel=1e-6)
    assert first["lr"] == pytest.approx(1e-3) and not torch.equal(weights["head.bias"], torch.full((3,), -10.0))


def test_warmup_follows_the_steps_or_is_refused():
    """`--steps 150` with the recipe's 500-step warm-up ended with the LR still rising, and `--steps 1` trained at
    LR 0: a recipe's warm-up keeps its share of a changed step count, a typed one that does not fit is refused."""
    from vitlab.train import resolve

    resolved = resolve("finetune", {"steps": 150, "data": "digits", "model": "ViT-Ti/16"})
    assert resolved.config.warmup == round(500 * 150 / 10_000)
    assert any("warm-up 500 of 10,000 steps (recipe finetune) scaled to 8 of 150" in n for n in resolved.notes)
    assert resolve("finetune", {"steps": 1, "model": "ViT-Ti/16"}).config.warmup == 0
    assert resolve("pretrain-jft", {"model": "ViT-H/14"}).config.warmup == 10_000  # Table 3's own steps: kept
    with pytest.raises(ValueError, match="--warmup 500 is not below --steps 150"):
        resolve("finetune", {"steps": 150, "warmup": 500, "model": "ViT-Ti/16"})


def test_train_help_shows_the_recipe_and_recipes_lists_them(capsys):
    from vitlab.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["train", "--recipe", "pretrain-jft", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--head-bias-init" in text and "recipe pretrain-jft:" in text and "Table 3, rows JFT-300M" in text
    assert "with --model ViT-H/14: lr=0.0003" in text
    assert main(["recipes", "--json"]) == 0
    import json

    listed = json.loads(capsys.readouterr().out)
    assert listed["pretrain-i1k"]["values"]["steps"] == 93_835 and listed["pretrain-i1k"]["epochs"] == 300
    assert main(["recipes", "nope"]) == 2
