"""The paper's fine-tuning protocol as one call (Appendix B.1.1, Table 4).

"We run a small grid search over learning rates ... we use small sub-splits from the training set (10% for Pets
and Flowers, 2% for CIFAR, 1% ImageNet) as development set and train on the remaining data." `run_sweep`
fine-tunes once per learning rate, each a normal run of the training loop in its own sub-directory
(`<out>/lr_0.01/`), on the training split minus a class-stratified dev split that is the same for every learning
rate. The learning rate with the best final dev accuracy is chosen; every run's weights are also evaluated on the
test data (the dataset's val split: an embedded set's test split, a folder's val/), but only the chosen run's
test accuracy is the result. With `refit`, the chosen learning rate is trained once more on the whole training
split ("for final results we train on the entire training set"), in `<out>/final/`.

Writes `<out>/sweep.json` (table, choice, settings) and `<out>/sweep.png` (dev and test accuracy against lr).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vitlab.data import is_embedded
from vitlab.data.datasets import has_val_split
from vitlab.errors import DataError, setting
from vitlab.eval.classify import evaluate_weights
from vitlab.files.outputs import WRITTEN_BY, atomic_write, check_replaceable, mark, write_json
from vitlab.files.rundir import CONFIG, REFIT_RUN, SWEEP_PLOT, SWEEP_RECORD, enclosing_run, is_run_dir, sweep_run_name
from vitlab.train.config import TrainConfig
from vitlab.train.distributed import Preempted
from vitlab.train.resolution import Resolved, resume_sweep_run
from vitlab.train.trainer import run

log = logging.getLogger("vitlab.train")


@dataclass
class SweepRow:
    lr: float
    dev_top1: float  # final accuracy on the dev split (what chooses)
    test_top1: float  # accuracy of the same weights on the test data (reported for the chosen lr only)
    run_dir: str


@dataclass
class SweepResult:
    out_dir: Path
    rows: list[SweepRow]
    chosen: SweepRow
    dev_fraction: float
    refit_test_top1: float | None = None  # the chosen lr trained on all of train (with refit)
    seconds: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def test_top1(self) -> float:
        """The protocol's result: test accuracy of the run the dev split chose (its refit, if any)."""
        return self.chosen.test_top1 if self.refit_test_top1 is None else self.refit_test_top1


def check_sweep(cfg: TrainConfig) -> None:
    """Settings a sweep cannot run with, before any run starts."""
    if len(cfg.lr_sweep) < 1 or any(lr <= 0 for lr in cfg.lr_sweep):
        raise ValueError(f"{setting('lr_sweep')} needs positive learning rates, got {cfg.lr_sweep}")
    if len(set(cfg.lr_sweep)) != len(cfg.lr_sweep):
        raise ValueError(f"{setting('lr_sweep')} lists a learning rate twice: {cfg.lr_sweep}")
    if cfg.dev_fraction is None or not 0.0 < cfg.dev_fraction < 1.0:
        raise ValueError(
            f"{setting('lr_sweep')} needs {setting('dev_fraction')} in (0, 1) (the paper: 0.02 for CIFAR), "
            f"got {cfg.dev_fraction}"
        )
    if cfg.val_fraction:
        raise ValueError(f"{setting('val_fraction')} with {setting('lr_sweep')}: the sweep holds out "
                         f"{setting('dev_fraction')} itself; drop it")
    out = Path(cfg.out)
    if is_run_dir(out) or (around := enclosing_run(out)) is not None:
        raise ValueError(f"{setting('out', value=str(out))} "
                         f"{'holds a run' if is_run_dir(out) else f'lies inside the run or sweep {around}'}; a sweep "
                         f"writes its runs into a folder of its own: choose a new {setting('out')}")
    if not is_embedded(cfg.data):
        if not has_val_split(cfg.data):  # a folder's val/ or val shards
            raise DataError(
                f"missing split: {cfg.data} has no val/ folder, so a sweep cannot report test accuracy; add "
                f"{cfg.data}/val/<class>/*.jpg"
            )


