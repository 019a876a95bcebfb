"""Few-shot linear evaluation as big_vision's `fewshot_lsr` defines it (paper Section 4.1 "few-shot accuracies").

Frozen representations are standardised with the few-shot set's statistics, a constant feature 100 acts as an
almost unregularised bias, targets are 2·onehot − 1, and the ridge solution comes from one eigendecomposition of
the smaller Gram matrix (XᵀX when N ≥ D, XXᵀ when N < D), which then serves every L2 value at the cost of a
diagonal rescale. Float64 throughout: the result should not depend on the solver's rounding.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from vitlab.runtime.compiling import CompileChoice
from vitlab.runtime.precision import Precision

BIAS_CONSTANT = 100.0
STD_EPS = 1e-5
DEFAULT_L2 = 2.0**10


def _as_numpy(a: np.ndarray | torch.Tensor, dtype: type = np.float64) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return np.asarray(a, dtype=dtype)


@dataclass
class RidgeCache:
    """Everything the solve needs that does not depend on the L2 value."""

    mean: np.ndarray  # (1, D) few-shot set mean
    std: np.ndarray  # (1, D) few-shot set std + 1e-5
    eigs: np.ndarray  # (M,) eigenvalues of the smaller Gram matrix, M = min(N, D + 1)
    q: np.ndarray  # (M, M) its eigenvectors
    rhs_q: np.ndarray  # (M, K) eigenbasis projection of the right-hand side
    x: np.ndarray | None  # (N, D + 1) standardised features, kept for the kernel (N < D) form
    num_classes: int

    def weights(self, l2_reg: float) -> np.ndarray:
        """(D + 1, K) ridge weights: (XᵀX + λI)⁻¹XᵀY, or Xᵀ(XXᵀ + λI)⁻¹Y in the kernel form (same solution)."""
        scaled = self.rhs_q / (self.eigs + l2_reg)[:, None]  # (M, K)
        w = self.q @ scaled
        return self.x.T @ w if self.x is not None else w


def standardize_with_bias(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    x = (x - mean) / std
    return np.pad(x, ((0, 0), (0, 1)), constant_values=BIAS_CONSTANT)  # (N, D + 1)


def precompute(x_train: np.ndarray, y_train: np.ndarray, num_classes: int) -> RidgeCache:
    x = _as_numpy(x_train)
    mean = x.mean(axis=0, keepdims=True)
    std = x.std(axis=0, keepdims=True) + STD_EPS
    x = standardize_with_bias(x, mean, std)
    y = 2.0 * np.eye(num_classes)[_as_numpy(y_train, np.int64)] - 1.0  # (N, K) in {-1, 1}
    n, d = x.shape
    if n >= d:  # D×D Gram
        eigs, q = np.linalg.eigh(x.T @ x)
        return RidgeCache(mean, std, eigs, q, q.T @ (x.T @ y), None, num_classes)
    eigs, q = np.linalg.eigh(x @ x.T)  # N×N kernel
    return RidgeCache(mean, std, eigs, q, q.T @ y, x, num_classes)


def fewshot_from_features(
    x_train: np.ndarray | torch.Tensor,
    y_train: np.ndarray | torch.Tensor,
    x_test: np.ndarray | torch.Tensor,
    y_test: np.ndarray | torch.Tensor,
    l2_reg: float = DEFAULT_L2,
    num_classes: int | None = None,
) -> float:
    """Test accuracy of the closed-form ridge classifier fitted on one already-chosen few-shot set."""
    y_tr, y_te = _as_numpy(y_train, np.int64), _as_numpy(y_test, np.int64)
    k = num_classes or int(max(y_tr.max(), y_te.max())) + 1
    return accuracies_for_l2(precompute(x_train, y_tr, k), x_test, y_te, [l2_reg])[0]


def accuracies_for_l2(cache: RidgeCache, x_test: np.ndarray, y_test: np.ndarray, l2_regs: list[float]) -> list[float]:
    """One decomposition, every L2 value."""
    x = standardize_with_bias(_as_numpy(x_test), cache.mean, cache.std)
    y = _as_numpy(y_test, np.int64)
    return [float(np.mean(np.argmax(x @ cache.weights(l2), axis=-1) == y)) for l2 in l2_regs]


def fewshot_indices(labels: np.ndarray, shots: int, seed: int) -> np.ndarray:
    """big_vision's choice: per class, a random permutation (seeded), first `shots` examples of it."""
    labels = _as_numpy(labels, np.int64)
    rng = np.random.default_rng(seed)
    chosen = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if len(members) < shots:
            raise ValueError(f"class {c} has {len(members)} training examples, fewer than {shots} shots")
        chosen.append(rng.permutation(members)[:shots])
    return np.sort(np.concatenate(chosen))


