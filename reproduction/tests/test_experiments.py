"""`vitlab experiment`: the runner (finished runs are not redone, an interrupted one resumes), the stored results,
REPRODUCTION.md written from them, shared runs between experiments, and (slow) every experiment end to end in
--quick mode."""

import json
import shutil
import time

import pytest

from reproduction import NAMES, PILOT
from reproduction.cli import main
from reproduction.estimate import CostModel, StepTime
from reproduction.experiment import Experiment, read_results, run_experiment, write_results
from reproduction.experiments import experiments
from reproduction.families import MODELS, model_table
from reproduction.plans import pretrain
from reproduction.runner import Context, Runner
from reproduction.scale import FULL, QUICK
from reproduction.spec import RunSpec

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
    from reproduction.runner import Interrupted

    def train(spec, run_dir, init):
        calls.append(spec.label)
        time.sleep(seconds)
        if spec.label == fail_on:
            run_dir.mkdir(parents=True, exist_ok=True)
            raise Interrupted(f"{run_dir} stopped")  # as the trainer stops on SIGTERM or Ctrl-C
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "model.safetensors").touch()  # as the trainer leaves its final weights
        return {"step": spec.steps, "val": {"top1": 0.1 * len(calls)}, "seconds": 0.0, "images_per_s": 0.0}
    return train


def test_second_invocation_trains_nothing(tmp_path, monkeypatch, fixed_step_times):
    import reproduction.runner as runner

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
    import reproduction.runner as runner

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
    from reproduction.runner import Interrupted

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
    import reproduction.runner as runner

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
        (run_dir / "model.safetensors").touch()  # as the trainer leaves its final weights
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
    # data-scaling tunes each family on the largest set and fine-tunes once from its chosen run (version 3: no
    # fine-tuning grid, the family's pre-training lr); compute re-uses the ViT-M and BiT-M tuning runs as its own
    # size-M ones
    on_largest = {k for k, s in asked["data-scaling"].items()
                  if s.settings.get("data") == QUICK.largest and s.settings["lr"] > 0}  # lr 0: untrained references
    target = QUICK.finetune_data[0]
    tuned = [s for s in asked["data-scaling"].values() if s.init in on_largest and s.settings["data"] == target]
    assert len(on_largest) == 3 * len(QUICK.lrs) and len(tuned) == 3
    assert all(s.settings["lr"] == asked["data-scaling"][s.init].settings["lr"] for s in tuned)
    vit_bit = {k for k in on_largest if asked["data-scaling"][k].label.startswith(("pre-ViT-M-", "pre-BiT-M-"))}
    assert len(vit_bit) == 2 * len(QUICK.lrs) and vit_bit <= set(asked["compute"])


def test_families_have_similar_size_and_compute():
    """Matched sizes: at size M, parameters and multiply-adds within 1.5× across the three families,
    counted by building each model and by vitlab.models.flops; each family grows from S to L."""
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

    from reproduction.report import plots

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

    from reproduction.plans import untrained
    from reproduction.runner import train_spec

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


def test_a_run_that_saves_only_at_its_end_checkpoints_every_tenth_outside_its_key(tmp_path):
    """A killed session lost whole fine-tuning runs (they saved only at the end); the runner now has them save a
    checkpoint every tenth of their steps, a flag of the launch and not of the spec, so cached keys stay."""
    from reproduction.experiments import pilot
    from reproduction.runner import train_spec

    spec = pilot.finetune_run(pilot.PILOT_QUICK, None, "ViT", 20)
    assert "save_every" not in spec.settings and spec.settings["eval_every"] == 0
    key = spec.key
    assert "diverged" not in train_spec(spec, tmp_path / "run", None)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["save_every"] == 2
    assert spec.key == key and "save_every" not in spec.settings


