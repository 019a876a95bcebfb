"""`vitlab experiment`: the runner (finished runs are not redone, an interrupted one resumes), the stored results,
REPRODUCTION.md written from them, shared runs between experiments, and (slow) every experiment end to end in
--quick mode."""

import json
import time

import pytest

from vitlab.cli import main
from vitlab.experiments import NAMES, experiments, run_experiment
from vitlab.experiments.estimate import CostModel, StepTime
from vitlab.experiments.experiment import Experiment
from vitlab.experiments.families import MODELS, model_table
from vitlab.experiments.plans import pretrain
from vitlab.experiments.runner import Context, Runner
from vitlab.experiments.scale import FULL, QUICK
from vitlab.experiments.spec import RunSpec

TINY = {"model": "ViT-Ti/4", "model_args": {"depth": 1, "width": 32, "num_heads": 2, "mlp_dim": 64},
        "data": "digits", "image_size": 16, "batch_size": 16, "steps": 4, "eval_every": 0, "log_every": 1,
        "workers": 0, "train_crop": "inception-subpixel", "crop_scale": [0.5, 1.0], "flip": False}


@pytest.fixture
def fixed_step_times(monkeypatch):
    """Estimates without timing models: every step 0.01 s, every image 0.001 s."""
    monkeypatch.setattr(CostModel, "step_time", lambda self, spec: StepTime(0.01, 0.001))


def fake_experiment(specs, name="fake"):
    """An experiment of the given runs whose analysis reports their validation accuracies."""
    def plan(ctx):
        return [ctx.run(s) for s in specs]

    def analyze(ctx, records, out):
        return {"tables": [{"title": "t", "columns": ["run", "top-1"], "rows": [[r.spec.label, r.val["top1"]]
                                                                              for r in records]}],
                "figures": [], "measured": [f"{r.spec.label}: {r.val['top1']}" for r in records],
                "check": {"holds": True, "rule": "none", "details": []}}

    return Experiment(name, "Fake", "nowhere", "nothing", "two runs", plan, analyze, (0,))


def counting_trainer(calls, fail_on=None, seconds=0.0):
    from vitlab.experiments.runner import Interrupted

    def train(spec, run_dir, init):
        calls.append(spec.label)
        time.sleep(seconds)
        if spec.label == fail_on:
            run_dir.mkdir(parents=True, exist_ok=True)
            raise Interrupted(f"{run_dir} stopped")  # as the trainer stops on SIGTERM or Ctrl-C
        run_dir.mkdir(parents=True, exist_ok=True)
        return {"step": spec.steps, "val": {"top1": 0.1 * len(calls)}, "seconds": 0.0, "images_per_s": 0.0}
    return train


def test_second_invocation_trains_nothing(tmp_path, monkeypatch, fixed_step_times):
    import vitlab.experiments.runner as runner

    calls = []
    monkeypatch.setattr(runner, "train_spec", counting_trainer(calls, seconds=0.2))
    specs = [RunSpec("a", "demo", {**TINY, "seed": 0}), RunSpec("b", "demo", {**TINY, "seed": 1})]
    first = run_experiment(fake_experiment(specs), tmp_path, quick=True, say=lambda line: None)
    assert calls == ["a", "b"]
    lines = []
    second = run_experiment(fake_experiment(specs), tmp_path, quick=True, say=lines.append)
    assert calls == ["a", "b"]  # nothing trained again
    assert lines == ["fake: every run is already done; analysing"]
    assert second["measured"] == first["measured"]
    # the experiment's cost is its runs' time, whichever invocation trained them: two trainings of >= 0.2 s each
    assert second["run_seconds"] == first["run_seconds"] >= 0.4


def test_interrupted_experiment_continues_with_the_unfinished_run(tmp_path, monkeypatch, fixed_step_times):
    import vitlab.experiments.runner as runner

    calls = []
    specs = [RunSpec("a", "demo", {**TINY, "seed": 0}), RunSpec("b", "demo", {**TINY, "seed": 1})]
    monkeypatch.setattr(runner, "train_spec", counting_trainer(calls, fail_on="b"))
    with pytest.raises(runner.Interrupted):
        run_experiment(fake_experiment(specs), tmp_path, quick=True, say=lambda line: None)
    assert not (tmp_path / "fake" / "results.json").exists()
    monkeypatch.setattr(runner, "train_spec", counting_trainer(calls))
    lines = []
    run_experiment(fake_experiment(specs), tmp_path, quick=True, say=lines.append)
    assert calls == ["a", "b", "b"]
    assert lines[0].startswith("fake: 1 run(s) to train (4 steps)")