def sub_config(cfg: TrainConfig, lr: float, dev_fraction: float | None, name: str) -> TrainConfig:
    """One run of the sweep: the sweep's settings at `lr`, validated on the dev split, in `<out>/<name>` (a new run:
    one an interrupted sweep already started resumes from its own record, `_sub_run`)."""
    return cfg.replace(lr=lr, lr_sweep=(), val_fraction=dev_fraction, refit=False, resume=False,
                       out=str(Path(cfg.out) / name))


def run_name(lr: float) -> str:
    return sweep_run_name(lr)


def choose(rows: list[SweepRow]) -> SweepRow:
    """The best dev accuracy; a tie goes to the smaller learning rate."""
    return max(sorted(rows, key=lambda r: r.lr), key=lambda r: r.dev_top1)


def grid_edge(rows: list[SweepRow], chosen: SweepRow) -> str | None:
    """A warning when the chosen learning rate is the largest or smallest of a grid of several (the best may lie
    beyond it), with the next value one step of the grid's ratio further; None inside the grid. The rule the
    experiments apply to their own sweeps (reproduction.preconditions, condition c)."""
    lrs = sorted(r.lr for r in rows)
    if len(lrs) < 2 or chosen.lr not in (lrs[0], lrs[-1]):
        return None
    if chosen.lr == lrs[-1]:
        return (f"chosen lr {chosen.lr:g} is the largest of the grid; extend the grid upward (e.g. add "
                f"{chosen.lr * lrs[-1] / lrs[-2]:.2g})")
    return (f"chosen lr {chosen.lr:g} is the smallest of the grid; extend the grid downward (e.g. add "
            f"{chosen.lr * lrs[0] / lrs[1]:.2g})")


def _fine_tune(resolved: Resolved) -> tuple[float, float]:
    """(final dev top-1, test top-1 of the final weights) of one run through the training loop."""
    cfg = resolved.config
    result = run(resolved)
    if result.status != "completed":
        sweep = Path(cfg.out).parent
        raise Preempted(f"the sweep was preempted in {cfg.out} at step {result.step}; continue it with the same "
                        f"command and {setting('resume', value=True)} ({setting('out', value=str(sweep))})")
    test = evaluate_weights(result.weights, cfg.data, split="val", batch_size=cfg.eval_batch_size, workers=0,
                            device=cfg.device, strict=cfg.strict, precision=cfg.precision)
    return float(result.metrics["top1"]), float(test.metrics["top1"])


def _sub_run(resolved: Resolved, lr: float, dev_fraction: float | None, name: str) -> Resolved:
    """One run of the sweep with the sweep's sources (its banner and config.json say which values the sweep
    set); the initial weights are read once for all of them. Resuming a sweep, a run it already started resumes
    from its own record, held to the sweep's settings as any resumed run is to its flags."""
    sub = sub_config(resolved.config, lr, dev_fraction, name)
    if resolved.config.resume and (Path(sub.out) / CONFIG).is_file():
        return resume_sweep_run(resolved, Path(sub.out), lr)
    split = f"sweep: {100 * dev_fraction:g}% dev split" if dev_fraction else "sweep: refit on all of train"
    sources = {**resolved.sources, "lr": "sweep (--lr-sweep)", "lr_sweep": "sweep", "refit": "sweep",
               "val_fraction": split, "out": "sweep"}
    return Resolved(sub, sources, resolved.notes, init=resolved.init)


