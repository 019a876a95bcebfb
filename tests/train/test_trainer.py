"""vitlab.train: recipes, schedule, optimiser groups, EMA, and tiny end-to-end runs on the embedded digits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from PIL import Image

import vitlab
from tests.conftest import TINY_TRAIN, TINY_VIT_ARGS
from vitlab.data import DataError
from vitlab.files.rundir import list_checkpoints, verify_checkpoint
from vitlab.losses import classification_loss
from vitlab.train import RECIPES, TrainingDiverged, resolve_config, run
from vitlab.train.optim import Ema, Schedule, param_groups


def tiny(tmp_path, name="run", **overrides):
    """A 1-layer, 32-wide ViT on 8×8 digits: a step takes milliseconds."""
    base = {**TINY_TRAIN, "out": str(tmp_path / name), "steps": 6, "eval_every": 3}
    return resolve_config("demo", **{**base, **overrides})


# --- recipes and pieces ---------------------------------------------------------------------------------
def test_recipes_hold_the_paper_values():
    pre, fine = resolve_config("pretrain"), resolve_config("finetune")
    assert (pre.optimizer, pre.betas, pre.lr, pre.warmup, pre.decay, pre.grad_clip) == (
        "adam", (0.9, 0.999), 1e-3, 10_000, "linear", 1.0)
    assert (pre.batch_size, pre.dropout, pre.image_size, pre.crop_scale, pre.flip) == (
        4096, 0.1, 224, (0.05, 1.0), True)
    assert (fine.optimizer, fine.momentum, fine.weight_decay, fine.decay, fine.grad_clip) == (
        "sgd", 0.9, 0.0, "cosine", 1.0)
    assert (fine.batch_size, fine.image_size) == (512, 384)
    assert {"pretrain", "pretrain-i1k", "pretrain-jft", "finetune", "demo", "mpp"} <= set(RECIPES)
    assert resolve_config("finetune", lr=0.01, steps=None).lr == 0.01  # None = not given


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(recipe="nope"), "unknown recipe 'nope'"),
        (dict(batch_size=30, accum=4), "not divisible by --accum 4"),
        (dict(warmup=-1), r"--warmup must be an integer in \[0, 1000000000\], got -1"),
        (dict(ema=1.5), r"--ema must be a number \(finite, > 0 and < 1\), got 1.5"),
        (dict(colour=1), "unknown training settings: colour"),
    ],
)
def test_bad_settings(overrides, message):
    recipe = overrides.pop("recipe", "demo")
    with pytest.raises(ValueError, match=message):
        resolve_config(recipe, **overrides)


def test_schedule_warmup_then_decay():
    cos, lin = Schedule(10, 110, "cosine"), Schedule(10, 110, "linear")
    assert cos(0) == 0.0 and cos(5) == pytest.approx(0.5) and cos(10) == pytest.approx(1.0)
    assert cos(60) == pytest.approx(0.5) and cos(110) == pytest.approx(0.0, abs=1e-12)
    assert lin(60) == pytest.approx(0.5) and lin(35) == pytest.approx(0.75)
    assert Schedule(0, 10, "linear")(0) == 1.0


def test_weight_decay_on_kernels_only():
    model = vitlab.create_model("ViT-Ti/4", num_classes=3, image_size=8, **TINY_VIT_ARGS)
    decay, rest = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert "patch_embed.proj.weight" in decayed and "head.weight" in decayed and "blocks.0.attn.qkv.weight" in decayed
    assert not decayed & {"pos_embed", "cls_token", "norm.weight", "head.bias", "blocks.0.norm1.weight"}
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))


def test_losses():
    logits, labels = torch.randn(4, 5), torch.tensor([0, 1, 2, 3])
    ce = classification_loss(logits, labels, "softmax", 0.0)
    assert ce == pytest.approx(torch.nn.functional.cross_entropy(logits, labels).item())
    sig = classification_loss(logits, labels, "sigmoid", 0.0)
    manual = -(torch.nn.functional.one_hot(labels, 5) * torch.log(torch.sigmoid(logits))
               + (1 - torch.nn.functional.one_hot(labels, 5)) * torch.log(1 - torch.sigmoid(logits))).sum(1).mean()
    assert sig == pytest.approx(manual.item(), rel=1e-5)


def test_validation_sigmoid_loss_is_the_training_loss_at_the_pretraining_head_bias():
    """At logits of -10 (the -10 head bias of pre-training) the validation's per-image sigmoid loss matches the
    float64 closed form -Σ[t·log σ(x) + (1 − t)·log σ(−x)] as the training loss does; binary_cross_entropy_with_logits
    in float32 is 3.8e-5 off here."""
    from vitlab.losses import per_image_loss

    logits, labels = torch.full((2, 1000), -10.0), torch.tensor([3, 7])
    t = torch.nn.functional.one_hot(labels, 1000).double()
    x = logits.double()
    closed_form = -(t * torch.log(torch.sigmoid(x)) + (1 - t) * torch.log(torch.sigmoid(-x))).sum(-1)
    val = per_image_loss(logits, labels, "sigmoid")
    assert torch.allclose(val.double(), closed_form, rtol=5e-6, atol=0)
    assert classification_loss(logits, labels, "sigmoid", 0.0).item() == pytest.approx(val.mean().item(), rel=1e-7)


def test_ema_update_and_swap():
    model = torch.nn.Linear(2, 1)
    ema = Ema(model, 0.9)
    start = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    assert torch.allclose(ema.params[0], start + 0.1)
    with ema.applied(model):
        assert torch.allclose(model.weight, start + 0.1)
    assert torch.allclose(model.weight, start + 1.0)


# --- runs --------------------------------------------------------------------------------------------------
def test_tiny_run_writes_a_complete_run_directory(tmp_path):
    result = run(tiny(tmp_path, keep_last=1))
    out = tmp_path / "run"
    assert result.status == "completed" and result.step == 6
    assert set(result.metrics) == {"loss", "top1", "top5", "count"} and result.metrics["count"] == 359
    assert result.images_per_s > 0 and result.data_images_per_s > 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert {"loss", "lr", "grad_norm", "images_per_s", "data_images_per_s", "data_wait"} <= set(train[0])
    assert [r["step"] for r in records if r["split"] == "val"] == [3, 6]
    config = json.loads((out / "config.json").read_text())
    assert config["lr"] == RECIPES["demo"]["lr"] and config["class_names"][:2] == ["0", "1"]
    assert config["model_config"]["depth"] == 1
    assert (out / "curves.png").stat().st_size > 1000 and (out / "best.safetensors").exists()
    assert [p.name for p in list_checkpoints(out)] == ["step_00000006"]  # keep-last 1
    assert verify_checkpoint(out / "checkpoints" / "step_00000006") is None
    model = vitlab.load(out / "model.safetensors")
    assert model.class_names == [str(d) for d in range(10)] and model.config.image_size == (8, 8)
    again = vitlab.load(out / "checkpoints" / "step_00000006" / "model.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    a = run(tiny(tmp_path, "a", steps=4, eval_every=0))
    b = run(tiny(tmp_path, "b", steps=4, eval_every=0, accum=4))
    la = [json.loads(x)["loss"] for x in (a.out_dir / "metrics.jsonl").read_text().splitlines()][:4]
    lb = [json.loads(x)["loss"] for x in (b.out_dir / "metrics.jsonl").read_text().splitlines()][:4]
    assert la == pytest.approx(lb, rel=1e-5)


def test_ema_and_sigmoid_and_sgd_run(tmp_path):
    result = run(tiny(tmp_path, ema=0.5, loss="sigmoid", optimizer="sgd", lr=0.1, dropout=0.1, steps=3))
    assert result.status == "completed" and math.isfinite(result.metrics["loss"])
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_00000003" / "state.pt", weights_only=True)
    assert state["ema"] is not None and set(state["ema"]) == set(vitlab.load(result.weights).state_dict())
    assert vitlab.load(result.weights).config.dropout == 0.1


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    import vitlab.train.trainer as objective

    calls = {"n": 0}
    real = objective.classification_loss

    def poisoned(logits, labels, kind, smoothing):
        calls["n"] += 1
        loss = real(logits, labels, kind, smoothing)
        return loss * float("nan") if calls["n"] == 5 else loss

    monkeypatch.setattr(objective, "classification_loss", poisoned)
    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 5; stopped without saving it \(the last good "
                                               r"checkpoint is .*step_00000004\)\. Lower --lr"):
        run(tiny(tmp_path, save_every=2, eval_every=0, steps=8, keep_last=5))
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step_00000004", "step_00000002"]


def test_num_classes_mismatch_before_training(tmp_path):
    with pytest.raises(DataError, match=r"num_classes mismatch: --num-classes 5 but digits has 10 classes"):
        run(tiny(tmp_path, num_classes=5))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_used_run_directory_needs_resume(tmp_path):
    run(tiny(tmp_path, steps=1))
    with pytest.raises(ValueError, match="already holds a run; pass --resume"):
        run(tiny(tmp_path, steps=1))


def test_truncated_image_skipped_or_fatal_with_strict(tmp_path, caplog):
    root = tmp_path / "data"
    for split in ("train", "val"):
        for c, name in enumerate(["a", "b"]):
            for i in range(4):
                Image.new("RGB", (16, 16), (200 * c, 50, 50)).save(root / split / name / f"{i}.png") if (
                    root / split / name).mkdir(parents=True, exist_ok=True) is None else None
    bad = root / "train" / "a" / "1.png"
    Image.effect_noise((64, 64), 50).convert("RGB").save(bad)
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    cfg = tiny(tmp_path, data=str(root), batch_size=8, steps=2, eval_every=0)
    result = run(cfg)
    assert result.skipped_images == [str(bad)]
    assert "skipping unreadable image(s)" in caplog.text
    with pytest.raises(DataError, match=r"unreadable image\(s\): .*1\.png \(--strict\)"):
        run(cfg.replace(out=str(tmp_path / "strict"), strict=True))


def test_tensorboard_events_and_progress_bar(tmp_path, monkeypatch):
    """TensorBoard is optional: with a writer available every record becomes scalars; on a terminal a tqdm bar
    replaces the log lines."""
    import sys

    import vitlab.train.trackers as trackers

    scalars = []

    class Writer:
        def add_scalar(self, tag, value, step):
            scalars.append((tag, step))

        def close(self):
            scalars.append(("closed", -1))

    monkeypatch.setattr(trackers, "_tensorboard", lambda run_dir: Writer())
    monkeypatch.setitem(trackers._TENSORBOARD, "enabled", True)  # `--tb`
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    run(tiny(tmp_path, steps=2, eval_every=0))
    assert {("train/loss", 1), ("train/data_images_per_s", 2), ("val/top1", 2), ("closed", -1)} <= set(scalars)


@pytest.mark.slow
def test_compiled_run(tmp_path):
    result = run(tiny(tmp_path, steps=2, compile=True))
    assert result.status == "completed" and set(vitlab.load(result.weights).state_dict()) == set(
        vitlab.create_model("ViT-Ti/4", num_classes=10, image_size=8, **TINY_VIT_ARGS).state_dict())


def test_classification_metrics():
    from vitlab.eval.metrics import ClassificationMeter, confusion_matrix, per_class_accuracy, topk_correct

    logits = torch.tensor([[3.0, 2.0, 1.0], [0.0, 1.0, 2.0], [1.0, 3.0, 2.0], [2.0, 1.0, 0.0]])
    labels = torch.tensor([0, 0, 2, 1])
    top1, top2, top5 = topk_correct(logits, labels, (1, 2, 5))
    assert top1.tolist() == [True, False, False, False] and top2.tolist() == [True, False, True, True]
    assert top5.all()  # capped at the 3 classes
    cm = confusion_matrix(logits.argmax(1), labels, 3)
    assert cm.tolist() == [[1, 0, 1], [1, 0, 0], [0, 1, 0]]
    assert per_class_accuracy(cm).tolist() == [0.5, 0.0, 0.0]
    meter = ClassificationMeter(3, confusion=True)
    meter.update(logits[:2], labels[:2], torch.tensor([1.0, 2.0]))
    meter.update(logits[2:], labels[2:], torch.tensor([3.0, 4.0]))
    assert meter.result() == {"loss": 2.5, "top1": 0.25, "top5": 1.0, "count": 4}
    assert torch.equal(meter.confusion, cm)


def test_top5_is_shown_only_above_five_classes_and_always_recorded():
    from vitlab.train.banner import result_line
    from vitlab.train.trainer import Classification, RunResult

    metrics = {"loss": 0.5, "top1": 0.75, "top5": 1.0, "count": 8}
    objective = Classification()
    assert objective.summary(metrics, 4) == "val loss 0.5000  top-1 75.00%  (8 images)"  # 100% by construction
    assert objective.summary(metrics, 10) == "val loss 0.5000  top-1 75.00%  top-5 100.00%  (8 images)"
    shown = objective.reported(metrics, 4)
    assert "top5" not in shown and "top5" in metrics  # the record (metrics.jsonl) keeps it
    line = result_line(RunResult(Path("run"), "completed", 10, shown, 0.75, None, 100.0), "train")
    assert "top-1 75.00%, loss 0.5000 (8 images)" in line and "top-5" not in line
    line = result_line(RunResult(Path("run"), "completed", 10, metrics, 0.75, None, 100.0), "train")
    assert "top-1 75.00%, top-5 100.00%, loss 0.5000" in line


def test_step_parts_are_the_model_optimizer_and_loss_the_run_trains_with():
    from vitlab.train import step_parts
    from vitlab.train.trainer import build_run_model

    cfg = resolve_config("demo", **TINY_TRAIN, out="unused", label_smoothing=0.1)
    classes = [str(i) for i in range(10)]
    torch.manual_seed(0)
    parts = step_parts(cfg, classes)
    torch.manual_seed(0)
    model = build_run_model(cfg, classes)
    assert parts.model.training and parts.model.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(parts.model.state_dict().values(), model.state_dict().values(),
                                                   strict=True))
    x, y = torch.rand(4, 3, 8, 8) * 2 - 1, torch.tensor([0, 3, 5, 9])
    torch.manual_seed(1)
    loss = parts.loss(x, y)
    torch.manual_seed(1)
    expected = classification_loss(model(x), y, cfg.loss, 0.1)
    assert torch.allclose(loss, expected, rtol=1e-6)
    assert type(parts.optimizer).__name__ == {"adam": "AdamW", "sgd": "SGD"}[cfg.optimizer]
    assert all(g["lr"] == cfg.lr for g in parts.optimizer.param_groups)
    assert {id(p) for g in parts.optimizer.param_groups for p in g["params"]} == {id(p) for p in
                                                                                  parts.model.parameters()}
