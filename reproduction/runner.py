"""Running an experiment's sub-runs: each in its own run directory under `<out>/_runs/`, trained in this process
through the same resolution step and training loop as `vitlab train`, finished runs found again from their
stored results, an interrupted one resumed by the trainer's --resume.

An experiment is a plan function: plain code that asks `ctx.run(spec, evals)` for the runs it needs, in order,
and `ctx.best(...)` to choose among candidates (a learning rate). The plan is executed twice: a dry pass that only
lists what is not done yet and estimates its time (printed before anything starts, and the progress bar's total),
then the real pass, which trains what is missing and returns the records the analysis reads.

A run directory holds the normal run files (config.json, metrics.jsonl, console.log, model.safetensors) and
result.json: the spec, the training outcome and every evaluation computed on it so far. A run is finished when
result.json has its training outcome; an evaluation is done when result.json has it.

Run directories do not survive a new machine; their records can. With a records folder (`vitlab experiment
--records`, committed with the results), every result.json is also written there as `<key>-<label>.json`, and a
run found only there counts as finished, with its outcome and evaluations: nothing is trained for it again unless
its weights are wanted (an evaluation it does not have yet, or a fine-tuning that starts from it still to run).
Then it is trained again from its spec; its recorded outcome and evaluations are kept and the new outcome is
stored beside them as `retrained` (the same seed and settings: a check that training is repeatable).

Both copies carry a checksum of their content and are read as untrusted input (experiments.records): an edited,
mistyped or special file is refused in one line naming it, never used as measured.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

import vitlab
from reproduction.estimate import CostModel, render_seconds
from reproduction.evals import evaluate
from reproduction.records import read_record, seal, write_sealed_json
from reproduction.spec import DESIGN_PRECISION, RunSpec
from reproduction.stopping import raise_if_stopped
from vitlab import train as training
from vitlab.files import CHECKPOINTS, METRICS, WEIGHTS, atomic_write, list_checkpoints
from vitlab.progress import duration, progress, quiet
from vitlab.runtime import cpu_name
from vitlab.train import read_metrics

RESULT = "result.json"
RUNS = "_runs"
CURVE = "curve"  # the checkpoints' weights of a run that keeps them


class Todo(NamedTuple):
    """What the dry pass found a run still needs, and its estimated seconds."""
    spec: RunSpec
    evals: list[str]
    seconds: float
    train: bool
    certain: bool = True  # noted before the dry pass guessed a choice: its settings are final (experiments.parallel)


class Interrupted(Exception):
    """A sub-run stopped on a signal with a checkpoint; running the same command again continues it."""


@dataclass
class Record:
    """A run and what is stored about it (in the dry pass: what is stored so far, `pending` if not finished)."""
    spec: RunSpec
    run_dir: Path
    result: dict[str, Any] = field(default_factory=dict)
    pending: bool = False

    @property
    def has_weights(self) -> bool:
        """Whether its final weights are on this machine (a run known from its record alone has none)."""
        return (self.run_dir / WEIGHTS).is_file()

    def retrain(self, missing: list[str], need_weights: bool) -> bool:
        """Whether a finished run must be trained again: its weights are wanted and not here (a diverged run has
        none to want)."""
        wanted = bool(missing) or need_weights
        return not self.pending and wanted and not self.has_weights and not self.result["train"].get("diverged")

    @property
    def val(self) -> dict[str, float]:
        """The final validation metrics of the training run (top1, loss, count)."""
        return self.result["train"]["val"]

    def evaluation(self, name: str) -> Any:
        return self.result["evals"][name]


CHECKPOINTS_PER_RUN = 10  # step checkpoints of a run whose spec saves only at the end


def train_spec(spec: RunSpec, run_dir: Path, init: Path | None) -> dict[str, Any]:
    """Train (or continue) one run as `vitlab train`/`vitlab finetune` would with the spec's settings as flags:
    the same resolution step, banner, config.json and loop, in this process."""
    from vitlab.train import TrainingDiverged, run  # the training loop: not imported by `vitlab --help`

    raise_if_stopped(f"training {run_dir.name}")  # SIGTERM or Ctrl-C came before (experiments.stopping)
    flags = {**spec.settings, "out": str(run_dir), "resume": "auto", "precision": DESIGN_PRECISION}
    if not flags.get("save_every") and not flags.get("eval_every"):
        # A checkpoint every tenth of the run, set here and not in the spec (whose key it would change): a
        # run killed outright (a session's end, the machine taken back) resumes from it instead of from step 0.
        # Saving moves no weight and draws no random number.
        flags["save_every"] = max(1, int(flags.get("steps", 1)) // CHECKPOINTS_PER_RUN)
    if init is not None:
        flags["init"] = str(init)
    try:
        result = run(training.resolve(spec.recipe, flags, verb=spec.verb))
    except TrainingDiverged as err:  # an outcome (a learning rate too high), recorded as one: top-1 0
        return {"diverged": str(err), "val": {"top1": 0.0}}
    if result.status != "completed":
        raise Interrupted(f"{run_dir} stopped at step {result.step} ({result.status})")
    return {"step": result.step, "val": {k: float(v) for k, v in result.metrics.items()},
            "seconds": round(result.seconds, 2), "images_per_s": round(result.images_per_s, 1),
            "val_curve": val_curve(run_dir)}


def val_curve(run_dir: Path) -> list[list[float]]:
    """[[step, val top-1]] of every evaluation during training (metrics.jsonl; its last one is the final val):
    precondition (a) reads whether pre-training was still learning."""
    path = run_dir / METRICS
    records = read_metrics(path) if path.is_file() else []
    return [[r["step"], round(float(r["top1"]), 5)] for r in records if r.get("split") == "val" and "top1" in r]


class Runner:
    """Finds, trains and evaluates runs under `<root>/_runs/`."""

    def __init__(self, root: Path, scale: Any, train: Callable[..., dict[str, Any]] | None = None,
                 records: str | Path | None = None):
        self.runs = Path(root) / RUNS
        self.records = Path(records) if records is not None else None  # the committed copies of result.json
        self.scale = scale
        self.train = train if train is not None else train_spec  # another trainer: tests
        self.cost = CostModel(scale.workers)

    def run_dir(self, spec: RunSpec) -> Path:
        """The spec's directory: an existing one with its key (whatever its label), else a new name."""
        found = sorted(self.runs.glob(f"{spec.key}-*")) if self.runs.is_dir() else []
        return found[0] if found else self.runs / spec.dirname

    def stored(self, spec: RunSpec) -> Record:
        run_dir = self.run_dir(spec)
        result = _read_result(run_dir / RESULT, spec.key)
        if "train" not in result and self.records is not None:  # finished on another machine?
            found = sorted(self.records.glob(f"{spec.key}-*.json")) if self.records.is_dir() else []
            recorded = _read_result(found[0], spec.key) if found else {}
            result = recorded if "train" in recorded else result
        return Record(spec, run_dir, result, pending="train" not in result)

    def finished(self, key: str) -> bool:
        """Whether the run with this key has been trained here, so that a fine-tuning can start from its weights
        (a run known from its record alone is trained again first: `Context`)."""
        for path in self.runs.glob(f"{key}-*/{RESULT}") if self.runs.is_dir() else ():
            return "train" in _read_result(path, key) and (path.parent / WEIGHTS).is_file()
        return False

    def todo(self, spec: RunSpec, evals: Iterable[str], need_weights: bool = False) -> tuple[bool, list[str]]:
        """(training still needed, evaluations still missing); `need_weights`: a fine-tuning will start from it."""
        record = self.stored(spec)
        done = record.result.get("evals", {})
        missing = [e for e in evals if e not in done]
        return record.pending or record.retrain(missing, need_weights), missing

    def execute(self, spec: RunSpec, evals: Iterable[str], on_done: Callable[[str], None] = lambda s: None,
                need_weights: bool = False) -> Record:
        record = self.stored(spec)
        evals = list(evals)
        missing = [name for name in evals if name not in record.result.get("evals", {})]
        again = record.retrain(missing, need_weights)
        if record.pending or again:
            init = self._init_path(spec)
            started = time.perf_counter()
            outcome = self.train(spec, record.run_dir, init)
            seconds = round(time.perf_counter() - started, 2)
            if not again:
                record.result = {"spec": spec.to_dict(), "train": outcome, "evals": {},
                                 "wall_seconds": {"train": seconds}, "machine": {"train": machine()}}
            else:  # its weights went with another machine: the recorded outcome and evaluations stay
                record.result["retrained"] = outcome
                record.result.setdefault("wall_seconds", {})["retrain"] = seconds
                record.result.setdefault("machine", {})["retrain"] = machine()
            if spec.curve:
                keep_curve_weights(record.run_dir)
            record.pending = False
            self.save(record)  # from here on the run is finished: killed before this line, it resumes
            # model.safetensors is what the evaluations read; the optimiser states are not needed any more
            shutil.rmtree(record.run_dir / CHECKPOINTS, ignore_errors=True)
            on_done("diverged" if outcome.get("diverged") else "trained again" if again else "trained")
        missing = [name for name in evals if name not in record.result["evals"]]
        if missing and record.result["train"].get("diverged"):
            raise ValueError(f"run {record.run_dir} diverged, so {', '.join(missing)} cannot be measured: "
                             f"{record.result['train']['diverged']}")
        for name in missing:
            self._evaluate(record, name)
            self.save(record)
            on_done(name)
        return record

    def save(self, record: Record) -> None:
        """Write the run's result.json, and its copy in the records folder if there is one (both sealed with the
        checksum of their content: experiments.records)."""
        self.keep_record(record, write_sealed_json(record.run_dir / RESULT, record.result))

    def keep_record(self, record: Record, text: str | None = None) -> None:
        """Write (or refresh) the run's copy in the records folder, if there is one (`text`: its JSON)."""
        if self.records is None or record.pending:
            return
        text = text if text is not None else json.dumps(seal(record.result), indent=1)
        self.records.mkdir(parents=True, exist_ok=True)
        atomic_write(self.records / f"{record.run_dir.name}.json", lambda tmp: Path(tmp).write_text(text))

    def _evaluate(self, record: Record, name: str) -> None:
        raise_if_stopped(f"evaluation {name} of {record.run_dir.name}")
        started = time.perf_counter()
        record.result["evals"][name] = evaluate(name, record.run_dir, self.scale)
        record.result.setdefault("wall_seconds", {})[name] = round(time.perf_counter() - started, 2)

    def _init_path(self, spec: RunSpec) -> Path | None:
        if spec.init is None:
            return None
        found = sorted(self.runs.glob(f"{spec.init}-*/{RESULT}"))
        if not found:
            raise ValueError(f"{spec.label} fine-tunes run {spec.init}, which has not been trained; the plan must "
                             "run it first")
        weights = found[0].parent / WEIGHTS
        if not weights.is_file():
            raise ValueError(f"{spec.label} fine-tunes {found[0].parent}, which has no final weights (it diverged, "
                             f"or it is known from its record alone: see its {RESULT})")
        return weights


