"""What a newcomer's first runs print: finetune without --init names the published weights of --model, the
--print-config plan shows the warnings the run will print, an --epochs run that rounds up to whole batches says so,
and curves.png plots top-5 only where the run measured it (more than 5 classes)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import TINY_TRAIN_FLAGS
from vitlab.cli import main


def test_finetune_with_a_model_but_no_init_points_to_its_published_weights(capsys, tmp_path):
    code = main(["finetune", "--model", "ViT-S/16", "--data", "digits", "--out", str(tmp_path / "ft")])
    err = capsys.readouterr().err
    assert code == 2
    assert "--init WEIGHTS is required" in err and "--init ViT-S/16" in err
    assert "vitlab models --pretrained --model ViT-S/16" in err


def test_print_config_shows_the_ema_horizon_warning_the_run_prints(capsys, tmp_path):
    flags = ["train", "--data", "digits", "--out", str(tmp_path / "r"), "--steps", "20", "--ema", "0.999"]
    assert main([*flags, *TINY_TRAIN_FLAGS, "--print-config"]) == 0
    planned = capsys.readouterr().out
    assert "warning: --ema-decay 0.999 averages over about 1,000 steps" in planned
    assert main([*flags, *TINY_TRAIN_FLAGS, "--ema-warmup", "--print-config"]) == 0
    assert "warning:" not in capsys.readouterr().out  # warm-up starts the average at once: no warning


@pytest.mark.parametrize(("batch", "said"), [(32, "rounded up to whole batches: 1.2 epochs"), (40, None)])
def test_epochs_in_whole_batches_say_when_they_round_up(capsys, tmp_path, batch, said):
    # fractal:4:20 holds 80 training images: 1 epoch at batch 32 is 3 whole steps (96 images), at 40 exactly 2
    flags = ["train", "--data", "fractal:4:20", "--out", str(tmp_path / "e"), "--epochs", "1", *TINY_TRAIN_FLAGS,
             "--batch-size", str(batch), "--print-config"]
    assert main(flags) == 0
    out = capsys.readouterr().out
    assert f"steps of {batch} images" in out
    if said:
        assert said in out and "schedule 3 steps" in out
    else:
        assert "rounded up" not in out and "schedule 2 steps" in out


@pytest.mark.parametrize(("classes", "top5"), [(4, False), (10, True)])
def test_curves_plot_top5_only_above_5_classes(tmp_path, monkeypatch, classes, top5):
    import matplotlib.axes

    from vitlab.train.metrics import plot_curves

    val = {"split": "val", "loss": 1.0, "top1": 0.5, "count": 10} | ({"top5": 0.9} if top5 else {})
    records = [{"split": "train", "step": s, "loss": 1.0, "lr": 0.1} for s in (1, 2)] + [{**val, "step": 2}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    labels: list[str] = []
    real = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, *a, **k: (labels.append(k.get("label")), real(self, *a, **k))[1])
    assert plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curves.png") is not None
    assert ("val top5" in labels) == top5 and "val top1" in labels
