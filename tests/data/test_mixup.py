"""MixUp (BiT-HyperRule): a hand-computed batch, λ ~ Beta(α, α) against scipy, draws as a function of
(seed, step), and exact resume of a run that mixes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from tests.conftest import TINY_TRAIN
from vitlab.data.mixup import MixUp, draw_mixup
from vitlab.train import resolve_config, run
from vitlab.train.trainer import Classification


def test_mixed_images_and_loss_equal_a_hand_computed_batch():
    # three "images" of two pixels each, fed to a model that returns its input as two logits
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]]).reshape(3, 1, 1, 2)
    y = torch.tensor([0, 1, 1])
    mix = MixUp(0.3, torch.tensor([2, 0, 1]))
    # image i becomes 0.3·x[i] + 0.7·x[perm[i]]
    expected = torch.tensor([[2.4, 0.7], [0.7, 0.6], [0.9, 1.7]]).reshape(3, 1, 1, 2)
    assert torch.allclose(mix.images(x), expected)

    def ce(logits, label):  # -log softmax, by hand
        return -(logits[label] - math.log(sum(math.exp(v) for v in logits)))

    rows = [[2.4, 0.7], [0.7, 0.6], [0.9, 1.7]]
    y_b = [1, 0, 1]  # y[perm]
    hand = sum(0.3 * ce(r, a) + 0.7 * ce(r, b) for r, a, b in zip(rows, [0, 1, 1], y_b, strict=True)) / 3
    cfg = resolve_config("finetune")
    loss = Classification().loss(nn.Flatten(), x, y, cfg, mix)
    assert loss.item() == pytest.approx(hand, rel=1e-6)
    assert Classification().loss(nn.Flatten(), x, y, cfg).item() != pytest.approx(hand, rel=1e-3)


def test_draws_depend_only_on_seed_step_microstep_and_process():
    a = draw_mixup(0.1, 16, seed=3, step=7, micro=1, rank=0)
    b = draw_mixup(0.1, 16, seed=3, step=7, micro=1, rank=0)
    assert a.lam == b.lam and torch.equal(a.perm, b.perm)
    assert sorted(a.perm.tolist()) == list(range(16))
    other_rank = draw_mixup(0.1, 16, seed=3, step=7, micro=1, rank=1)
    other_micro = draw_mixup(0.1, 16, seed=3, step=7, micro=0, rank=0)
    # one λ per optimiser step (as big_transfer draws it), a different pairing per micro-batch and process
    assert other_rank.lam == a.lam == other_micro.lam
    assert not torch.equal(other_rank.perm, a.perm) and not torch.equal(other_micro.perm, a.perm)
    assert draw_mixup(0.1, 16, seed=3, step=8).lam != a.lam
    assert draw_mixup(0.0, 16, seed=3, step=7) is None
    state = torch.get_rng_state()
    draw_mixup(0.1, 16, seed=0, step=0)
    assert torch.equal(state, torch.get_rng_state())  # the global stream (dropout) is untouched


def test_lambda_follows_beta_alpha_alpha():
    scipy_stats = pytest.importorskip("scipy.stats")
    alpha = 0.1  # the BiT-HyperRule's
    lams = np.array([draw_mixup(alpha, 2, seed=0, step=s).lam for s in range(20_000)])
    assert lams.mean() == pytest.approx(0.5, abs=0.01)
    assert lams.var() == pytest.approx(1 / (4 * (2 * alpha + 1)), rel=0.03)  # Beta(α, α) variance
    assert (lams < 0.1).mean() == pytest.approx(scipy_stats.beta.cdf(0.1, alpha, alpha), abs=0.01)



def tiny(out, **overrides):
    base = {**TINY_TRAIN, "out": str(out), "steps": 6, "eval_every": 0, "save_every": 2, "keep_last": 3,
            "dropout": 0.1, "mixup": 0.4}
    return resolve_config("demo", **{**base, **overrides})


def weights(result):
    return load_file(str(result.weights))


def test_mixup_changes_training(tmp_path):
    mixed = weights(run(tiny(tmp_path / "mixed", steps=2, save_every=0)))
    plain = weights(run(tiny(tmp_path / "plain", steps=2, save_every=0, mixup=0.0)))
    assert not torch.equal(mixed["head.weight"], plain["head.weight"])


@pytest.mark.slow
def test_mixup_run_resumes_exactly(tmp_path, sigterm_during_step):
    """Preempted at step 3 and resumed: the same weights as without the interruption, bit for bit."""
    reference = weights(run(tiny(tmp_path / "ref")))
    with sigterm_during_step(3):
        assert run(tiny(tmp_path / "run")).status == "preempted"
    resumed = weights(run(tiny(tmp_path / "run", resume=True)))
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)


def test_mixup_is_refused_for_self_supervision():
    with pytest.raises(ValueError, match="--mixup mixes labelled images"):
        resolve_config("mpp", mixup=0.1)