# --- on a model ---------------------------------------------------------------------------------------------
REPRESENTATIONS = ("pre_logits", "encoder")


@torch.no_grad()
def representations(model: torch.nn.Module, batches: Iterable,
                    representation: str = "pre_logits") -> tuple[np.ndarray, np.ndarray]:
    """The frozen representation (float64) and labels of (images, labels) batches, images already normalised and
    on the model's device; the model's train/eval mode is restored. `pre_logits`: `forward_head(...,
    pre_logits=True)`, the paper's protocol (after the tanh representation layer of a model pre-trained with one);
    `encoder`: the pooled encoder output before that layer (the same for a model without one)."""
    if representation not in REPRESENTATIONS:
        raise ValueError(f"unknown representation {representation!r}; use one of {', '.join(REPRESENTATIONS)}")
    layer = getattr(model, "pre_logits", None)
    skip = representation == "encoder" and layer is not None
    was_training = model.training
    model.eval()
    feats, labels = [], []
    try:
        if skip:  # forward_head skips a missing representation layer: its pooling stays the model's own
            model.pre_logits = None
        for images, targets in batches:
            feats.append(model.forward_head(model.forward_features(images), pre_logits=True).float().cpu())
            labels.append(torch.as_tensor(targets))
    finally:
        if skip:
            model.pre_logits = layer
        model.train(was_training)
    return torch.cat(feats).double().numpy(), torch.cat(labels).numpy()


