"""What every redesigned experiment stands on: the learning-rate grid that grows at its edge
(precondition c), the dry pass telling certain runs from guessed ones (what may run side by side), runs side by
side giving what one after the other gives, few-shot on the encoder output, the pilot's decision rule, and the
report keeping only sections of the current design."""

import json
import os
import re
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from reproduction import design
from reproduction.design import DESIGNS, Check, Design, Revisions, Verdict, describe, revisions
from reproduction.estimate import CostModel, StepTime
from reproduction.experiments import experiments, pilot
from reproduction.parallel import ready
from reproduction.plans import GRID_EXTENSIONS, tuned_lr
from reproduction.preconditions import beyond_spread, helps, inside_grid, learns
from reproduction.runner import Context, Record, Runner, Todo
from reproduction.scale import QUICK
from reproduction.spec import RunSpec
from vitlab.eval.fewshot_lsr import representations
from vitlab.files.rundir import WEIGHTS
from vitlab.runtime.device import cpu_name

BASE = {"model": "ViT-Ti/4", "data": "digits", "steps": 2, "seed": 0}


@pytest.fixture(autouse=True)
def fixed_step_times(monkeypatch):
    """The dry pass estimates without timing models (a finetune-recipe ViT-Ti/4 at its 384 px would be timed)."""
    monkeypatch.setattr(CostModel, "step_time", lambda self, spec: StepTime(0.01, 0.001))


def fake_runner(tmp_path, top1_of_lr):
    """A runner whose 'training' scores a run by its learning rate."""
    def train(spec, run_dir, init):
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / WEIGHTS).touch()  # as the trainer leaves its final weights
        return {"step": spec.steps, "val": {"top1": top1_of_lr(spec.settings["lr"])}}
    return Runner(tmp_path, QUICK, train=train)


def spec_of(lr):
    return RunSpec(f"lr{lr:g}", "demo", {**BASE, "lr": lr})


def test_a_best_value_at_the_grid_edge_extends_the_grid_at_most_twice(tmp_path):
    ctx = Context(fake_runner(tmp_path, lambda lr: lr), (0,), dry=False)  # larger is always better: upper edge
    chosen = tuned_lr(ctx, "pretrain ViT-M", (1e-3, 3e-3), spec_of)
    assert ctx.grids["pretrain ViT-M"][1] == pytest.approx([1e-3, 3e-3, 9e-3, 2.7e-2])
    assert GRID_EXTENSIONS == 2 and chosen == pytest.approx(2.7e-2)
    assert inside_grid("ViT-M", chosen, ctx.grids["pretrain ViT-M"][1]).holds is False  # still at the edge: (c) fails


def test_the_estimate_states_what_undecided_grids_may_still_add(tmp_path):
    """Every grid of the full runs grew at least once, which --estimate never counted: data-scaling's estimate
    ran hours short. It now states the bound the extension rule allows, and nothing once a grid is decided."""
    from reproduction.experiment import _growth

    runner = fake_runner(tmp_path, lambda lr: 1 - abs(np.log(lr / 3e-3)) / 20)  # peak at 3e-3: inside the grid
    runner.cost = FreeCost()  # one second a run
    dry = Context(runner, (0,), dry=True)
    tuned_lr(dry, "pretrain ViT-M", (1e-3, 3e-3, 9e-3), spec_of)
    assert dry.growth == {"pretrain ViT-M": (2, 2.0)}
    assert _growth(dry).endswith("1 learning-rate grid(s) still to be decided may each grow by the extension "
                                 "rule, at most 2 more run(s), +2 s one after the other")
    tuned_lr(Context(runner, (0,), dry=False), "pretrain ViT-M", (1e-3, 3e-3, 9e-3), spec_of)  # the grid runs
    decided = Context(runner, (0,), dry=True)
    tuned_lr(decided, "pretrain ViT-M", (1e-3, 3e-3, 9e-3), spec_of)
    assert decided.growth == {} and _growth(decided) == ""
    # an earlier experiment's estimate took the grid's runs as done and counted their growth: not again
    assumed = {spec_of(lr).key: set() for lr in (1e-3, 3e-3, 9e-3)}
    later = Context(fake_runner(tmp_path / "other", lambda lr: lr), (0,), dry=True, assumed=assumed)
    later.runner.cost = FreeCost()
    tuned_lr(later, "pretrain ViT-M", (1e-3, 3e-3, 9e-3), spec_of)
    assert later.growth == {}


def test_a_best_value_inside_the_grid_is_kept_and_passes_c(tmp_path):
    ctx = Context(fake_runner(tmp_path, lambda lr: 1 - abs(np.log(lr / 3e-3)) / 20), (0,), dry=False)  # peak at 3e-3
    chosen = tuned_lr(ctx, "x", (1e-3, 3e-3, 9e-3), spec_of)
    assert chosen == pytest.approx(3e-3)
    assert ctx.grids["x"][1] == pytest.approx([1e-3, 3e-3, 9e-3])
    assert inside_grid("ViT-M", chosen, ctx.grids["x"][1]).holds is True


def test_the_lower_edge_extends_downwards(tmp_path):
    ctx = Context(fake_runner(tmp_path, lambda lr: 1 - abs(np.log(lr / 3e-4)) / 20), (0,), dry=False)  # peak at 3e-4
    assert tuned_lr(ctx, "x", (1e-3, 3e-3), spec_of) == pytest.approx(3.333e-4, rel=1e-3)
    assert ctx.grids["x"][1][0] == pytest.approx(1e-3 / 9)  # extended twice; 3.3e-4 is inside once 1.1e-4 ran


