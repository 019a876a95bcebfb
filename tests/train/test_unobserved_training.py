"""The training step computes the last block for the class token alone while nothing observes it, and every token
as soon as a hook watches the last block or the final norm; the losses are the same either way."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import TINY_TRAIN
from vitlab.models.vit import VisionTransformer
from vitlab.train import resolve_config, run
from vitlab.train import trainer as trainer_module

STEPS = 4


def tiny(tmp_path, name: str):
    return resolve_config("demo", **{**TINY_TRAIN, "out": str(tmp_path / name), "steps": STEPS, "eval_every": 0})


def train_losses(run_dir) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r.get("split") == "train"]


@pytest.fixture
def fast_calls(monkeypatch) -> list[int]:
    """The batch sizes `forward_unobserved` was called with."""
    calls: list[int] = []
    original = VisionTransformer.forward_unobserved
    monkeypatch.setattr(VisionTransformer, "forward_unobserved",
                        lambda self, x: (calls.append(len(x)), original(self, x))[1])
    return calls


def test_training_skips_unread_tokens_while_unobserved(tmp_path, fast_calls) -> None:
    run(tiny(tmp_path, "run"))
    assert fast_calls == [TINY_TRAIN["batch_size"]] * STEPS  # every step; the evaluation runs `model(x)`


@pytest.mark.parametrize("where", ["blocks.-1", "norm"])
def test_a_hook_during_training_sees_every_token(tmp_path, monkeypatch, fast_calls, where: str) -> None:
    shapes: list[tuple[int, ...]] = []
    build = trainer_module.build_run_model

    def build_and_hook(*args, **kwargs):
        model = build(*args, **kwargs)
        watched = model.blocks[-1] if where == "blocks.-1" else model.norm
        watched.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)) if m.training else None)
        return model

    monkeypatch.setattr(trainer_module, "build_run_model", build_and_hook)
    hooked = run(tiny(tmp_path, "hooked"))
    assert fast_calls == []
    tokens = (TINY_TRAIN["image_size"] // 4) ** 2 + 1  # ViT-Ti/4 at 8x8: 4 patches and the class token
    assert shapes == [(TINY_TRAIN["batch_size"], tokens, 32)] * STEPS

    monkeypatch.setattr(trainer_module, "build_run_model", build)
    plain = run(tiny(tmp_path, "plain"))
    assert len(fast_calls) == STEPS
    torch.testing.assert_close(train_losses(plain.out_dir), train_losses(hooked.out_dir), rtol=1e-5, atol=0)
    assert plain.metrics["top1"] == hooked.metrics["top1"]
