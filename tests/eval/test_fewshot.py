"""Few-shot linear evaluation against an independent closed-form ridge solve (torch.linalg.solve)."""

import numpy as np
import pytest
import torch

import vitlab
from tests.conftest import TINY_VIT_ARGS
from vitlab.eval import fewshot, fewshot_from_features, fewshot_on_features
from vitlab.eval.fewshot_lsr import fewshot_indices, precompute


def direct_ridge(x, y, x_test, num_classes, l2):
    """Independent reference: standardise, bias column 100, targets 2·onehot−1, solve (XᵀX + λI) W = XᵀY."""
    x, x_test = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(x_test, dtype=torch.float64)
    mean, std = x.mean(0, keepdim=True), x.std(0, unbiased=False, keepdim=True) + 1e-5
    def prep(a):
        return torch.cat([(a - mean) / std, torch.full((len(a), 1), 100.0, dtype=torch.float64)], dim=1)
    xs, xt = prep(x), prep(x_test)
    targets = 2.0 * torch.nn.functional.one_hot(torch.as_tensor(y), num_classes).double() - 1.0
    w = torch.linalg.solve(xs.T @ xs + l2 * torch.eye(xs.shape[1], dtype=torch.float64), xs.T @ targets)
    return w, (xt @ w).argmax(-1).numpy()


def blobs(n, d, k, seed):
    centers = np.random.default_rng(1234).normal(size=(k, d)) * 2  # shared by train and test draws
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, size=n)
    return (centers[y] + rng.normal(size=(n, d))).astype(np.float32), y


@pytest.mark.parametrize("n,d", [(200, 16), (20, 64)], ids=["N>=D", "N<D"])
@pytest.mark.parametrize("l2", [2.0**10, 1.0, 1e-2])
def test_matches_direct_solve_in_predictions_and_weights(n, d, l2):
    x, y = blobs(n, d, 5, seed=n)
    x_test, y_test = blobs(300, d, 5, seed=7)
    w_ref, pred_ref = direct_ridge(x, y, x_test, 5, l2)
    cache = precompute(x, y, 5)
    w = torch.as_tensor(cache.weights(l2))
    assert ((w - w_ref).norm() / w_ref.norm()).item() < 1e-6
    acc = fewshot_from_features(x, y, torch.as_tensor(x_test), torch.as_tensor(y_test), l2_reg=l2)
    assert acc == pytest.approx(np.mean(pred_ref == y_test), abs=0)
    assert acc > 0.5  # separable blobs: the solve actually classifies


def test_indices_take_first_k_of_a_per_class_permutation():
    labels = np.array([0, 1, 2] * 10)
    for seed in range(3):
        idx = fewshot_indices(labels, 5, seed)
        assert np.bincount(labels[idx]).tolist() == [5, 5, 5]
    assert not np.array_equal(fewshot_indices(labels, 5, 0), fewshot_indices(labels, 5, 1))
    assert np.array_equal(fewshot_indices(labels, 5, 2), fewshot_indices(labels, 5, 2))
    with pytest.raises(ValueError, match="class 0 has 10 training examples, fewer than 25 shots"):
        fewshot_indices(labels, 25, 0)


def test_table_shots_seeds_and_sweep_labelled():
    train, test = blobs(400, 8, 4, 1), blobs(200, 8, 4, 2)
    res = fewshot_on_features(train, test, shots=(1, 5, "all"), seeds=3, l2_sweep=[1.0, 2.0**10])
    assert list(res.table) == ["1", "5", "all"]
    assert len(res.table["5"]["per_seed"]) == 3 and len(res.table["all"]["per_seed"]) == 1
    assert res.table["all"]["mean"] >= res.table["1"]["mean"]
    assert "optimistic" in res.format() and "best_of_l2_sweep_chosen_on_test_optimistic" in res.to_dict()


def test_fewshot_on_a_model_uses_pre_logits_representation():
    model = vitlab.models.build_model(vitlab.ViTConfig(
        image_size=16, patch_size=8, **TINY_VIT_ARGS, num_classes=3,
        representation_size=12))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 3, 16, 16, generator=g)
    y = torch.arange(60) % 3
    x[y == 1] += 1.0
    data = torch.utils.data.TensorDataset(x, y)
    res = fewshot(model, data, data, shots=(5,), seeds=2)
    assert 0.0 <= res.table["5"]["mean"] <= 1.0 and len(res.table["5"]["per_seed"]) == 2


def test_cli_fewshot_on_embedded_digits_writes_json(tmp_path, capsys):
    import json

    from vitlab.cli import main

    model = vitlab.models.build_model(vitlab.ViTConfig(
        image_size=16, patch_size=4, **TINY_VIT_ARGS, num_classes=10))
    vitlab.save(model, tmp_path / "m.safetensors")
    out = tmp_path / "fs.json"
    code = main(["fewshot", "--weights", str(tmp_path / "m.safetensors"), "--data", "digits", "--shots", "1,5,all",
                 "--seeds", "2", "--json", str(out), "--device", "cpu"])
    assert code == 0
    table = json.loads(out.read_text())["accuracy"]
    assert list(table) == ["1", "5", "all"] and len(table["5"]["per_seed"]) == 2
    assert table["all"]["mean"] > 0.3  # even random ViT features are far above chance (0.1) with a full probe
    assert "shots" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:  # refused while parsing (tests/cli/test_numeric_flags.py: every flag)
        main(["fewshot", "--weights", str(tmp_path / "m.safetensors"), "--shots", "0"])
    assert exit_.value.code == 2


def test_fewshot_tracked_during_training(tmp_path):
    """The paper tracks 5-shot accuracy during pre-training: `fewshot_every` logs it to metrics.jsonl."""
    import json

    from vitlab.train import resolve_config, run

    cfg = resolve_config("demo", out=str(tmp_path / "run"), model="ViT-Ti/4", image_size=8, batch_size=32, steps=4,
                         warmup=1, eval_every=4, log_every=1, workers=0, fewshot_every=2,
                         model_args=TINY_VIT_ARGS)
    run(cfg)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    shots = [r for r in records if r["split"] == "fewshot"]
    assert [r["step"] for r in shots] == [2, 4] and all(0.0 <= r["5shot"] <= 1.0 for r in shots)
    assert shots[-1]["5shot"] > 0.2  # above chance (0.1) on digits already
    with pytest.raises(ValueError, match="--fewshot-every runs on one process"):
        resolve_config("demo", fewshot_every=10, fsdp=True)