def test_a_preempted_run_resumes_from_its_checkpoint(tmp_path, sigterm_during_step):
    """The real trainer: SIGTERM during step 3 stops the experiment; the next invocation resumes that run with
    the trainer's --resume machinery (from the step-3 checkpoint), not from the start."""
    from vitlab.experiments.runner import Interrupted

    spec = RunSpec("tiny", "demo", {**TINY, "seed": 0, "steps": 5, "save_every": 1})
    experiment = fake_experiment([spec])
    with sigterm_during_step(3), pytest.raises(Interrupted):
        run_experiment(experiment, tmp_path, quick=True, say=lambda line: None)
    run_dir = next((tmp_path / "_runs").glob(f"{spec.key}-*"))
    assert not (run_dir / "result.json").exists() and (run_dir / "checkpoints").is_dir()
    results = run_experiment(experiment, tmp_path, quick=True, say=lambda line: None)
    log = (run_dir / "console.log").read_text()
    assert "resuming from" in log and "(step 3)" in log
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert steps == [1, 2, 3, 4, 5]  # each step once: the resumed run went on from step 3
    stored = json.loads((run_dir / "result.json").read_text())
    assert stored["train"]["step"] == 5 and 0 <= stored["train"]["val"]["top1"] <= 1
    assert not (run_dir / "checkpoints").exists() and (run_dir / "model.safetensors").is_file()
    assert results["runs"][0]["key"] == spec.key


def test_results_json_schema(tmp_path, monkeypatch, fixed_step_times):
    import vitlab.experiments.runner as runner

    monkeypatch.setattr(runner, "train_spec", counting_trainer([]))
    specs = [RunSpec("a", "demo", {**TINY, "seed": 0}), RunSpec("b", "demo", {**TINY, "seed": 1})]
    run_experiment(fake_experiment(specs), tmp_path, quick=True, seeds=(3,), say=lambda line: None)
    results = json.loads((tmp_path / "fake" / "results.json").read_text())
    assert {"experiment", "title", "paper", "finding", "setup", "mode", "seeds", "scale", "command", "tables",
            "figures", "measured", "check", "runs", "estimated_seconds", "wall_seconds", "finished",
            "versions"} <= set(results)
    assert results["mode"] == "quick" and results["seeds"] == [3]
    assert results["command"] == "vitlab experiment fake --quick --seeds 3"
    assert set(results["check"]) == {"holds", "rule", "details"}
    assert [r["label"] for r in results["runs"]] == ["a", "b"]
    assert {"key", "label", "dir", "lr", "seed", "steps", "val_top1", "wall_seconds"} <= set(results["runs"][0])
    stored = json.loads((tmp_path / results["runs"][0]["dir"] / runner.RESULT).read_text())
    assert stored["spec"]["key"] == specs[0].key and set(stored) >= {"spec", "train", "evals", "wall_seconds"}
    # 0.01 s per step × 4 steps + 360 digits test images × 0.001 s + the fixed overhead, per run
    assert results["estimated_seconds"] == pytest.approx(2 * (0.04 + 0.36 + 2.5), abs=0.1)


def test_the_key_is_what_the_run_computes():
    base = RunSpec("x", "demo", {**TINY, "seed": 0, "crop_scale": (0.5, 1.0)})
    assert RunSpec("another label", "demo", {**TINY, "seed": 0, "workers": 3, "log_every": 7}).key == base.key
    assert RunSpec("x", "demo", {**TINY, "seed": 1}).key != base.key
    assert RunSpec("x", "finetune", {**TINY, "seed": 0}).key != base.key
    assert RunSpec("x", "demo", {**TINY, "seed": 0}, curve=True).key != base.key
    assert base.settings["crop_scale"] == [0.5, 1.0]
    with pytest.raises(ValueError, match="init"):
        RunSpec("ft", "finetune", TINY, verb="finetune")


def test_best_takes_the_highest_validation_accuracy_and_the_first_of_a_tie(tmp_path, fixed_step_times):
    top1 = {0.1: 0.5, 0.2: 0.7, 0.3: 0.7}

    def train(spec, run_dir, init):
        run_dir.mkdir(parents=True)
        return {"step": 1, "val": {"top1": top1[spec.settings["lr"]]}}

    runner = Runner(tmp_path, QUICK, train=train)
    candidates = {lr: RunSpec(f"lr{lr}", "demo", {**TINY, "lr": lr}) for lr in top1}
    assert Context(runner, (0,), dry=True).best(candidates) == 0.1  # before anything ran: the first
    assert Context(runner, (0,), dry=False).best(candidates) == 0.2
    assert Context(runner, (0,), dry=True).best(candidates) == 0.2  # once they ran, the dry pass knows too


