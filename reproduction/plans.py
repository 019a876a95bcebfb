"""The runs experiments ask for, as specs: pre-training, the untrained reference, fine-tuning (from weights or from
scratch), and the learning-rate choices among them.

Pre-training follows the paper's ImageNet-1k recipe (Table 3: Adam, cosine decay, softmax with a `pre_logits` layer;
vitlab recipe `pretrain-i1k`) with the light regularisation of `recipes.PRETRAIN_SMALL`, at a CPU's scale, the
warm-up keeping its share of the steps (the resolution step's rule), the learning rate chosen per model from a small
grid on the pre-training set's own validation split.

Fine-tuning (design version 3, the pilot's protocol: both build on `target_settings`): the pre-trained weights and, the
reference, the same model from its initialisation, both trained on the scale's small labelled target (`mnist:10`)
with the recipe that trains the model from scratch, at the model's tuned pre-training learning rate: the two arms
differ only in their initialisation and in their length. The reference trains for `reference_steps`, as long as the
pilot found these references to need to saturate; the fine-tuning for `finetune_steps`, no longer (a test of (b)
that favours the reference). The pilot measured why not the paper's SGD protocol here: a ViT-M trained from scratch
with it reached 89.5 % on 4,000 MNIST images after 6,000 steps, with the from-scratch recipe 96.8 % on 1,000, and a
learning-rate grid per fine-tuning (a dev run per value) cost more than the rest of an experiment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reproduction.families import model_settings
from reproduction.recipes import ABLATION, DIGITS_PREPROCESSING, PRETRAIN_SMALL, source_preprocessing
from reproduction.runner import Context
from reproduction.scale import Scale
from reproduction.spec import RunSpec

TUNING_SEED = 0  # learning rates are chosen on seed-0 runs whatever --seeds says, so every choice is shared
GRID_EXTENSIONS = 2  # precondition (c): a grid whose best value is at an edge grows by one step, at most this often


def pretrain(scale: Scale, family: str, size: str, data: str, lr: float, seed: int, *, mpp: bool = False,
             tag: str = "", **model_overrides: Any) -> RunSpec:
    """Supervised (or MPP) pre-training of one model on `data`, the weights of `curve_points` checkpoints kept for
    the transfer curve."""
    settings = {
        **model_settings(family, size, **model_overrides), "data": data, "image_size": scale.image_size,
        "batch_size": scale.batch_size, "steps": scale.steps, "lr": lr, "seed": seed,
        "eval_every": scale.eval_every, "log_every": max(1, scale.steps // 10),
        "save_every": max(1, scale.steps // scale.curve_points), "keep_last": scale.curve_points,
        "workers": scale.workers, **PRETRAIN_SMALL,
        # the source's recipe is the one the pilot's ablation chose for it; digits keep theirs
        **(DIGITS_PREPROCESSING if data == "digits" else {**source_preprocessing(data), **ABLATION[scale.recipe]}),
    }
    kind = "mpp" if mpp else "pre"
    label = f"{kind}-{family}{tag}-{size}-{data}-s{seed}"
    return RunSpec(label, "mpp" if mpp else "pretrain-i1k", settings, curve=True)


def untrained(scale: Scale, family: str, size: str, seed: int) -> RunSpec:
    """The model exactly as pre-training with `seed` initialises it: one step at learning rate 0 of the same
    pre-training run (Adam's update and the decoupled weight decay are both scaled by the learning rate, so the
    weights do not move). The reference a pre-trained representation must beat to have learnt anything that
    transfers: a random network's features are far from useless to a linear classifier on digits."""
    settings = {**pretrain(scale, family, size, scale.largest, 0.0, seed).settings, "steps": 1, "save_every": 0,
                "keep_last": 1, "eval_every": 0}
    return RunSpec(f"init-{family}-{size}-s{seed}", "pretrain-i1k", settings)