def run_sweep(settings: TrainConfig | Resolved) -> SweepResult:
    """Fine-tune at every lr of `lr_sweep`, choose on the dev split, report the chosen run's test accuracy."""
    resolved = settings if isinstance(settings, Resolved) else Resolved(
        settings, dict.fromkeys(settings.to_dict(), "given"))
    cfg = resolved.config
    check_sweep(cfg)
    start = time.perf_counter()
    out = Path(cfg.out)
    # before hours of fine-tuning: the sweep's record and figure go into --out, never over a file of the user's
    check_replaceable(out, SWEEP_RECORD, SWEEP, (SWEEP_PLOT,), legacy_keys=SWEEP_RECORD_KEYS, owner=True)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    # every run first: a resumed sweep refuses a contradicting setting before any run trains
    subs = {lr: _sub_run(resolved, lr, cfg.dev_fraction, run_name(lr)) for lr in sorted(cfg.lr_sweep)}
    for lr, sub in subs.items():
        log.info("sweep: lr %g on train minus %g%% dev -> %s", lr, 100 * cfg.dev_fraction, sub.config.out)
        dev, test = _fine_tune(sub)
        rows.append(SweepRow(lr, dev, test, sub.config.out))
    chosen = choose(rows)
    result = SweepResult(out, rows, chosen, cfg.dev_fraction, config=cfg.to_dict())
    if (edge := grid_edge(rows, chosen)) is not None:
        log.warning("sweep: %s", edge)
    if cfg.refit:
        final = _sub_run(resolved, chosen.lr, None, REFIT_RUN)
        log.info("sweep: lr %g chosen; fine-tuning on all of train -> %s", chosen.lr, final.config.out)
        result.refit_test_top1 = _fine_tune(final)[1]
    result.seconds = time.perf_counter() - start
    write_sweep(result)
    return result


SWEEP = "vitlab train --lr-sweep"
SWEEP_RECORD_KEYS = frozenset({"protocol", "dev_fraction", "rows", "chosen_lr"})  # sweep.json before written_by


def write_sweep(result: SweepResult) -> None:
    record = {
        WRITTEN_BY: SWEEP,
        "protocol": "paper Appendix B.1.1: learning rate chosen on a dev split held out from train",
        "dev_fraction": result.dev_fraction,
        "rows": [asdict(r) for r in result.rows],
        "chosen_lr": result.chosen.lr,
        "dev_top1": result.chosen.dev_top1,
        "test_top1": result.test_top1,
        "refit_test_top1": result.refit_test_top1,
        "warning": grid_edge(result.rows, result.chosen),
        "seconds": result.seconds,
        "config": result.config,
    }
    write_json(result.out_dir / SWEEP_RECORD, record)
    plot_sweep(result, result.out_dir / SWEEP_PLOT)


def plot_sweep(result: SweepResult, path: Path) -> Path:
    """Dev and test top-1 against the learning rate (log axis), the chosen lr marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lrs = [r.lr for r in result.rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(lrs, [100 * r.dev_top1 for r in result.rows], "o-", label=f"dev ({100 * result.dev_fraction:g}% of train)")
    ax.plot(lrs, [100 * r.test_top1 for r in result.rows], "s--", label="test")
    ax.axvline(result.chosen.lr, color="grey", ls=":", label=f"chosen lr {result.chosen.lr:g}")
    ax.set_xscale("log")
    ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
    ax.minorticks_off()
    ax.set_xlabel("learning rate")
    ax.set_ylabel("top-1 (%)")
    ax.set_title("fine-tuning learning-rate sweep")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=90, metadata=mark(SWEEP)))
    plt.close(fig)
    return path


def format_table(result: SweepResult) -> str:
    """The sweep as printed by `vitlab finetune --lr-sweep`."""
    lines = [f"{'lr':>8}  {'dev top-1':>9}  {'test top-1':>10}"]
    for r in result.rows:
        mark = "  <- chosen" if r is result.chosen else ""
        lines.append(f"{r.lr:>8g}  {100 * r.dev_top1:>8.2f}%  {100 * r.test_top1:>9.2f}%{mark}")
    lines.append(
        f"chosen lr {result.chosen.lr:g} (best on the {100 * result.dev_fraction:g}% dev split): "
        f"test top-1 {100 * result.chosen.test_top1:.2f}%"
    )
    if (edge := grid_edge(result.rows, result.chosen)) is not None:
        lines.append(f"warning: {edge}")
    if result.refit_test_top1 is not None:
        lines.append(
            f"refit on all of train at lr {result.chosen.lr:g}: test top-1 {100 * result.refit_test_top1:.2f}%"
        )
    lines.append(f"{len(result.rows)} runs in {result.seconds:.0f} s; {result.out_dir / 'sweep.json'}, "
                 f"{result.out_dir / 'sweep.png'}")
    return "\n".join(lines)