def test_experiments_share_their_runs(tmp_path, fixed_step_times):
    """A dry pass of each experiment on an empty folder: attention-distance, pos-embed's 1-D embedding,
    token-vs-gap's class token and compute's size M ask for data-scaling's largest-set runs, not new ones."""
    runner = Runner(tmp_path, QUICK)
    asked = {}
    for name, experiment in experiments().items():
        ctx = Context(runner, (0,), dry=True)
        experiment.plan(ctx)
        asked[name] = dict(ctx.specs)
    largest_vit = pretrain(QUICK, "ViT", "M", QUICK.largest, QUICK.lrs[0], 0).key
    for name in NAMES:
        assert largest_vit in asked[name], name
    # compute re-uses every data-scaling run on the largest set (tuning, size M) and their digits fine-tuning runs
    on_largest = {k for k, s in asked["data-scaling"].items()
                  if s.settings.get("data") == QUICK.largest and s.settings["lr"] > 0}  # lr 0: untrained references
    tuned = {k for k, s in asked["data-scaling"].items() if s.init in on_largest and s.settings["data"] == "digits"}
    assert len(on_largest) == 3 * len(QUICK.lrs) and len(tuned) == 3 * len(QUICK.finetune_lrs) + 3
    assert on_largest | tuned <= set(asked["compute"])


def test_families_have_similar_size_and_compute():
    """The issue's constraint: at size M, parameters and multiply-adds within 1.5× across the three families,
    counted by building each model and by vitlab.flops; each family grows from S to L."""
    rows = {(r["family"], r["size"]): r for r in model_table(FULL, 64)}
    for key in ("params", "macs"):
        values = [rows[(f, "M")][key] for f in ("ViT", "BiT", "hybrid")]
        assert max(values) / min(values) < 1.5, (key, values)
        for family in ("ViT", "BiT", "hybrid"):
            assert rows[(family, "S")][key] < rows[(family, "M")][key] < rows[(family, "L")][key]
    assert set(MODELS) == set(rows)


def test_full_size_figures_stay_small(tmp_path):
    """Five panels of three noisy series (what data-scaling and compute draw in full runs), at dpi 100."""
    import random

    from vitlab.experiments import plots

    rng = random.Random(0)
    for xs in ([1024, 4096, 16384, 65536], [2.1e11, 2.3e11, 2.5e11, 5e11, 5.1e11, 5.4e11, 1.3e12, 1.4e12]):
        panels = [(f"metric {i}", {f: (xs, [{"mean": rng.uniform(10, 90), "std": rng.uniform(0, 5)} for _ in xs])
                                   for f in ("ViT", "BiT", "hybrid")}) for i in range(5)]
        path = plots.line_panels(tmp_path / "f.png", panels, "x", title="t")
        assert 10_000 < path.stat().st_size < 100_000


@pytest.mark.parametrize("family", ["ViT", "BiT"])
def test_untrained_reference_keeps_the_initial_weights(tmp_path, family):
    """The no-pre-training reference is one step at learning rate 0: every normalisation scale is still exactly 1
    and every bias still as initialised, 0 or (a ViT's MLP, as in the official code) normal with std 1e-6; one Adam
    step at a positive learning rate moves each of them by about the learning rate. A control run at lr 1e-3 shows
    the check can fail."""
    from safetensors.torch import load_file

    from vitlab.experiments.plans import untrained
    from vitlab.experiments.runner import train_spec

    spec = untrained(QUICK, family, "S", seed=1)
    assert spec.settings["lr"] == 0.0 and spec.steps == 1
    # two steps: the head kernel starts at zero (the official code; Section 3.2 for fine-tuning), so the first
    # step moves only the head
    moved = RunSpec("moved", spec.recipe, {**spec.settings, "lr": 1e-3, "warmup": 0, "steps": 2})
    for run, expect_initial in ((spec, True), (moved, False)):
        assert "diverged" not in train_spec(run, tmp_path / run.label, None)
        weights = load_file(tmp_path / run.label / "model.safetensors")
        scales = [v for k, v in weights.items() if "norm" in k and k.endswith("weight")]
        biases = [v for k, v in weights.items() if k.endswith("bias") and not k.startswith("head")]
        assert scales and biases
        initial = all(bool((v == 1).all()) for v in scales) and all(float(v.abs().max()) < 1e-5 for v in biases)
        assert initial == expect_initial, run.label