def target_settings(scale: Scale, steps: int, lr: float, seed: int) -> dict[str, Any]:
    """Training on the scale's labelled target (`finetune_data[0]`) with the recipe that trains these models from
    scratch: the settings a fine-tuning and its from-scratch reference share (the pilot's too), the model and the
    initialisation being all that differs."""
    return {
        "data": scale.finetune_data[0], "image_size": scale.image_size, "batch_size": scale.batch_size,
        "steps": steps, "lr": lr, "seed": seed, "eval_every": 0, "log_every": max(1, steps // 5), "keep_last": 1,
        "workers": scale.workers, **PRETRAIN_SMALL, **DIGITS_PREPROCESSING,
    }


def finetune(scale: Scale, parent: RunSpec | None, seed: int, *, scratch: tuple[str, str] | None = None,
             lr: float | None = None) -> RunSpec:
    """Fine-tuning on the scale's target (`finetune_data[0]`, small grey digits upsampled to the scale's size)
    from `parent`'s weights at its pre-training lr, or, with scratch=(family, size) and that model's tuned `lr`,
    training it from its initialisation with the same recipe for `reference_steps`."""
    data = scale.finetune_data[0]
    steps = (scale.reference_steps or scale.finetune_steps) if scratch is not None else scale.finetune_steps
    settings = target_settings(scale, steps, parent.settings["lr"] if lr is None else lr, seed)
    if scratch is not None:
        settings.update(model_settings(*scratch))
        return RunSpec(f"scratch-{scratch[0]}-{scratch[1]}-{data}-s{seed}", "pretrain-i1k", settings)
    own_seed = "" if parent.settings.get("seed") == seed else f"-s{seed}"
    return RunSpec(f"ft-{data}-{parent.label}{own_seed}", "pretrain-i1k", settings, verb="finetune",
                   init=parent.key)


def transfer_evals(scale: Scale) -> list[str]:
    return [f"fewshot/{d}" for d in scale.fewshot_data]


def tuned_lr(ctx: Context, name: str, grid: tuple[float, ...], spec_of: Callable[[float], RunSpec]) -> float:
    """The learning rate of `grid` whose run has the best final validation top-1; a best value at an edge of the
    grid extends it by one step of its ratio on that side and chooses again, at most GRID_EXTENSIONS times (the
    rule precondition (c) is checked against). The grid searched is recorded in `ctx.grids[name]`."""
    grid = sorted(grid)
    best = grid[0]
    for attempt in range(GRID_EXTENSIONS + 1):
        candidates = {lr: spec_of(lr) for lr in grid}
        best = ctx.best(candidates)
        if len(grid) < 2 or any(ctx.run(spec).pending for spec in candidates.values()):
            # the extensions still allowed, for the estimate's upper bound (once: not where an earlier experiment's
            # estimate, which took these runs as done, counted them)
            if ctx.dry and len(grid) >= 2 and not all(spec.key in ctx.assumed for spec in candidates.values()):
                more = GRID_EXTENSIONS - attempt
                ctx.growth[name] = (more, more * ctx.runner.cost.train_seconds(candidates[grid[0]]))
            break  # the dry pass, before the candidates ran: nothing to extend yet
        if attempt == GRID_EXTENSIONS or best not in (grid[0], grid[-1]):
            break
        ratio = grid[1] / grid[0]
        grid = [grid[0] / ratio, *grid] if best == grid[0] else [*grid, grid[-1] * ratio]
    ctx.grids[name] = (best, list(grid))
    return best


def tuned_pretrain_lr(ctx: Context, family: str, size: str = "M", *, mpp: bool = False, tag: str = "",
                      **model_overrides: Any) -> float:
    """The pre-training lr with the best final top-1 (MPP: colour top-1) on the largest set's validation split,
    from seed-0 runs that are themselves the seed-0 runs of the chosen lr."""
    return tuned_lr(ctx, f"pretrain {family}{tag}-{size}", ctx.scale.lrs,
                    lambda lr: pretrain(ctx.scale, family, size, ctx.scale.largest, lr, TUNING_SEED, mpp=mpp, tag=tag,
                                        **model_overrides))