def test_bad_name_is_one_line_listing_the_names(capsys):
    assert main(["experiment", "bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "unknown experiment 'bogus'" in err and all(name in err for name in NAMES)


def test_several_experiments_run_in_the_order_named_each_once(monkeypatch, capsys):
    import reproduction.experiment as experiments

    ran = []
    monkeypatch.setattr(experiments, "run_experiment",
                        lambda exp, out, *a, then=(), **k: ran.append((exp.name, [e.name for e in then])))
    assert main(["experiment", "mpp", "pos-embed", "mpp", "--quick", "--estimate"]) == 0
    assert ran == [("mpp", ["pos-embed"]), ("pos-embed", [])]  # a later one fills the cores an earlier leaves idle
    assert main(["experiment", "pos-embed", "bogus", "--quick"]) == 2
    assert "unknown experiment 'bogus'" in capsys.readouterr().err
    pools = []  # one pool of workers for the command: a run in flight goes on across the hand-over
    monkeypatch.setattr(experiments, "run_experiment", lambda exp, out, *a, pool=None, **k: pools.append(pool))
    assert main(["experiment", "mpp", "pos-embed", "--quick", "--jobs", "2"]) == 0
    assert len(pools) == 2 and pools[0] is pools[1] is not None
    assert main(["experiment", "mpp", "pos-embed", "--quick", "--jobs", "1"]) == 0
    assert pools[2:] == [None, None]


def test_several_full_experiments_rewrite_the_report_after_each(monkeypatch, tmp_path):
    import reproduction.experiment as experiments
    import reproduction.report.report as report

    events = []
    monkeypatch.setattr(experiments, "run_experiment", lambda exp, out, *a, **k: events.append(exp.name))
    monkeypatch.setattr(report, "write_report", lambda out, path, **k: events.append(f"report {path.name}"))
    assert main(["experiment", "mpp", "pos-embed", "--out", str(tmp_path), "--report", str(tmp_path / "R.md")]) == 0
    assert events == ["mpp", "report R.md", "pos-embed", "report R.md"]  # each ready to commit as it finishes


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
            "design": {"version": experiments()["pos-embed"].design.version},  # a result of today's design
            "command": "vitlab experiment pos-embed",
            "tables": [{"title": "Accuracy", "columns": ["embedding", "5-shot digits"],
                        "rows": [["none", "41.2±1.3 %"], ["1-D", "45.0±0.8 %"]]}],
            "figures": [{"file": "pos_embed.png", "caption": "Bars."}],
            "measured": ["5-shot digits: none 41.2±1.3 %, 1-D 45.0±0.8 %"],
            "check": {"holds": True, "rule": "none below the others", "details": ["none −3.8 points"]},
            "choices": {"pretrain_lr": 0.001, "finetune_lr": 0.01}, "wall_seconds": 1800.0, "run_seconds": 4200.0,
            "finished": "2026-12-01 10:00:00", "versions": {"vitlab": "0.1.0", "torch": "2.x"}}


def stored_pos_embed_results(tmp_path):
    """(OUT, report path): OUT holding a full pos-embed results.json and its figure, as a finished run leaves them."""
    out, report = tmp_path / "runs", tmp_path / "REPRODUCTION.md"
    (out / "pos-embed").mkdir(parents=True)
    write_results(out / "pos-embed" / "results.json", synthetic_results())  # sealed, as a run writes it
    (out / "pos-embed" / "pos_embed.png").write_bytes(b"\x89PNG fake")
    return out, report


def test_reproduction_md_is_rebuilt_from_the_committed_copies_of_results_and_figures(tmp_path):
    """runs/ is not committed: the report copies each results.json and figure to reproduction/NAME/, and that
    folder alone (a fresh clone, another machine) rebuilds the same report."""
    from reproduction.report.report import write_report

    out, report = stored_pos_embed_results(tmp_path)
    write_report(out, report)
    first = report.read_text()
    archived = tmp_path / "reproduction" / "pos-embed"
    assert read_results(archived / "results.json") == synthetic_results()
    shutil.rmtree(out)
    report.unlink()
    write_report(tmp_path / "reproduction", report)
    assert report.read_text() == first
    assert "| pos-embed | Appendix D.4, Table 8 | 5-shot digits: none 41.2±1.3 %" in first
    assert sorted(p.name for p in archived.iterdir()) == ["pos_embed.png", "results.json"]  # no temporaries left


def test_reproduction_md_is_written_from_results_and_keeps_notes(tmp_path):
    from reproduction.report.report import write_report

    out, report = stored_pos_embed_results(tmp_path)
    write_report(out, report)
    text = report.read_text()
    pos = text[text.index("## 3. pos-embed"):text.index("## 4.")]
    assert "| none | 41.2±1.3 |" in pos and "| embedding | 5-shot digits (%) |" in pos  # the main table
    assert "At this scale the paper's ordering holds by the rule: none below the others." in pos
    assert "![Bars](reproduction/pos-embed/pos_embed.png)" in pos and "pending" not in pos
    assert (tmp_path / "reproduction" / "pos-embed" / "pos_embed.png").read_bytes() == b"\x89PNG fake"
    other = text[text.index("## 1. data-scaling"):text.index("## 2.")]
    assert "**Verdict: pending.**" in other and "`vitlab experiment data-scaling`" in other
    assert ("| pos-embed | Appendix D.4, Table 8 | 5-shot digits: none 41.2±1.3 %, 1-D 45.0±0.8 % | **holds** | — | "
            "70 min |") in text  # its runs' time, not the last call's
    assert "`vitlab experiment pos-embed`, 70 min of runs (finished 2026-12-01 10:00:00)." in pos
    # the measured lines and the notes are in the appendix; a person's notes there survive the rewrite, and
    # rewriting again changes nothing else
    appendix = tmp_path / "reproduction" / "HISTORY.md"
    history = appendix.read_text()
    assert "- 5-shot digits: none 41.2±1.3 %, 1-D 45.0±0.8 %" in history and "<!-- notes:" not in text
    noted = history.replace("<!-- notes:pos-embed -->\n", "<!-- notes:pos-embed -->\nAt 16 patches position "
                                                          "matters less.\n")
    appendix.write_text(noted)
    write_report(out, report)
    assert appendix.read_text() == noted and report.read_text() == text


def test_quick_results_do_not_make_findings(tmp_path):
    from reproduction.report.report import write_report

    (tmp_path / "pos-embed").mkdir()
    write_results(tmp_path / "pos-embed" / "results.json", synthetic_results("quick"))
    text = write_report(tmp_path, tmp_path / "R.md").read_text()
    assert text.count("**Verdict: pending.**") == len(NAMES) + 1  # and the pilot


def test_every_experiment_is_registered_with_its_paper_reference():
    table = experiments()
    assert list(table) == [PILOT, *NAMES]
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
@pytest.mark.parametrize("name", [PILOT, *NAMES])
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


# --- the verdicts' rules on hand-made measurements ---------------------------------------------------------------
IMAGES = [1024, 4096, 16384, 65536]  # log2: 10, 12, 14, 16


def _data_scaling_values(vit_upstream, noise=(0.0, 0.5, -0.5)):
    """Per-seed values of the three families: BiT 60 -> 72 upstream, the ViT as given, the hybrid between."""
    bit = [60.0, 64.0, 68.0, 72.0]

    def seeds(v):
        return [v + e for e in noise]

    values = {}
    for i, n in enumerate(IMAGES):
        for family, up in (("ViT", vit_upstream[i]), ("BiT", bit[i]), ("hybrid", (vit_upstream[i] + bit[i]) / 2)):
            values[(family, n)] = {"upstream": seeds(up), "encoder": seeds(up - 10), "pre_logits": seeds(up - 20),
                                   "fine-tuned": seeds(90.0)}
    references = {f: {"encoder": [30.0] * 3, "pre_logits": [30.0] * 3, "fine-tuned": [80.0] * 3}
                  for f in ("ViT", "BiT", "hybrid")}
    return values, references


CAPTIONS = {"upstream": "upstream top-1", "encoder": "10-shot mnist, encoder", "pre_logits": "10-shot mnist",
            "fine-tuned": "fine-tuned mnist"}


def test_data_scaling_a_closing_gap_holds_with_its_slope():
    from reproduction.experiments.data_scaling import judge
    from reproduction.preconditions import inside_grid

    # ViT 40 -> 70 against BiT 60 -> 72: gaps -20, -14, -8, -2 at log2 = 10, 12, 14, 16: slope exactly +3/doubling
    values, refs = _data_scaling_values([40.0, 50.0, 60.0, 70.0], noise=(0.0, 0.5, -0.5))
    grid = [inside_grid("pretrain ViT-M", 1e-3, [3e-4, 1e-3, 3e-3])]
    verdict, secondary = judge(values, refs, IMAGES, CAPTIONS, grid)
    assert verdict.state == "holds", verdict.to_dict()
    assert verdict.result.startswith("ViT − BiT upstream top-1: -20.0 points at 1,024 images, -2.0 at 65,536 "
                                     "(slope +3.00 ± 0.00 per doubling): gap closes, no crossover")
    assert [c.key for c in verdict.checks] == ["a", "a", "a", "b", "b", "b", "b", "b", "b", "c", "d"]
    # few-shot follows the upstream gap; fine-tuned accuracy is 90 % for every family: no gap, no trend
    assert [s.endswith(": holds (trend)") for s in secondary] == [True, True, False]
    assert secondary[2].endswith("+0.0 at 65,536 (slope +0.00 ± 0.00 per doubling): no gap to close (the ViT not "
                                 "behind at the smallest set), no crossover: does not hold")


def test_data_scaling_a_transfer_view_whose_pre_training_did_not_help_is_inconclusive():
    from reproduction.experiments.data_scaling import judge

    # the same closing gaps, but fine-tuning gains only +1 over training from scratch (needs +2): the fine-tuned
    # view's verdict rests on (b) for fine-tuning and is inconclusive; the few-shot views' (b) holds (+30)
    values, refs = _data_scaling_values([40.0, 50.0, 60.0, 70.0])
    refs = {f: {**r, "fine-tuned": [89.0] * 3} for f, r in refs.items()}
    verdict, secondary = judge(values, refs, IMAGES, CAPTIONS, [])
    assert [s.endswith(": holds (trend)") for s in secondary] == [True, True, False]
    assert secondary[2].endswith(": inconclusive: precondition (b) failed (ViT at 65,536 images, fine-tuned mnist "
                                 "(vs trained from scratch): 90.0 vs 89.0 % without pre-training (+1.0; needs +2))")
    # few-shot that does not beat the initial weights makes both few-shot views inconclusive, never "does not hold"
    refs = {f: {**r, "encoder": [69.0] * 3} for f, r in refs.items()}
    _, secondary = judge(values, refs, IMAGES, CAPTIONS, [])
    assert all(": inconclusive: precondition (b) failed (ViT at 65,536 images, 10-shot mnist, encoder" in s
               for s in secondary[:2]), secondary


def test_data_scaling_upstream_verdict_rests_on_a_not_on_transfer(tmp_path):
    from reproduction.experiments.data_scaling import judge
    from reproduction.report.report import _measured

    # the pilot's version-4 rule: with (b) failed, the transfer verdicts are inconclusive and the upstream one
    # rests on (a), (c), (d). Fine-tuning gains only +1 over training from scratch (needs +2); the upstream gap
    # closes as in the test above
    values, refs = _data_scaling_values([40.0, 50.0, 60.0, 70.0], noise=(0.0, 0.5, -0.5))
    refs = {f: {**r, "fine-tuned": [89.0] * 3} for f, r in refs.items()}
    verdict, secondary = judge(values, refs, IMAGES, CAPTIONS, [])
    assert verdict.state == "holds" and secondary[2].endswith("(+1.0; needs +2))")
    listed = verdict.to_dict()["preconditions"]  # (b) is still measured and listed beside the verdict
    assert [(c["key"], c["holds"], c["decides"]) for c in listed if c["key"] == "b"][1::2] == [
        ("b", False, "the transfer verdicts")] * 3
    lines = _measured({"setup": "", "seeds": [0], "command": "x", "wall_seconds": 1, "finished": "now",
                           "versions": {"vitlab": "v", "torch": "t"}, "tables": [], "measured": [],
                           "verdict": verdict.to_dict(), "check": {"holds": True, "details": []}}, [])
    row = next(line for line in lines if line.startswith("| (b) "))  # one row: the failing runs, (b)'s verdicts
    assert row.startswith("| (b) pre-training helps transfer (a condition of the transfer verdicts only) |")
    assert row.endswith(" | no |") and row.count("(+1.0; needs +2)") == 3 and "(the other 3 hold)" in row


def test_data_scaling_slope_spread_over_seeds_is_its_standard_error():
    from reproduction.measures import trend

    # seed slopes 2, 3, 4 per doubling (gaps at log2 10 and 12): mean 3, std 1, standard error 1/sqrt(3)
    t = trend([[-20.0, -16.0], [-20.0, -14.0], [-20.0, -12.0]], [1024, 4096])
    assert t["slope"]["mean"] == pytest.approx(3.0) and t["slope"]["std"] == pytest.approx(1.0)
    assert t["slope_se"] == pytest.approx(1 / 3 ** 0.5, abs=1e-3) and t["closes"] and not t["crossover"]
    flat = trend([[-5.0, -6.0], [-5.0, -4.0], [-5.0, -5.0]], [1024, 4096])  # slopes -0.5, +0.5, 0: within spread
    assert not flat["closes"]


def test_a_trend_in_the_papers_direction_within_the_spread_says_so():
    """data-scaling's full run read 'gap does not close by the rule' for a slope of +0.28 ± 0.26 per doubling: the
    gap did narrow, by less than the seed spread can tell; a skimming reader read it as measured not to close."""
    from reproduction.measures import describe_trend, trend

    images = [1024, 4096]
    narrows = trend([[-26.0, -25.0], [-26.0, -26.0], [-26.0, -25.5]], images)  # slopes +0.5, 0, +0.25 (SE 0.14)
    assert describe_trend("g", narrows, images).endswith("gap narrows, within the seed spread (under 2 standard "
                                                         "errors), no crossover")
    widens = trend([[-10.0, -14.0], [-10.0, -13.0], [-10.0, -15.0]], images)  # -2, -1.5, -2.5: beyond the spread
    assert describe_trend("g", widens, images).endswith("gap widens, no crossover")
    one_seed = trend([[-10.0, -9.0]], images)
    assert describe_trend("g", one_seed, images).endswith("gap narrows (one seed: spread not measured), no crossover")


def test_data_scaling_a_failed_precondition_is_inconclusive_never_does_not_hold():
    from reproduction.experiments.data_scaling import judge

    # the ViT never learns (20 % at the largest set) and its gap does not close: the test was not fair
    values, refs = _data_scaling_values([20.0, 20.0, 20.0, 20.0])
    verdict, _ = judge(values, refs, IMAGES, CAPTIONS, [])
    assert not verdict.finding_holds
    assert verdict.state.startswith("inconclusive: precondition (a) failed (ViT at 65,536 images: 20.0 % upstream")


def test_token_vs_gap_trains_no_gap_run_at_the_tokens_lr_once_both_chose_the_same(tmp_path, fixed_step_times):
    import math

    from reproduction.experiments import token_vs_gap
    from reproduction.plans import tuned_pretrain_lr

    def train(spec, run_dir, init):  # every grid peaks at 3e-3
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "model.safetensors").touch()
        # a top-1 fraction (records refuse others) that peaks at 3e-3
        return {"step": spec.steps, "val": {"top1": 0.9 - abs(math.log(spec.settings["lr"] / 3e-3)) / 20}}

    runner = Runner(tmp_path, QUICK, train=train)
    ctx = Context(runner, (0, 1), dry=False)
    assert tuned_pretrain_lr(ctx, "ViT") == tuned_pretrain_lr(ctx, "ViT", tag="-gap", classifier="gap")
    dry = Context(runner, (0, 1), dry=True)
    token_vs_gap.plan(dry)
    # this session's full run trained GAP at 3e-4 "at the token's lr" for seeds 1 and 2 although both chose 3e-3
    assert [t.spec.settings["lr"] for t in dry.todo.values() if t.train] == pytest.approx([3e-3, 3e-3])
    assert sorted(t.spec.label for t in dry.todo.values() if t.train) == ["pre-ViT-M-fractal:4:8-s1",
                                                                            "pre-ViT-gap-M-fractal:4:8-s1"]