def machine() -> dict[str, Any]:
    """Where a run was trained: the same spec and seed repeat bit for bit on one machine, not on another (the
    pilot's MNIST references moved by up to 3 points on a new machine), so a record says which it was."""
    return {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__}


def keep_curve_weights(run_dir: Path) -> None:
    """The weights of every kept checkpoint copied to <run>/curve/step_N.safetensors, for a transfer curve
    computed when an experiment asks for it (without the optimiser state, a third of a checkpoint's size). Copied,
    not moved: until result.json is written the checkpoints must stay intact for a resume. A sharded checkpoint
    (an FSDP run of several processes) has no weights file: its shards are read into one (`vitlab.load`)."""
    folder = run_dir / CURVE
    folder.mkdir(exist_ok=True)
    for ckpt in list_checkpoints(run_dir):
        if (ckpt / WEIGHTS).is_file():
            shutil.copyfile(ckpt / WEIGHTS, folder / f"{ckpt.name}.safetensors")
        else:
            vitlab.save(vitlab.load(ckpt), folder / f"{ckpt.name}.safetensors", force=True)


def _read_result(path: Path, key: str) -> dict[str, Any]:
    """A stored result.json (or its record) of the run with this key, its checksum, spec and values verified
    (experiments.records: anything else there is refused in one line, never used as measured); {} if none."""
    return read_record(path, key)


