"""`run_experiment`: estimate, run, analyse, write `<out>/<name>/results.json` and the figures."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from reproduction.design import Design
from reproduction.parallel import Pool, run_parallel
from reproduction.records import read_results_file, write_sealed_json
from reproduction.report.lineage import retrained_runs
from reproduction.runner import Context, Progress, Runner, Todo
from reproduction.scale import FULL, QUICK, Scale
from vitlab import __version__
from vitlab.progress import duration

RESULTS = "results.json"


@dataclass(frozen=True)
class Experiment:
    """A paper finding as data: the runs its `plan` asks for, and `analyze` turning their records into tables,
    figures and the measured comparison."""
    name: str
    title: str
    paper: str  # where in the paper
    finding: str  # the paper's claim, in words
    setup: str  # what is run, with {scale fields} filled in
    plan: Callable[[Context], Any]
    analyze: Callable[[Context, Any, Path], dict[str, Any]]
    seeds: tuple[int, ...] = (0, 1, 2)
    scales: tuple[Scale, Scale] = (FULL, QUICK)  # full and --quick (the pilot has its own)
    design: Design | None = None  # fixed before the full run (experiments.design)

    @classmethod
    def from_module(cls, module: ModuleType) -> Experiment:
        return cls(module.NAME, module.TITLE, module.PAPER, module.FINDING, module.SETUP, module.plan,
                   module.analyze, getattr(module, "SEEDS", (0, 1, 2)), getattr(module, "SCALES", (FULL, QUICK)),
                   getattr(module, "DESIGN", None))


def scale_for(quick: bool, experiment: Experiment | None = None) -> Scale:
    full, quick_scale = experiment.scales if experiment is not None else (FULL, QUICK)
    return quick_scale if quick else full


def default_seeds(experiment: Experiment, quick: bool) -> tuple[int, ...]:
    return experiment.seeds[:1] if quick else experiment.seeds


def estimate(experiment: Experiment, runner: Runner, seeds: tuple[int, ...],
             assumed: dict[str, set[str]] | None = None) -> Context:
    """The dry pass: what is still to do and its seconds (step times are measured here). `assumed`: runs and
    evaluations to take as done (those of the experiments estimated before this one), updated with this one's."""
    dry = Context(runner, seeds, dry=True, assumed=assumed)
    experiment.plan(dry)
    if assumed is not None:
        for key, todo in dry.todo.items():
            assumed.setdefault(key, set()).update(todo.evals)
    return dry


def describe_estimate(experiment: Experiment, dry: Context, runner: Runner, jobs: int = 1) -> str:
    todo = list(dry.todo.values())
    trainings = [t.spec for t in todo if t.train]
    steps = sum(spec.steps for spec in trainings)
    total = sum(t.seconds for t in todo)
    times = "; ".join(f"{name} {t.train_s:.3f} s" for name, t in sorted(runner.cost.named().items()))
    if not todo:
        return f"{experiment.name}: every run is already done; analysing"
    side = (f"about {duration(total / jobs)} with {jobs} runs side by side (runs that wait for another's "
            f"choice run after it), {duration(total)} one after the other" if jobs > 1
            else f"about {duration(total)}")
    return (f"{experiment.name}: {len(trainings)} run(s) to train ({steps:,} steps) and "
            f"{sum(len(t.evals) for t in todo)} evaluation(s): {side} on this machine, "
            f"estimated from step times measured now:\n  {times}\n  by kind: {cost_by_kind(todo)}"
            + _growth(dry))


def _growth(dry: Context) -> str:
    """The upper bound the estimate leaves out: learning-rate grids not yet decided may grow by their rule (every
    grid of the full runs grew at least once, so an estimate without them ran short by hours)."""
    if not dry.growth:
        return ""
    runs = sum(n for n, _ in dry.growth.values())
    seconds = sum(s for _, s in dry.growth.values())
    return (f"\n  not counted: {len(dry.growth)} learning-rate grid(s) still to be decided may each grow by the "
            f"extension rule, at most {runs} more run(s), +{duration(seconds)} one after the other")


def run_kind(label: str) -> str:
    """What a run is for, from its label: pre, ft, scratch, init, mpp (a pilot's run by what follows `pilot-`)."""
    words = label.split("-")
    return words[1] if words[0] == "pilot" and len(words) > 1 else words[0]


def cost_by_kind(todo: list[Todo]) -> str:
    """Where the estimate's time goes: runs, training steps and seconds (one after the other) per kind."""
    kinds: dict[str, list[float]] = {}  # kind -> [runs to train, their steps, seconds with evaluations]
    for t in todo:
        total = kinds.setdefault(run_kind(t.spec.label), [0, 0, 0.0])
        total[0] += t.train
        total[1] += t.spec.steps if t.train else 0
        total[2] += t.seconds
    ranked = sorted(kinds.items(), key=lambda kv: -kv[1][2])
    return "; ".join(f"{k} {int(r)} run(s), {int(n):,} steps, {duration(sec)}" for k, (r, n, sec) in ranked)