def test_token_vs_gap_a_gap_that_did_not_learn_is_inconclusive():
    from reproduction.experiments.token_vs_gap import judge
    from reproduction.measures import stat

    token, gap = stat([61.0, 63.0, 62.0]), stat([4.0, 4.2, 4.1])
    verdict = judge(token, gap, [])
    assert verdict.state.startswith("inconclusive: precondition (a) failed (GAP: 4.1 % upstream top-1")
    assert "GAP 4.1±0.1 %" in verdict.result and "they differ" in verdict.result
    same = judge(token, stat([62.5, 61.0, 63.0]), [])  # GAP − token +0.2, standard error sqrt(1/3 + 13/12/3)
    assert same.state == "holds" and "standard error 0.8): equal within the spread" in same.result
    assert "(which would accept any difference up to ±1.7 points)" in same.result  # how weak a tie it is


def test_attention_distance_needs_local_and_far_heads_and_growth():
    from reproduction.experiments.attention_distance import judge

    uniform = 10.0
    grows = [[[3.0, 9.0], [6.0, 9.0], [8.0, 10.0]], [[4.0, 8.5], [6.0, 8.0], [9.0, 9.0]]]  # (seeds, layers, heads)
    verdict = judge(grows, uniform, [])
    assert verdict.state == "holds" and "positive in 2 of 2 seeds" in verdict.result
    shrinks = [[[3.0, 9.0], [6.0, 9.0], [2.0, 3.0]], [[4.0, 8.5], [6.0, 8.0], [9.0, 9.0]]]
    assert judge(shrinks, uniform, []).state == "does not hold"