class Context:
    """What a plan sees: the scale, the seeds, `run` and `best`. In the dry pass nothing runs: it collects what
    is missing and its estimated seconds; records are the stored ones (pending if unfinished)."""

    def __init__(self, runner: Runner, seeds: tuple[int, ...], dry: bool, progress: Any = None,
                 assumed: Mapping[str, set[str]] | None = None):
        self.runner, self.scale, self.seeds, self.dry = runner, runner.scale, tuple(seeds), dry
        self.progress = progress
        self.assumed = assumed or {}  # dry pass: runs (and evaluations) taken as done, by earlier experiments
        self.todo: dict[str, Todo] = {}  # dry pass: what each run still needs
        self.rendered: set[str] = set()
        self.guessing = False  # dry pass: a choice was guessed, so what is noted after it may change
        self.grids: dict[str, tuple[float, list[float]]] = {}  # choice name -> (chosen value, grid searched)
        # dry pass: choice name -> (runs, seconds) its grid may still add by the extension rule, not in `todo`
        self.growth: dict[str, tuple[int, float]] = {}
        self.records: dict[str, Record] = {}
        self.specs: dict[str, RunSpec] = {}  # every spec asked for, by key: a fine-tuning run's model is its init's

    def run(self, spec: RunSpec, evals: Iterable[str] = ()) -> Record:
        evals = list(dict.fromkeys(evals))
        if self.dry:
            self._note(spec, evals)
            return self.runner.stored(spec)
        self.specs[spec.key] = spec
        if spec.key in self.records and all(e in self.records[spec.key].result["evals"] for e in evals):
            return self.records[spec.key]
        if spec.init in self.specs and self.runner.todo(spec, evals)[0]:
            self.run_for_weights(self.specs[spec.init])
        started, done = time.perf_counter(), []
        record = self.runner.execute(spec, evals, done.append)
        if done and self.progress is not None:
            if "trained" in done:
                done[done.index("trained")] = f"trained, val top-1 {100 * record.val['top1']:.1f}%"
            self.progress.done(spec, "; ".join(done), time.perf_counter() - started)
        self.records[spec.key] = record
        return record

    def run_for_weights(self, spec: RunSpec) -> None:
        """Make sure a finished run's weights are here (a run known from its record alone is trained again)."""
        started, done = time.perf_counter(), []
        record = self.runner.execute(spec, [], done.append, need_weights=True)
        if done and self.progress is not None:
            self.progress.done(spec, f"{'; '.join(done)} for its weights", time.perf_counter() - started)
        self.records[spec.key] = record

    def best(self, candidates: Mapping[Any, RunSpec], metric: str = "top1") -> Any:
        """The candidate whose run has the best final validation `metric` (a tie: the first); in the dry pass,
        before the candidates have run, the first (what the estimate needs is the same for every choice)."""
        records = {value: self.run(spec) for value, spec in candidates.items()}
        if any(r.pending for r in records.values()):
            self.guessing = self.guessing or self.dry
            return next(iter(candidates))
        return max(records, key=lambda v: (records[v].val[metric], -list(records).index(v)))

    def _costed(self, spec: RunSpec) -> RunSpec:
        """The spec with its model's settings (a fine-tuning run's come from the run it starts from)."""
        if spec.init is None or spec.init not in self.specs:
            return spec
        parent = self.specs[spec.init].settings
        model = {k: parent[k] for k in ("model", "model_args") if k in parent}
        return RunSpec(spec.label, spec.recipe, {**spec.settings, **model})

    def _note(self, spec: RunSpec, evals: list[str], need_weights: bool = False) -> None:
        self.specs[spec.key] = spec
        train, missing = self.runner.todo(spec, evals, need_weights)
        if spec.key in self.assumed:
            train, missing = False, [e for e in missing if e not in self.assumed[spec.key]]
        before = self.todo.get(spec.key)
        if before is not None:  # asked for again (maybe with more evaluations)
            train, missing = False, [e for e in missing if e not in before.evals]
        cost, costed = self.runner.cost, self._costed(spec)
        seconds = sum(cost.eval_seconds(costed, e, self.scale.curve_points) for e in missing)
        if train:
            seconds += cost.train_seconds(costed)
            data = spec.settings.get("data", "")
            if data not in self.rendered:
                self.rendered.add(data)
                seconds += render_seconds(data)
        if train or missing:
            old = before or Todo(spec, [], 0.0, False, False)
            self.todo[spec.key] = Todo(spec, old.evals + missing, old.seconds + seconds, old.train or train,
                                       old.certain or not self.guessing)
        if train and spec.init in self.specs:  # it starts from a run whose weights may be on another machine
            self._note(self.specs[spec.init], [], need_weights=True)