def test_the_dry_pass_marks_runs_after_a_guessed_choice_as_uncertain(tmp_path):
    runner = fake_runner(tmp_path, lambda lr: lr)
    dry = Context(runner, (0,), dry=True)
    lr = tuned_lr(dry, "x", (1e-3, 3e-3), spec_of)  # nothing has run: the choice is a guess
    dependent = RunSpec("dependent", "demo", {**BASE, "lr": lr, "seed": 5})
    dry.run(dependent)
    certain = {t.spec.label: t.certain for t in dry.todo.values()}
    assert certain == {"lr0.001": True, "lr0.003": True, "dependent": False}
    assert {t.spec.label for t in ready(dry, runner)} == {"lr0.001", "lr0.003"}


def test_a_finetuning_run_is_ready_only_once_its_init_is_trained(tmp_path):
    runner = fake_runner(tmp_path, lambda lr: lr)
    parent = spec_of(1e-3)
    child = RunSpec("child", "finetune", {**BASE, "lr": 0.01}, verb="finetune", init=parent.key)
    dry = Context(runner, (0,), dry=True)
    dry.run(parent), dry.run(child)
    assert [t.spec.label for t in ready(dry, runner)] == ["lr0.001"]
    Context(runner, (0,), dry=False).run(parent)
    dry = Context(runner, (0,), dry=True)
    dry.run(parent), dry.run(child)
    assert [t.spec.label for t in ready(dry, runner)] == ["child"]


@pytest.mark.slow
def test_runs_side_by_side_give_what_runs_one_after_the_other_give(tmp_path):
    from reproduction.experiment import Experiment, run_experiment

    tiny = {"model": "ViT-Ti/4", "model_args": {"depth": 1, "width": 32, "num_heads": 2, "mlp_dim": 64},
            "data": "digits", "image_size": 16, "batch_size": 16, "steps": 3, "eval_every": 0, "log_every": 1,
            "workers": 0, "lr": 1e-3}
    specs = [RunSpec(f"s{seed}", "demo", {**tiny, "seed": seed}) for seed in (0, 1)]

    def plan(ctx):
        return [ctx.run(s) for s in specs]

    def analyze(ctx, records, out):
        return {"tables": [], "figures": [], "measured": [json.dumps(r.val) for r in records],
                "check": {"holds": True, "rule": "none", "details": []}}

    exp = Experiment("fake", "Fake", "nowhere", "nothing", "two runs", plan, analyze, (0,))
    one = run_experiment(exp, tmp_path / "one", quick=True, say=lambda line: None, jobs=1)
    two = run_experiment(exp, tmp_path / "two", quick=True, say=lambda line: None, jobs=2)
    # the same runs; a worker's one thread sums in another order than two threads: equal to float32 rounding
    for a, b in zip(one["measured"], two["measured"], strict=True):
        a, b = json.loads(a), json.loads(b)
        assert a["top1"] == b["top1"] and a["count"] == b["count"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)


@pytest.mark.slow
def test_a_later_experiment_takes_the_core_an_earlier_one_leaves_idle(tmp_path):
    from reproduction.experiment import Experiment, run_experiment

    tiny = {"model": "ViT-Ti/4", "model_args": {"depth": 1, "width": 32, "num_heads": 2, "mlp_dim": 64},
            "data": "digits", "image_size": 16, "batch_size": 16, "steps": 3, "eval_every": 0, "log_every": 1,
            "workers": 0, "seed": 0}
    grid = {lr: RunSpec(f"grid-lr{lr:g}", "demo", {**tiny, "lr": lr}) for lr in (1e-3, 3e-3, 1e-2)}
    later = RunSpec("later", "demo", {**tiny, "lr": 1e-3, "seed": 7})

    def plan_first(ctx):  # three candidates for two cores, then a run that waits for the choice
        lr = ctx.best(grid)
        return [ctx.run(RunSpec("chosen", "demo", {**tiny, "lr": lr, "seed": 1}))]

    def plan_later(ctx):
        return [ctx.run(later)]

    def analyze(ctx, records, out):
        return {"tables": [], "figures": [], "measured": [], "check": {"holds": True, "rule": "none", "details": []}}

    first = Experiment("first", "First", "nowhere", "nothing", "a choice", plan_first, analyze, (0,))
    second = Experiment("second", "Second", "nowhere", "nothing", "one run", plan_later, analyze, (0,))
    lines = []
    run_experiment(first, tmp_path, quick=True, say=lines.append, jobs=2, then=[second])
    # the later experiment's run was trained while the first one's third candidate (or the chosen run) had a
    # core to itself; the first experiment's results were written as soon as its own runs were done
    assert Runner(tmp_path, QUICK).finished(later.key)
    assert (tmp_path / "first" / "results.json").is_file() and not (tmp_path / "second").exists()