def test_attention_distance_that_is_uniform_never_holds_and_says_why():
    """Attention within 10 % of uniform everywhere: no head of layer 1 is local, so the rule cannot give a plain
    'holds'; the verdict says the attention is no more local than averaging."""
    from reproduction.experiments.attention_distance import judge

    near_uniform = [[[9.5, 9.6], [9.7, 9.8], [9.9, 10.0]]]
    verdict = judge(near_uniform, 10.0, [])
    assert verdict.state != "holds" and "within 5 % of the uniform-attention distance" in verdict.trivial


def test_spearman_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    from reproduction.experiments.attention_distance import spearman

    for xs, ys in [([0, 1, 2, 3], [1.0, 3.0, 2.0, 5.0]), ([0, 1, 2, 3, 4], [2.0, 2.0, 1.0, 4.0, 4.0])]:
        assert spearman(xs, ys) == pytest.approx(scipy_stats.spearmanr(xs, ys).statistic)


def test_pos_embed_none_below_and_the_three_embeddings_together():
    from reproduction.experiments.pos_embed import judge
    from reproduction.measures import stat

    upstream = {"none": stat([58.0, 59.0, 57.0]), "1-D": stat([62.0, 61.5, 62.5]), "2-D": stat([61.8, 62.2, 61.6]),
                "relative": stat([62.1, 61.7, 62.4])}
    verdict, pairs = judge(upstream, [])
    assert verdict.state == "holds" and len(pairs) == 3 and all("within the spread" in p for p in pairs)
    assert "none 58.0±1.0 % (none − 1-D -4.0 points)" in verdict.result
    assert "span 0.2 points (2-D 61.9±0.3 % to relative 62.1±0.4 %)" in verdict.result
    upstream["relative"] = stat([66.0, 66.5, 65.5])  # relative clearly better: the three are not together
    verdict = judge(upstream, [])[0]
    assert verdict.state == "does not hold" and "span 4.1 points (2-D 61.9±0.3 % to relative 66.0±0.5 %)" in \
        verdict.result