def test_bad_name_is_one_line_listing_the_names(capsys):
    assert main(["experiment", "bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "unknown experiment 'bogus'" in err and all(name in err for name in NAMES)


@pytest.mark.parametrize("seeds,says", [(["-1"], "--seeds"), (["nan"], "--seeds"), (["0", "0"], "seed twice")])
def test_bad_seeds_are_one_line(capsys, seeds, says):
    try:
        code = main(["experiment", "mpp", "--quick", "--seeds", *seeds])
    except SystemExit as exit_:  # argparse's own refusal
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and says in err


def synthetic_results(mode="full"):
    return {"experiment": "pos-embed", "title": "Position embeddings", "paper": "Appendix D.4, Table 8",
            "finding": "f", "setup": "A setup.", "mode": mode, "seeds": [0, 1],
            "command": "vitlab experiment pos-embed",
            "tables": [{"title": "Accuracy", "columns": ["embedding", "5-shot digits"],
                        "rows": [["none", "41.2±1.3 %"], ["1-D", "45.0±0.8 %"]]}],
            "figures": [{"file": "pos_embed.png", "caption": "Bars."}],
            "measured": ["5-shot digits: none 41.2±1.3 %, 1-D 45.0±0.8 %"],
            "check": {"holds": True, "rule": "none below the others", "details": ["none −3.8 points"]},
            "choices": {"pretrain_lr": 0.001, "finetune_lr": 0.01}, "wall_seconds": 1800.0, "run_seconds": 4200.0,
            "finished": "2026-12-01 10:00:00", "versions": {"vitlab": "0.1.0", "torch": "2.x"}}


def test_reproduction_md_is_written_from_results_and_keeps_notes(tmp_path):
    from vitlab.experiments.report import write_report

    out, report = tmp_path / "runs", tmp_path / "REPRODUCTION.md"
    (out / "pos-embed").mkdir(parents=True)
    (out / "pos-embed" / "results.json").write_text(json.dumps(synthetic_results()))
    (out / "pos-embed" / "pos_embed.png").write_bytes(b"\x89PNG fake")
    write_report(out, report)
    text = report.read_text()
    pos = text[text.index("## 3. pos-embed"):text.index("## 4.")]
    assert "| none | 41.2±1.3 % |" in pos and "- 5-shot digits: none 41.2±1.3 %, 1-D 45.0±0.8 %" in pos
    assert "At this scale the paper's ordering holds by the rule: none below the others." in pos
    assert "![Bars.](reproduction/pos-embed-pos_embed.png)" in pos and "pending" not in pos
    assert (tmp_path / "reproduction" / "pos-embed-pos_embed.png").read_bytes() == b"\x89PNG fake"
    other = text[text.index("## 1. data-scaling"):text.index("## 2.")]
    assert "**Verdict: pending.**" in other and "`vitlab experiment data-scaling`" in other
    assert "| pos-embed | Appendix D.4, Table 8 | holds | 70 min |" in text  # its runs' time, not the last call's
    assert "its runs took 70 min of wall time in all, training and evaluation, on this machine; the last " \
           "invocation 30 min" in pos
    # a person's notes survive the rewrite; rewriting again changes nothing else
    noted = text.replace("<!-- notes:pos-embed -->\n", "<!-- notes:pos-embed -->\nAt 16 patches position matters "
                                                       "less.\n")
    report.write_text(noted)
    write_report(out, report)
    assert report.read_text() == noted


def test_quick_results_do_not_make_findings(tmp_path):
    from vitlab.experiments.report import write_report

    (tmp_path / "pos-embed").mkdir()
    (tmp_path / "pos-embed" / "results.json").write_text(json.dumps(synthetic_results("quick")))
    text = write_report(tmp_path, tmp_path / "R.md").read_text()
    assert text.count("**Verdict: pending.**") == len(NAMES)


def test_every_experiment_is_registered_with_its_paper_reference():
    table = experiments()
    assert list(table) == list(NAMES)
    for experiment in table.values():
        assert experiment.paper and experiment.finding and experiment.setup


# --- every experiment in --quick mode, end to end (one folder: later experiments reuse earlier runs) -----------
@pytest.fixture(scope="module")
def quick_out(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("experiments")
    mp.setenv("VITLAB_CACHE", str(root / "cache"))
    started = time.perf_counter()
    yield root / "out"
    print(f"\nall quick experiments: {time.perf_counter() - started:.0f} s")
    mp.undo()


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_quick_experiment_end_to_end(name, quick_out, capsys):
    assert main(["experiment", name, "--quick", "--out", str(quick_out)]) == 0
    printed = capsys.readouterr().out
    results = json.loads((quick_out / name / "results.json").read_text())
    assert results["mode"] == "quick" and results["seeds"] == [0] and results["measured"]
    for figure in results["figures"]:
        size = (quick_out / name / figure["file"]).stat().st_size
        assert 0 < size < 100_000
    for run in results["runs"]:
        assert (quick_out / run["dir"] / "model.safetensors").is_file()
        assert (quick_out / run["dir"] / "config.json").is_file()
    assert f"{quick_out / name / 'results.json'}" in printed and "wrote" not in printed  # --quick: no report
    # again: nothing left to do
    assert main(["experiment", name, "--quick", "--out", str(quick_out)]) == 0
    assert f"{name}: every run is already done" in capsys.readouterr().out