def test_a_later_experiments_run_goes_on_while_an_earlier_one_is_written(tmp_path, monkeypatch):
    """One pool for the command: a run a later experiment started on the core an earlier one left idle is not
    waited for at the hand-over (that cost up to a run's length of one idle core each time); the later experiment
    then takes it over instead of training it again."""
    from concurrent.futures import ThreadPoolExecutor

    from reproduction import parallel
    from reproduction.experiment import Experiment, run_experiment

    released, trained = threading.Event(), []

    def train(spec, run_dir, init):  # a stand-in trainer; the later experiment's run goes on until released
        if spec.label == "later":
            assert released.wait(60)
        trained.append(spec.label)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / WEIGHTS).touch()
        return {"step": spec.steps, "val": {"top1": spec.settings["lr"]}}

    # a worker returns a moment after its run's result is written, so a dry pass can see a run finished whose
    # worker is still busy (seen once in 11 runs: the first experiment returned with 'chosen' still in flight and
    # never started 'later'); these pauses make that timing certain: both grid results are written before the
    # first worker returns, and 'chosen' is written long before its worker returns
    pause = {"lr0.001": 0.2, "lr0.003": 1.0, "chosen": 1.0}

    def execute(root, scale, records, todo):  # a worker, as parallel._execute, with the stand-in trainer
        Runner(Path(root), scale, records=records, train=train).execute(todo.spec, todo.evals,
                                                                        need_weights=todo.train)
        time.sleep(pause.get(todo.spec.label, 0.0))
        return "trained", 0.0

    monkeypatch.setattr(parallel, "_execute", execute)
    grid = {lr: spec_of(lr) for lr in (1e-3, 3e-3)}
    later = RunSpec("later", "demo", {**BASE, "lr": 1e-3, "seed": 7})

    def plan_first(ctx):  # two candidates, then a run that waits for the choice: a core left idle
        return [ctx.run(RunSpec("chosen", "demo", {**BASE, "lr": ctx.best(grid), "seed": 1}))]

    def analyze(ctx, records, out):
        return {"tables": [], "figures": [], "measured": [f"{r.spec.label} {r.val['top1']:g}" for r in records],
                "check": {"holds": True, "rule": "none", "details": []}}

    first = Experiment("first", "First", "nowhere", "nothing", "a choice", plan_first, analyze, (0,))
    second = Experiment("second", "Second", "nowhere", "nothing", "one run", lambda ctx: [ctx.run(later)],
                        analyze, (0,))
    quiet = {"quick": True, "say": lambda line: None, "jobs": 2}
    with parallel.Pool(2, ThreadPoolExecutor(2)) as pool:
        written = run_experiment(first, tmp_path, then=[second], pool=pool, **quiet)
        # the first experiment is written while the later experiment's run is still in flight
        assert written["measured"] == ["chosen 0.003"] and (tmp_path / "first" / "results.json").is_file()
        assert "later" not in trained and pool.in_flight() == {later.key}
        released.set()
        results = run_experiment(second, tmp_path, pool=pool, **quiet)
    assert results["measured"] == ["later 0.001"] and trained.count("later") == 1