def extract_features(
    model: torch.nn.Module, data: object, batch_size: int = 256, device: str | torch.device | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Representations of a dataset or DataLoader of (image tensor, label) pairs."""
    from torch.utils.data import DataLoader

    loader = data if isinstance(data, DataLoader) else DataLoader(data, batch_size=batch_size, shuffle=False)
    device = torch.device(device or next(model.parameters()).device)
    return representations(model, ((images.to(device), targets) for images, targets in loader))


@dataclass
class FewshotResult:
    l2_reg: float
    table: dict[str, dict]  # shots ("1", "5", …, "all") -> {"mean": acc, "per_seed": [acc, …]}
    sweep: dict[str, dict] | None = None  # shots -> {"l2": best value, "mean": acc}; chosen on the test set
    splits: dict | None = None  # where the train and test images came from (EvaluationSplits.record())
    precision: Precision | None = None  # what the features were computed in, where known (not in to_dict)
    compiled: CompileChoice | None = None  # whether the features' path was compiled, and why (not in to_dict)

    def to_dict(self) -> dict:
        out = {**(self.splits or {}), "l2_reg": self.l2_reg, "accuracy": self.table}
        if self.sweep:
            out["best_of_l2_sweep_chosen_on_test_optimistic"] = self.sweep
        return out

    def format(self) -> str:
        """The table for people: accuracies in percent (to_dict keeps fractions in [0, 1])."""
        lines = [f"{'shots':>6}  {'mean':>7}  per seed   (top-1 accuracy; L2 = {self.l2_reg:g})"]
        for shots, row in self.table.items():
            seeds = " ".join(f"{100 * a:6.2f}%" for a in row["per_seed"])
            lines.append(f"{shots:>6}  {100 * row['mean']:6.2f}%  {seeds}")
        if self.sweep:
            lines.append("best L2 of the sweep, chosen on the test set (optimistic, not the protocol's number):")
            lines += [f"{s:>6}  {100 * r['mean']:6.2f}%  L2 = {r['l2']:g}" for s, r in self.sweep.items()]
        return "\n".join(lines)


def check_protocol(
    shots: tuple[int | str, ...], seeds: int, l2_reg: float, l2_sweep: list[float] | None = None
) -> None:
    """ValueError naming the allowed range for a setting the protocol cannot use: a shot count that is not a
    positive integer or "all", fewer than one seed, an L2 value that is not a positive finite number (0 leaves
    the system singular for N < D; NaN makes every accuracy meaningless)."""
    def bad(n: object) -> bool:
        return isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1

    bad_shots = [s for s in shots if s != "all" and bad(s)]
    if not shots or bad_shots:
        raise ValueError(f"shots must be positive integers or 'all', got {list(shots)}")
    if bad(seeds):
        raise ValueError(f"seeds must be an integer >= 1, got {seeds!r}")
    for value in (l2_reg, *(l2_sweep or [])):
        if not (isinstance(value, (int, float, np.floating)) and math.isfinite(value) and value > 0):
            raise ValueError(f"L2 values must be finite numbers > 0, got {value!r}")


def fewshot_on_features(
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    shots: tuple[int | str, ...] = (1, 5, 10, 25),
    seeds: int = 3,
    l2_reg: float = DEFAULT_L2,
    l2_sweep: list[float] | None = None,
) -> FewshotResult:
    """The protocol on precomputed features: for each shot count and seed a per-class draw, one solve each."""
    check_protocol(shots, seeds, l2_reg, l2_sweep)
    (x_tr, y_tr), (x_te, y_te) = train, test
    for name, x in (("train", x_tr), ("test", x_te)):
        if not len(x):
            raise ValueError(f"the few-shot {name} split has no images")
        if not np.isfinite(_as_numpy(x)).all():
            raise ValueError(f"the few-shot {name} features have NaN or inf values; check the model's weights")
    num_classes = int(max(y_tr.max(), y_te.max())) + 1
    l2s = [l2_reg] + [v for v in (l2_sweep or []) if v != l2_reg]
    table, sweep = {}, {}
    for shot in shots:
        draws = [np.arange(len(y_tr))] if shot == "all" else [fewshot_indices(y_tr, int(shot), s) for s in range(seeds)]
        per_l2 = np.array([accuracies_for_l2(precompute(x_tr[i], y_tr[i], num_classes), x_te, y_te, l2s)
                           for i in draws])  # (draws, L2 values)
        table[str(shot)] = {"mean": float(per_l2[:, 0].mean()), "per_seed": [float(a) for a in per_l2[:, 0]]}
        best = int(np.argmax(per_l2.mean(axis=0)))
        sweep[str(shot)] = {"l2": l2s[best], "mean": float(per_l2[:, best].mean())}
    return FewshotResult(l2_reg, table, sweep if l2_sweep else None)


def fewshot(
    model: torch.nn.Module,
    train_data: object,
    test_data: object,
    shots: tuple[int | str, ...] = (1, 5, 10, 25),
    seeds: int = 3,
    l2_reg: float = DEFAULT_L2,
    l2_sweep: list[float] | None = None,
    batch_size: int = 256,
) -> FewshotResult:
    """Few-shot linear accuracy of `model`'s frozen representation; features are computed once per dataset."""
    train = extract_features(model, train_data, batch_size)
    test = extract_features(model, test_data, batch_size)
    return fewshot_on_features(train, test, shots, seeds, l2_reg, l2_sweep)