def test_compute_matched_difference_is_the_hand_computed_one():
    from reproduction.experiments.compute import judge, matched_difference

    # ViT at 1, 4, 16 (10, 20, 30 %), BiT at 2, 8, 32 (5, 15, 25 %): interpolated in log compute the ViT is 10
    # points ahead at every compute value in the overlap [2, 16] (15 vs 5, 20 vs 10, 25 vs 15, 30 vs 20)
    compute = {"ViT": [1.0, 4.0, 16.0], "BiT": [2.0, 8.0, 32.0]}
    assert matched_difference(compute, {"ViT": [10.0, 20.0, 30.0], "BiT": [5.0, 15.0, 25.0]}) == pytest.approx(10.0)
    per_seed = {"ViT": [[60.0, 70.0, 80.0], [61.0, 71.0, 81.0]], "BiT": [[55.0, 65.0, 75.0], [55.0, 65.0, 75.0]]}
    assert judge(compute, per_seed, [], {"ViT-S": 60.0}).state == "holds"
    apart = {"ViT": [1.0, 2.0, 3.0], "BiT": [10.0, 20.0, 30.0]}
    verdict = judge(apart, per_seed, [], {})
    assert verdict.state.startswith("inconclusive: precondition (d) failed") and "do not overlap" in verdict.result