def test_encoder_features_are_the_pooled_tokens_before_the_representation_layer():
    from vitlab import create_model

    torch.manual_seed(0)
    model = create_model("ViT-Ti/4", image_size=16, num_classes=3, depth=1, width=32, num_heads=2, mlp_dim=64,
                         representation_size=32).eval()
    x = torch.randn(4, 3, 16, 16)
    batches = [(x, torch.zeros(4, dtype=torch.long))]
    encoder, _ = representations(model, batches, "encoder")
    pre_logits, _ = representations(model, batches, "pre_logits")
    with torch.no_grad():
        tokens = model.forward_features(x)[:, 0]  # the class token after the final LayerNorm
        expected_pre = torch.tanh(model.pre_logits[0](tokens))
    np.testing.assert_allclose(encoder, tokens.double().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(pre_logits, expected_pre.double().numpy(), rtol=1e-6, atol=1e-7)
    assert model.pre_logits is not None  # put back after reading past it
    with pytest.raises(ValueError, match="unknown representation"):
        representations(model, batches, "logits")


# --- the pilot's rules on hand-made runs ---------------------------------------------------------------------------
def record(top1, curve=None, fewshot=None, seconds=100.0):
    result = {"train": {"val": {"top1": top1 / 100}, "val_curve": curve or [[1, top1 / 100]]},
              "evals": {f"{k}/mnist": {"accuracy": {"10": {"mean": v / 100}, "25": {"mean": v / 100}}}
                        for k, v in (fewshot or {"fewshot": 30, "fewshot-encoder": 30}).items()},
              "wall_seconds": {"train": seconds}}
    return Record(RunSpec("r", "demo", {}), None, result)


def pilot_runs(pre_top1, ft, scratch_half, scratch, curve=None):
    scale = types.SimpleNamespace(finetune_steps=100, fewshot_data=("mnist",), shots=(10, 25))
    runs = {("init", "ViT"): record(10), ("scratch", "ViT", 50): record(scratch_half),
            ("scratch", "ViT", 100): record(scratch), ("pre", "strokes", "ViT"): record(pre_top1, curve),
            ("ft", "strokes", "ViT"): record(ft), "finetune_steps": 100}
    return scale, runs


def test_pilot_preconditions_hold_for_a_run_that_learnt_and_helps():
    scale, runs = pilot_runs(60, 80, 69.5, 70)
    row = pilot.preconditions(scale, runs, "strokes", "ViT")
    assert (row["a"], row["b"], row["finetune_margin"]) == ("holds", "holds", 10.0)


def test_pilot_a_fails_below_the_threshold_or_after_a_fall():
    scale, runs = pilot_runs(45, 80, 69.5, 70)
    assert pilot.preconditions(scale, runs, "strokes", "ViT")["a"] == "does not hold"
    scale, runs = pilot_runs(60, 80, 69.5, 70, curve=[[1, 0.70], [2, 0.60]])  # fell 10 points from its best
    assert pilot.preconditions(scale, runs, "strokes", "ViT")["a"] == "does not hold"


def test_pilot_b_is_inconclusive_when_the_reference_has_not_saturated():
    scale, runs = pilot_runs(60, 80, 47.4, 59.6)  # the measured ViT-M MNIST references at 750 and 1,500 steps
    assert pilot.preconditions(scale, runs, "strokes", "ViT")["b"] == "inconclusive"
    scale, runs = pilot_runs(60, 70.5, 69.5, 70)
    assert pilot.preconditions(scale, runs, "strokes", "ViT")["b"] == "does not hold"


class ReferenceRuns:
    """A plan's context whose from-scratch MNIST references reach the given top-1 per (family, steps)."""

    def __init__(self, top1, pending=()):
        self.scale = types.SimpleNamespace(finetune_steps=1500, finetune_data=("mnist",), image_size=32,
                                           batch_size=64, lrs=(1e-3,), workers=None)
        self.top1, self.pending, self.dry, self.guessing, self.asked = top1, pending, False, False, []

    def run(self, spec, evals=()):
        family, steps = spec.settings["model"].split("-")[0], spec.settings["steps"]
        self.asked.append((family, steps))
        return Record(spec, None, {"train": {"val": {"top1": self.top1.get((family, steps), 0) / 100}}},
                      pending=(family, steps) in self.pending)


def test_pilot_v2_doubles_the_fine_tuning_schedule_until_both_references_saturate():
    measured = {("ViT", 750): 47.4, ("ViT", 1500): 59.6, ("BiT", 750): 89.6, ("BiT", 1500): 96.9,  # this pilot's
                ("ViT", 3000): 70.0, ("BiT", 3000): 97.5, ("ViT", 6000): 71.0, ("BiT", 6000): 97.6}
    steps, tried = pilot.reference_steps(ReferenceRuns(measured))
    assert steps == 6000 and [t["steps"] for t in tried] == [1500, 3000, 6000]
    assert tried[0]["gain_from_half"] == {"ViT": 12.2, "BiT": 7.3} and tried[2]["gain_from_half"]["ViT"] == 1.0
    saturated = {**measured, ("ViT", 3000): 60.0, ("BiT", 3000): 97.0}  # both within 1.5 points at 3,000
    assert pilot.reference_steps(ReferenceRuns(saturated))[0] == 3000
    never = {**measured, ("ViT", 6000): 80.0}  # still +10 at the cap: the last length, (b) then inconclusive
    assert pilot.reference_steps(ReferenceRuns(never))[0] == 6000
    ctx = ReferenceRuns(measured, pending={("ViT", 3000)})  # a dry pass before the 3,000-step runs finished
    ctx.dry = True
    assert pilot.reference_steps(ctx) == (3000, [tried[0]]) and ctx.guessing


class FreeCost:
    def train_seconds(self, spec):
        return 1.0

    def eval_seconds(self, *args):
        return 1.0


def test_pilot_ablation_runs_beside_the_reference_search_it_does_not_depend_on(tmp_path, monkeypatch):
    """Nothing has run: the fine-tuning length is a guess, so the fine-tunings wait; the ablation needs no choice
    and is ready to start on a core the search leaves idle (this session's pilot left one idle for 7 minutes)."""
    from reproduction import runner as runner_module
    monkeypatch.setattr(runner_module, "render_seconds", lambda data: 0.0)
    runner = Runner(tmp_path, pilot.PILOT_QUICK)
    runner.cost = FreeCost()
    dry = Context(runner, (0,), dry=True)
    pilot.plan(dry)
    certain = {t.spec.label: t.certain for t in dry.todo.values()}
    ablation = [label for label in certain if "-ablation" in label]
    finetunings = [label for label in certain if label.startswith("pilot-ft-")]
    # "both" is PRETRAIN_SMALL itself: the same key as each source's pre-training run, noted once, before the search
    assert len(ablation) == len(pilot.SOURCES) * (len(pilot.ABLATION) - 1) and all(certain[a] for a in ablation)
    assert finetunings and not any(certain[f] for f in finetunings)
    assert list(certain).index(ablation[0]) > max(list(certain).index(f) for f in finetunings)  # the search first


def test_pilot_fine_tuning_and_its_reference_differ_only_in_the_initialisation_on_10_images_per_class():
    parent = pilot.pretrain_run(pilot.PILOT, "strokes", "ViT")
    scratch, tuned = (pilot.finetune_run(pilot.PILOT, p, "ViT", 1500) for p in (None, parent))
    assert scratch.recipe == tuned.recipe == "pretrain-i1k" and tuned.init == parent.key and scratch.init is None
    assert {k: v for k, v in scratch.settings.items() if k not in ("model", "model_args")} == dict(tuned.settings)
    assert (tuned.settings["data"], tuned.settings["lr"]) == ("mnist:10", parent.settings["lr"])  # version 4
    assert tuned.settings["weight_decay"] == 0.05 and tuned.settings["flip"] is False  # PRETRAIN_SMALL, digits


def test_experiments_fine_tune_at_the_pretraining_lr_and_train_the_reference_as_long_as_it_needs():
    from reproduction import plans
    from reproduction.scale import FULL

    parent = plans.pretrain(FULL, "ViT", "M", FULL.largest, 3e-3, 1)
    tuned = plans.finetune(FULL, parent, 1)
    reference = plans.finetune(FULL, None, 1, scratch=("ViT", "M"), lr=3e-3)
    assert (tuned.settings["lr"], tuned.steps, tuned.init) == (3e-3, FULL.finetune_steps, parent.key)
    assert (reference.settings["lr"], reference.steps, reference.init) == (3e-3, FULL.reference_steps, None)
    assert FULL.reference_steps >= FULL.finetune_steps  # never a shorter reference: (b) favours the reference
    assert tuned.recipe == reference.recipe and tuned.settings["data"] == reference.settings["data"] == "mnist:10"


def test_pilot_chooses_the_cheapest_source_meeting_both_and_none_otherwise():
    row = {"a": "holds", "b": "holds"}
    rows = [{**row, "source": "fractal", "pretrain_seconds": 900},
            {**row, "source": "strokes", "pretrain_seconds": 500},
            {**row, "source": "fonts", "pretrain_seconds": 100, "b": "inconclusive"}]
    assert pilot.choose(rows)["source"] == "strokes"  # fonts is cheaper but did not meet (b)
    assert pilot.choose([{**r, "b": "does not hold"} for r in rows])["source"] is None


def test_pilot_v4_falls_back_to_the_cheapest_source_that_both_families_learnt_when_none_meets_b():
    rows = [{"source": s, "family": f, "a": "holds", "b": "does not hold", "pretrain_seconds": cost}
            for s, cost in (("fractal", 900), ("strokes", 500), ("fonts", 100)) for f in ("ViT", "BiT")]
    rows[5]["a"] = "does not hold"  # the BiT did not learn fonts, the cheapest: strokes is the fallback
    chosen = pilot.choose(rows)
    assert (chosen["source"], chosen["fallback"]) == (None, "strokes")
    assert chosen["costs_s"] == {"fractal": 1800, "strokes": 1000, "fonts": 200}
    assert pilot.choose([{**r, "a": "does not hold"} for r in rows])["fallback"] is None
    assert pilot.choose([{**r, "b": "holds"} for r in rows[:4]])["fallback"] is None  # chosen: no fallback


# --- verdicts and the report ----------------------------------------------------------------------------------------
def test_a_failed_precondition_makes_the_verdict_inconclusive_never_does_not_hold():
    failed = learns("GAP at 65,536 images", 4.1)
    verdict = Verdict(False, "token − GAP: +30 points", [failed, helps("ViT", 40, 30)])
    assert verdict.state == "inconclusive: precondition (a) failed (GAP at 65,536 images: 4.1 % upstream top-1 " \
                            "(threshold 50 %))"
    assert Verdict(False, "x", [learns("ViT", 60)]).state == "does not hold"
    assert Verdict(True, "x", [learns("ViT", 60)], trivial="uniform attention").state == "holds trivially"


def test_spread_check_on_closed_form_numbers():
    a = {"mean": 10.0, "std": 1.0, "n": 3}
    b = {"mean": 7.0, "std": 1.0, "n": 3}  # standard error sqrt(2/3) = 0.816: 3 points is 3.7 of them
    assert beyond_spread("gap", a, b).holds is True
    assert beyond_spread("gap", a, {**b, "mean": 8.5}).holds is False  # 1.5 < 2 × 0.816
    assert beyond_spread("gap", {**a, "n": 1}, b).holds is None


def test_report_drops_a_measured_section_of_another_design(tmp_path, monkeypatch):
    from reproduction.report import report

    old = "## 1. data-scaling: Pre-training data size (paper x)\n\nmeasured\n<!-- /section:data-scaling -->\n"
    experiment = types.SimpleNamespace(design=Design(2, "q", "p", "r", {}))
    row = "| data-scaling | x | does not hold | 90 min |"
    assert report._measured_section(f"{row}\n{old}", 1, "data-scaling", experiment) is None  # no design marker
    marked = old.replace("measured\n", "<!-- design:data-scaling v2 -->\nmeasured\n")
    assert report._measured_section(f"{row}\n{marked}", 1, "data-scaling", experiment) == (marked, row)
    assert "version 2" in describe(experiment.design)
    (tmp_path / "out").mkdir()
    path = tmp_path / "REPRODUCTION.md"
    path.write_text(f"{report.MARK}\n{row}\n{old}")  # a report vitlab wrote: it may replace it
    with pytest.raises(ValueError, match="no full results"):
        report.write_report(tmp_path / "out", path)
    report.write_report(tmp_path / "out", path, allow_pending=True)
    text = path.read_text()
    current = report.experiments()["data-scaling"].design.version  # the pending section shows today's design
    assert text.count("**Verdict: pending.**") == 7 and f"<!-- design:data-scaling v{current} -->" in text
    assert json.dumps(Check("a", "w", "v", True).to_dict())


# --- the designs' versions and changes are data: the experiments' design files ------------------------------------
def test_every_design_takes_its_version_and_changes_from_its_design_file():
    shared = {c["version"]: f"version {c['version']} ({c['when']}): {c['text']}"
              for c in json.loads((DESIGNS / "shared.design.json").read_text())["changes"]}
    for name, experiment in experiments().items():
        written = revisions(name)
        assert (experiment.design.version, experiment.design.changes) == (written.version, written.changes), name
        assert (DESIGNS / f"{name.replace('-', '_')}.design.json").is_file()
    # a revision several designs made is worded once, each design adding what it changed there
    assert revisions("mpp").changes == (f"{shared[3]}; here: three seeds instead of five.", f"{shared[4]}.")
    assert pilot.PAPER == revisions("pilot").paper and revisions("compute").paper == ""


def test_a_design_file_is_read_only_when_its_changes_rise_to_its_version(tmp_path, monkeypatch):
    monkeypatch.setattr(design, "DESIGNS", tmp_path)
    shared = {"changes": [{"version": 3, "when": "d", "text": "x"}]}
    (tmp_path / "shared.design.json").write_text(json.dumps(shared))

    def write(**content):
        (tmp_path / "pos_embed.design.json").write_text(json.dumps({"experiment": "pos-embed", **content}))

    write(version=4, changes=[{"text": "a candidate added."}, {"version": 3, "shared": True, "here": "y"},
                              {"version": 4, "when": "d, none read", "text": "z."}])
    assert revisions("pos-embed") == Revisions(4, ("a candidate added.", "version 3 (d): x; here: y.",
                                                   "version 4 (d, none read): z."))
    for content, refusal in (
        ({"version": 5, "changes": [{"version": 3, "shared": True}]}, "must rise to the design's version, 5"),
        ({"version": 3, "changes": [{"version": 3, "shared": True}, {"version": 3, "when": "d", "text": "z."}]},
         "must rise"),
        ({"version": 3, "changes": [{"version": 3, "text": "z."}]}, "is not"),  # when it was made: not said
        ({"version": 4, "changes": [{"version": 4, "shared": True}]}, "does not hold"),
        ({"version": 3, "changes": [{"version": 3, "when": "d", "text": "z.", "date": "d"}]}, "is not"),
        ({"version": "3"}, "not a whole number"),
        ({"version": 3, "dated": "d"}, "not an object of the fields"),
    ):
        write(**content)
        with pytest.raises(ValueError, match=refusal):
            revisions("pos-embed")
    (tmp_path / "mpp.design.json").write_text(json.dumps({"experiment": "pos-embed", "version": 1}))
    with pytest.raises(ValueError, match="design file of 'pos-embed', not of 'mpp'"):
        revisions("mpp")
    (tmp_path / "pos_embed.design.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        revisions("pos-embed")
    with pytest.raises(ValueError, match="is missing"):
        revisions("compute")


def test_no_module_of_the_campaign_spells_a_date():
    """The dated prose of the designs (when each change was made) is in their design files, not in Python."""
    root = DESIGNS.parent
    dated = [f"{path.relative_to(root)}:{number}" for path in sorted(root.rglob("*.py"))
             if "tests" not in path.relative_to(root).parts
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert dated == []


def test_the_campaigns_code_and_tests_say_what_they_guarantee_not_which_issue_asked():
    root = DESIGNS.parent
    cited = [f"{path.relative_to(root)}:{number}" for path in sorted(root.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\bissues? \d", line, re.I)]
    assert cited == []


# --- a worker dies with its experiment process --------------------------------------------------------------------
ORPHAN_SCRIPT = """
import multiprocessing, os, sys, time
from concurrent.futures import ProcessPoolExecutor
from reproduction import parallel

if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=parallel._start_worker, initargs=(1, os.getpid()))
    print(pool.submit(os.getpid).result(), flush=True)
    pool.submit(time.sleep, 600)  # a run in progress
    time.sleep(1)
    os._exit(0)  # the experiment process dies without shutting its pool down (kill -9, a crash)
"""


# A run that stops on SIGTERM and returns, as the trainer does (a checkpoint, then out of its loop): the worker must
# not then sit idle waiting for work from its dead parent (the watch's grace is 600 s; the test waits a minute).
STOPPING_RUN_SCRIPT = """
import multiprocessing, os, signal, sys, time
from concurrent.futures import ProcessPoolExecutor
from reproduction import parallel


def a_run():
    stopped = []
    previous = signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    with parallel._busy():
        while not stopped:
            time.sleep(0.05)
        time.sleep(0.5)  # saving its checkpoint
    signal.signal(signal.SIGTERM, previous)
    return "stopped"


if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=parallel._start_worker, initargs=(1, os.getpid()))
    print(pool.submit(os.getpid).result(), flush=True)
    pool.submit(a_run)
    time.sleep(1)
    os._exit(0)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc")
@pytest.mark.parametrize("script_text", [ORPHAN_SCRIPT, STOPPING_RUN_SCRIPT], ids=["idle-or-sleeping", "run-stops"])
def test_a_parallel_worker_stops_when_its_experiment_process_dies(tmp_path, script_text):
    script = tmp_path / "orphan.py"
    script.write_text(script_text)
    checkout = str(Path(__file__).resolve().parents[2])  # the script imports `reproduction` from the checkout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [checkout, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    worker = int(out.stdout.split()[0])
    for _ in range(600):  # the watch polls every second; up to a minute on a loaded machine
        if not _alive(worker):
            break
        time.sleep(0.1)
    else:
        os.kill(worker, 9)
        pytest.fail(f"worker {worker} outlived its experiment process")


def test_the_estimate_says_where_its_time_goes_by_kind_of_run():
    from reproduction.experiment import cost_by_kind, run_kind
    labels = ("pre-ViT-M-strokes:64:16-s0", "ft-mnist-pre-BiT-M-x-s1", "scratch-ViT-M-mnist:10-s0",
              "pilot-pre-ViT-M-fonts:64:1024", "pilot-init-BiT-M", "mpp-ViT-M-x-s0")
    assert [run_kind(x) for x in labels] == ["pre", "ft", "scratch", "pre", "init", "mpp"]
    todo = [Todo(RunSpec("pre-a-s0", "pretrain-i1k", {"steps": 3600}), [], 1200.0, True),
            Todo(RunSpec("pre-b-s0", "pretrain-i1k", {"steps": 3600}), ["fewshot/mnist"], 1300.0, True),
            Todo(RunSpec("ft-c-s0", "finetune", {"steps": 3000}), [], 900.0, True),
            Todo(RunSpec("ft-d-s0", "finetune", {"steps": 3000}), ["fewshot/mnist"], 30.0, False)]  # trained already
    # 2,500 s of pre-training; 900 s of fine-tuning plus the 30 s evaluation of a run already trained
    assert cost_by_kind(todo) == "pre 2 run(s), 7,200 steps, 42 min; ft 1 run(s), 3,000 steps, 16 min"


def test_the_full_experiments_pre_train_their_source_with_the_recipe_the_pilots_ablation_chose():
    import dataclasses

    from reproduction import plans
    from reproduction.recipes import ABLATION, PRETRAIN_SMALL

    paper = dataclasses.replace(QUICK, recipe="paper i1k")
    source = plans.pretrain(paper, "ViT", "M", paper.largest, 1e-3, 0).settings
    assert (source["crop_scale"], source["dropout"], source["weight_decay"]) == ([0.05, 1.0], 0.1, 0.3)
    digits = plans.pretrain(paper, "ViT", "M", "digits", 1e-3, 0).settings  # the target keeps its own crops
    assert (digits["crop_scale"], digits["weight_decay"]) == ([0.5, 1.0], PRETRAIN_SMALL["weight_decay"])
    default = plans.pretrain(QUICK, "ViT", "M", QUICK.largest, 1e-3, 0).settings
    assert ABLATION[QUICK.recipe] == {} and default["crop_scale"] == PRETRAIN_SMALL["crop_scale"]


# --- runs recorded on another machine (the committed records folder) ---------------------------------------------
def recording_runner(root, records, calls, monkeypatch):
    """A runner with a records folder whose training counts its calls and whose evaluations say whether the
    run's weights were there to evaluate."""
    import reproduction.runner as runner_module

    def train(spec, run_dir, init):
        calls.append(spec.label)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / WEIGHTS).touch()
        return {"step": spec.steps, "val": {"top1": 0.5}}

    monkeypatch.setattr(runner_module, "evaluate",
                        lambda name, run_dir, scale: {"weights here": (run_dir / WEIGHTS).is_file()})
    monkeypatch.setattr(runner_module, "train_spec", train)  # what a worker's own Runner trains with
    return Runner(root, QUICK, records=records)


PARENT = spec_of(1e-3)
CHILD = RunSpec("child", "finetune", {**BASE, "lr": 0.01}, verb="finetune", init=PARENT.key)


def test_a_run_recorded_on_another_machine_is_not_trained_again(tmp_path, monkeypatch):
    calls = []
    first = recording_runner(tmp_path / "first", tmp_path / "records", calls, monkeypatch)
    ctx = Context(first, (0,), dry=False)
    trained = ctx.run(PARENT, ["e1"]).result, ctx.run(CHILD).result
    assert calls == ["lr0.001", "child"] and len(list((tmp_path / "records").glob("*.json"))) == 2
    # a new machine: no run directories, the same records
    second = recording_runner(tmp_path / "second", tmp_path / "records", calls, monkeypatch)
    dry = Context(second, (0,), dry=True)
    dry.run(PARENT, ["e1"]), dry.run(CHILD)
    assert dry.todo == {}
    ctx = Context(second, (0,), dry=False)
    assert (ctx.run(PARENT, ["e1"]).result, ctx.run(CHILD).result) == trained
    assert calls == ["lr0.001", "child"] and not (tmp_path / "second" / "_runs").exists()


def test_a_recorded_run_is_trained_again_only_when_its_weights_are_wanted(tmp_path, monkeypatch):
    calls = []
    first = recording_runner(tmp_path / "first", tmp_path / "records", calls, monkeypatch)
    Context(first, (0,), dry=False).run(PARENT, ["e1"])
    recorded = first.stored(PARENT).result
    # a new machine, where the fine-tuning from it is still to run: the parent is trained again, first
    second = recording_runner(tmp_path / "second", tmp_path / "records", calls, monkeypatch)
    dry = Context(second, (0,), dry=True)
    dry.run(PARENT, ["e1"]), dry.run(CHILD)
    assert {t.spec.label: t.train for t in dry.todo.values()} == {"child": True, "lr0.001": True}
    assert [t.spec.label for t in ready(dry, second)] == ["lr0.001"]  # the child waits for its weights
    ctx = Context(second, (0,), dry=False)
    ctx.run(PARENT, ["e1"])
    assert calls == ["lr0.001"]  # its recorded evaluation needs no weights
    ctx.run(CHILD)
    assert calls == ["lr0.001", "lr0.001", "child"]
    again = second.stored(PARENT).result
    assert again["train"] == recorded["train"] and again["evals"] == recorded["evals"]  # the record's, kept
    assert again["retrained"] == {"step": 2, "val": {"top1": 0.5}}  # beside it: the repeat's outcome
    # and where each was trained: runs repeat bit for bit on one machine only, so a record names it
    assert set(again["machine"]) == {"train", "retrain"} and again["machine"]["train"] == recorded["machine"]["train"]
    assert again["machine"]["retrain"]["cpu"] == cpu_name() and again["machine"]["retrain"]["threads"] >= 1
    record = json.loads(next((tmp_path / "records").glob(f"{PARENT.key}-*.json")).read_text())
    assert record == again
    # a third machine asks for an evaluation the record lacks: trained again once, the old evaluation kept
    third = recording_runner(tmp_path / "third", tmp_path / "records", calls, monkeypatch)
    evals = Context(third, (0,), dry=False).run(PARENT, ["e1", "e2"]).result["evals"]
    assert calls[3:] == ["lr0.001"] and evals == {"e1": {"weights here": True}, "e2": {"weights here": True}}


def test_a_worker_trains_a_recorded_run_again_when_the_dry_pass_wants_its_weights(tmp_path, monkeypatch):
    from reproduction.parallel import _execute

    calls = []
    Context(recording_runner(tmp_path / "first", tmp_path / "records", calls, monkeypatch), (0,), dry=False).run(
        PARENT)
    second = recording_runner(tmp_path / "second", tmp_path / "records", calls, monkeypatch)
    dry = Context(second, (0,), dry=True)
    dry.run(PARENT), dry.run(CHILD)
    (todo,) = ready(dry, second)
    what, _ = _execute(str(tmp_path / "second"), QUICK, tmp_path / "records", todo)
    assert what == "trained again" and calls == ["lr0.001", "lr0.001"] and second.finished(PARENT.key)


def _pilot_rows():
    """The pilot's version-4 measurements (results.json): the ViT-M's reference unsaturated, the BiT-M's saturated."""
    rows = []
    for source, vit_margin, bit_margin, cost in (("fractal", 9.7, -0.3, 900), ("strokes", 10.5, 1.0, 950),
                                                 ("fonts", 7.8, 2.4, 700)):
        rows.append({"source": source, "family": "ViT", "a": "holds", "b": "inconclusive", "scratch_half": 67.0,
                     "scratch": 73.0, "reference_saturated": False, "reference_steps": 6000,
                     "finetune_margin": vit_margin, "pretrain_seconds": cost})
        rows.append({"source": source, "family": "BiT", "a": "holds", "b": "holds" if bit_margin >= 2 else
                     "does not hold", "scratch_half": 87.0, "scratch": 87.4, "reference_saturated": True,
                     "reference_steps": 6000, "finetune_margin": bit_margin, "pretrain_seconds": cost})
    return rows


def test_the_pilots_decision_says_what_failed_by_how_much_and_the_fallback():
    rows = _pilot_rows()
    text = pilot.decision(rows, pilot.choose(rows))
    assert text.startswith("no source chosen: ")
    assert "ViT (b) inconclusive on every source (its from-scratch reference still gained +6.0 points from 3,000 " \
           "to 6,000 steps, allowance 1.5)" in text
    assert "BiT (b) holds on fonts only (fine-tuned minus from scratch: fractal -0.3, strokes +1.0, fonts +2.4; " \
           "needs +2)" in text
    assert text.endswith("fallback: fonts, the cheapest source both families learnt (1,400 s of pre-training); "
                         "every verdict resting on transfer is inconclusive: (b) failed")
    assert "does not hold" not in text and "holds here" not in text
    vit_only = [{**r, "reference_saturated": True, "b": "holds" if r["family"] == "ViT" else "does not hold"}
                for r in rows]
    text = pilot.decision(vit_only, pilot.choose(vit_only))
    assert "ViT (b) holds on every source (fine-tuned minus from scratch: fractal +9.7" in text
    assert "BiT (b) holds on no source (fine-tuned minus from scratch: fractal -0.3" in text
    passing = [{**r, "b": "holds", "reference_saturated": True} for r in rows]
    assert pilot.decision(passing, pilot.choose(passing)) == ("source: fonts, which meets (a) and (b) for both "
                                                              "families at the lowest cost (1400 s of pre-training)")


def test_the_pilots_report_states_its_decision_never_a_verdict_on_the_paper(tmp_path, capsys):
    """The pilot tests no finding: its summary row and section said 'does not hold' and 'the paper's ordering does
    not hold by the rule: a source meets (a) and (b)', which a skimming reader reads as the opposite of the data."""
    from reproduction.cli import print_summary
    from reproduction.report.report import _measured, _summary_row

    rows = _pilot_rows()
    results = {"experiment": "pilot", "paper": pilot.PAPER, "mode": "full", "seeds": [0], "wall_seconds": 60.0,
               "setup": "S.", "command": "vitlab experiment pilot", "finished": "now", "tables": [],
               "figures": [], "versions": {"vitlab": "0", "torch": "0"}, "measured": ["m"],
               "decision": pilot.decision(rows, pilot.choose(rows)),
               "check": {"holds": False, "rule": "a source meets (a) and (b) for ViT and BiT", "details": []}}
    row = _summary_row("pilot", results, pilot.PAPER)
    section = "\n".join(_measured(results, []))
    print_summary(results, tmp_path)
    printed = capsys.readouterr().out
    for text in (row, section, printed):
        assert "no source chosen: ViT (b) inconclusive" in text and "fallback: fonts" in text
        assert "does not hold" not in text and "ordering" not in text


def test_the_console_summary_of_a_verdict_says_its_state_never_does_not_hold_when_inconclusive(tmp_path, capsys):
    """data-scaling's full run printed 'the paper's ordering does not hold here by the rule' beside a report
    that said 'inconclusive: precondition (d) failed'."""
    from reproduction.cli import print_summary
    from reproduction.design import Check, Verdict

    verdict = Verdict(False, "ViT − BiT gap -26.1 points at 1,024 images", [Check("d", "slope", "+0.3, SE 0.3", False)])
    results = {"experiment": "data-scaling", "paper": "Section 4.2", "mode": "full", "seeds": [0, 1, 2],
               "wall_seconds": 1.0, "measured": [], "figures": [], "verdict": verdict.to_dict(),
               "check": {"holds": False, "rule": "the rule", "details": []}}
    print_summary(results, tmp_path)
    printed = capsys.readouterr().out
    assert "verdict: inconclusive: precondition (d) failed (slope: +0.3, SE 0.3): ViT − BiT gap -26.1" in printed
    assert "does not hold" not in printed