class Progress:
    """One bar over the estimated seconds of the whole experiment (on a terminal), and a line per finished run
    with the ETA, scaled by how the finished runs compared with their estimates."""

    def __init__(self, todo: dict[str, Todo], name: str):
        self.todo, self.quiet = todo, quiet()
        self.total = sum(t.seconds for t in todo.values())
        self.spent_estimate = 0.0
        self.started = time.perf_counter()
        self.count, self.finished = len(todo), 0
        self.bar = progress(total=max(round(self.total), 1), desc=f"experiment {name}", unit="s")

    def done(self, spec: RunSpec, what: str, seconds: float) -> None:
        entry = self._take(spec)  # None: work the estimate put on another run (before a learning rate was chosen)
        if entry is not None:
            self.finished += 1
            self.spent_estimate += entry.seconds
            self.bar.update(round(entry.seconds))
        elapsed = time.perf_counter() - self.started
        left = elapsed / self.spent_estimate * (self.total - self.spent_estimate) if self.spent_estimate else 0.0
        if not self.quiet:
            lr = spec.settings.get("lr")
            self.write(f"[{self.finished}/{self.count}] {spec.label}{f' (lr {lr:g})' if lr else ''}: {what} "
                       f"({seconds:.0f} s); about {duration(left)} left")

    def expects(self, spec: RunSpec) -> bool:
        """Whether the estimate still counts this run (else it is another experiment's, or counted already)."""
        return self._estimated(spec) is not None

    def _estimated(self, spec: RunSpec) -> str | None:
        """The key of this run's estimate: its own, or, for a run whose settings depended on a choice made after
        the estimate (a tuned learning rate), that of the estimated run with the same label."""
        if spec.key in self.todo:
            return spec.key
        return next((k for k, t in self.todo.items() if t.spec.label == spec.label), None)

    def _take(self, spec: RunSpec) -> Todo | None:
        key = self._estimated(spec)
        return self.todo.pop(key) if key is not None else None

    def write(self, line: str) -> None:
        from tqdm import tqdm

        tqdm.write(line, file=sys.stdout)

    def close(self) -> None:
        self.bar.close()