def test_mpp_supervised_not_helping_is_inconclusive():
    from reproduction.experiments.mpp import judge
    from reproduction.measures import stat

    tuned = {"from scratch": stat([95.0, 95.5, 94.5]), "MPP pre-training": stat([94.0, 94.2, 93.8]),
             "supervised pre-training": stat([95.2, 95.0, 95.4])}
    verdict = judge(tuned, stat([70.0, 71.0, 69.0]), stat([40.0, 41.0, 39.0]), stat([1.0, 1.0, 1.0]), [])
    assert verdict.state.startswith("inconclusive: precondition (b) failed")
    assert "not in the paper's order" in verdict.result
    ordered = {"from scratch": stat([80.0, 81.0, 79.0]), "MPP pre-training": stat([85.0, 85.5, 84.5]),
               "supervised pre-training": stat([90.0, 90.5, 89.5])}
    verdict = judge(ordered, stat([70.0, 71.0, 69.0]), stat([40.0, 41.0, 39.0]), stat([1.0, 1.0, 1.0]), [])
    assert verdict.state == "holds"


def test_upstream_evaluation_agrees_with_the_trainers_own_validation(tmp_path):
    """evals `upstream/<data>` scores saved weights through `vitlab eval`'s path; on the data the run trained on it
    must give the top-1 the training loop measured on the same validation split at the end."""
    spec = RunSpec("tiny-upstream", "demo", {**TINY, "seed": 0})
    record = Runner(tmp_path, QUICK).execute(spec, ["upstream/digits"])
    scored = record.evaluation("upstream/digits")
    assert scored["count"] == record.val["count"] > 0
    assert scored["top1"] == pytest.approx(record.val["top1"], abs=1e-6)