def run_experiment(experiment: Experiment, out: str | Path, quick: bool = False,
                   seeds: tuple[int, ...] | None = None, estimate_only: bool = False,
                   say: Callable[[str], None] | None = None,
                   assumed: dict[str, set[str]] | None = None, jobs: int = 1,
                   records: str | Path | None = None, then: Sequence[Experiment] = (),
                   pool: Pool | None = None) -> dict[str, Any] | None:
    """Run one experiment (what is not done yet), write its results.json and figures; returns the results.
    With `estimate_only`, only print the estimate (`assumed`: what earlier experiments will have done). `jobs`:
    runs trained side by side (experiments.parallel), each on its share of the cores. `records`: the folder of
    the runs' committed records (experiments.runner), read and written. `then`: the experiments to run after this
    one, whose runs take a core this one's leave idle (with jobs > 1); `pool`: the command's worker pool
    (`parallel.Pool`, shared by the experiments it runs one after the other), whose runs for `then` may go on
    after this returns."""
    say = say or (lambda line: print(line, file=sys.stdout, flush=True))
    out = Path(out)
    scale = scale_for(quick, experiment)
    seeds = tuple(seeds) if seeds else default_seeds(experiment, quick)
    runner = Runner(out, scale, records=records)  # Runner makes it a Path
    dry = estimate(experiment, runner, seeds, assumed)
    estimated = sum(t.seconds for t in dry.todo.values())
    say(describe_estimate(experiment, dry, runner, jobs))
    if estimate_only:
        return None
    started = time.perf_counter()
    progress = Progress(dict(dry.todo), experiment.name)
    try:
        if jobs > 1:
            fillers = [_filler(e, out, quick, runner.records) for e in then]
            run_parallel(lambda: estimate(experiment, runner, seeds), runner, jobs, progress, fillers, pool)
        ctx = Context(runner, seeds, dry=False, progress=progress)
        planned = experiment.plan(ctx)
    finally:
        progress.close()
    for record in ctx.records.values():  # runs trained before records were kept get theirs too
        runner.keep_record(record)
    folder = out / experiment.name
    folder.mkdir(parents=True, exist_ok=True)
    analysis = experiment.analyze(ctx, planned, folder)
    results = {
        "experiment": experiment.name, "title": experiment.title, "paper": experiment.paper,
        "finding": experiment.finding, "setup": describe_setup(experiment, scale, seeds),
        "mode": scale.name, "seeds": list(seeds), "scale": scale.to_dict(),
        "design": experiment.design.to_dict() if experiment.design else None,
        "command": command(experiment.name, quick, seeds, experiment),
        **analysis,
        "runs": [_run_entry(r, out) for r in ctx.records.values()],
        "retrained": retrained_runs(ctx.records.values()),  # runs trained twice: which numbers are the retrain's
        "estimated_seconds": round(estimated, 1), "wall_seconds": round(time.perf_counter() - started, 1),
        "run_seconds": run_seconds(ctx.records.values()),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "versions": _versions(),
    }
    write_results(folder / RESULTS, results)
    return results


def _filler(experiment: Experiment, out: Path, quick: bool, records: Path | None) -> tuple[Callable, Runner]:
    """A later experiment's dry pass (its default seeds) and runner, for `run_parallel`'s idle cores."""
    runner = Runner(out, scale_for(quick, experiment), records=records)
    seeds = default_seeds(experiment, quick)
    return (lambda: estimate(experiment, runner, seeds)), runner


def command(name: str, quick: bool, seeds: tuple[int, ...], experiment: Experiment) -> str:
    parts = [f"vitlab experiment {name}"] + (["--quick"] if quick else [])
    if seeds != default_seeds(experiment, quick):
        parts.append("--seeds " + " ".join(str(s) for s in seeds))
    return " ".join(parts)


def describe_setup(experiment: Experiment, scale: Scale, seeds: tuple[int, ...]) -> str:
    """The experiment's setup text with the scale's numbers filled in."""
    fields = {**scale.to_dict(), "seeds": len(seeds)}
    fields["per_class"] = " / ".join(f"{n:,}" for n in scale.per_class)
    fields["fewshot_data"] = " and ".join(scale.fewshot_data)
    return experiment.setup.format(**fields)


def run_seconds(records: Any) -> float:
    """What the experiment costs from nothing: the wall seconds of training and evaluating every run it reads,
    whenever (and by whichever experiment) they were computed. `wall_seconds` of an invocation says only what
    that invocation had left to do."""
    return round(sum(sum(r.result.get("wall_seconds", {}).values()) for r in records), 1)


def _run_entry(record: Any, out: Path) -> dict[str, Any]:
    s = record.spec.settings
    entry = {"key": record.spec.key, "label": record.spec.label, "dir": str(record.run_dir.relative_to(out)),
             "lr": s.get("lr"), "seed": s.get("seed"), "steps": s.get("steps"),
             "val_top1": record.result.get("train", {}).get("val", {}).get("top1"),
             "wall_seconds": record.result.get("wall_seconds", {})}
    return entry


def _versions() -> dict[str, str]:
    return {"vitlab": __version__, "torch": torch.__version__, "python": sys.version.split()[0]}


def write_results(path: Path, results: dict[str, Any]) -> None:
    """Write results.json with its checksum (`experiments.records`): an edit by hand is detected, not reported."""
    write_sealed_json(path, dict(results))


def read_results(path: Path, name: str | None = None) -> dict[str, Any] | None:
    """A results.json (of experiment `name`), its checksum and fields verified; None if there is none. A file
    that is not what vitlab wrote there raises a RecordError naming it."""
    return read_results_file(path, name)
