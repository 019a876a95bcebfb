"""Resuming never writes anywhere but the folder the user names, extending a run extends its schedule, a killed
run's loader workers never hold its lock, and no verb replaces a file it did not write."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reproduction.cli import main as campaign  # vitlab's command line with the campaign's verb
from tests.conftest import TINY_TRAIN, TINY_TRAIN_FLAGS
from vitlab.cli import main
from vitlab.train import resolve_config, run
from vitlab.train.checkpoint import RunLock
from vitlab.train.optim import Schedule

TINY = {**TINY_TRAIN, "steps": 4, "eval_every": 0, "save_every": 2}
TINY_FLAGS = [*TINY_TRAIN_FLAGS, "--eval-every", "0", "--save-every", "2", "--eval-batch-size", "512"]


def tiny(out, **overrides):
    return resolve_config("demo", **{**TINY, "out": str(out), **overrides})


def tree_hashes(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative path -> SHA-256), the lock's holder pid aside."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".vitlab.lock"}


def rows(run_dir: Path, split: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("split") == split]


def test_a_copied_run_resumes_in_the_copy_and_never_touches_the_original(tmp_path, capsys):
    original = tmp_path / "run0"
    assert main(["train", "--out", str(original), *TINY_FLAGS, "--steps", "4"]) == 0
    before = tree_hashes(original)
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    capsys.readouterr()
    assert main(["train", "--out", str(copy), "--resume", "--steps", "6"]) == 0
    assert tree_hashes(original) == before  # not a byte of the original changed
    assert [r["step"] for r in rows(copy, "train")] == [1, 2, 3, 4, 5, 6]
    assert Path(json.loads((copy / "config.json").read_text())["out"]).resolve() == copy.resolve()
    assert (copy / "checkpoints" / "step_00000006").is_dir()
    assert f"weights {copy / 'model.safetensors'}" in capsys.readouterr().out


def test_a_moved_run_resumes_where_it_now_is_and_the_old_path_stays_gone(tmp_path, caplog):
    old = tmp_path / "runA"
    assert main(["train", "--out", str(old), *TINY_FLAGS, "--steps", "4"]) == 0
    new = tmp_path / "runB"
    old.rename(new)
    caplog.clear()
    caplog.set_level(logging.INFO, logger="vitlab")
    assert main(["train", "--out", str(new), "--resume", "--steps", "6"]) == 0
    assert not old.exists()
    assert f"resuming from {new / 'checkpoints' / 'step_00000004'} (step 4)" in caplog.text
    assert [r["step"] for r in rows(new, "train")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("decay", ["cosine", "linear"])
def test_resume_with_more_steps_extends_the_schedule(tmp_path, decay):
    """A finished 4-step run extended to 8: steps 5-8 take the lr of the 8-step schedule (the restored scheduler
    used to keep the 4-step total, so every added step trained at lr 0)."""
    out = tmp_path / "run"
    run(tiny(out, steps=4, decay=decay, warmup=1))
    extended = resolve_config("demo", out=str(out), resume=True, steps=8)
    assert any("schedule" in n and "8 steps" in n for n in _notes(out, 8)), _notes(out, 8)
    run(extended)
    lrs = {r["step"]: r["lr"] for r in rows(out, "train")}
    cfg = extended
    end = cfg.linear_end / cfg.lr
    planned = Schedule(cfg.warmup, 8, decay, end, cfg.lr_drops)
    for step in range(5, 9):
        assert lrs[step] == pytest.approx(cfg.lr * planned(step - 1), rel=1e-6), (step, lrs)
        assert lrs[step] > 0
    # the first 4 steps are the 4-step run's, untouched
    first = Schedule(cfg.warmup, 4, decay, end, cfg.lr_drops)
    assert [lrs[s] for s in range(1, 5)] == pytest.approx([cfg.lr * first(s - 1) for s in range(1, 5)], rel=1e-6)


def _notes(out: Path, steps: int) -> tuple[str, ...]:
    from vitlab.train.resolution import resolve

    return resolve("demo", {"out": str(out), "resume": True, "steps": steps}).notes


def test_resume_that_extends_says_how_in_the_banner(tmp_path, caplog):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), *TINY_FLAGS, "--steps", "4"]) == 0
    caplog.clear()
    caplog.set_level(logging.INFO, logger="vitlab")
    assert main(["train", "--out", str(out), "--resume", "--steps", "8"]) == 0
    err = caplog.text
    assert "learning-rate schedule re-planned from 4 to 8 steps: step 5 takes lr" in err
    assert "resumed with --steps 8 (was 4)" in err
    assert "schedule re-planned for 8 steps" in err


def test_resume_on_a_folder_without_a_run_is_refused(tmp_path, capsys):
    typo = tmp_path / "rnu"
    assert main(["train", "--out", str(typo), "--resume", *TINY_FLAGS, "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"--resume: {typo} holds no run to continue" in err and "--resume auto" in err
    assert not typo.exists()
    # `--resume auto` starts a run when there is none (what `make demo` and supervisors want), continues it after
    assert main(["train", "--out", str(typo), "--resume", "auto", *TINY_FLAGS, "--steps", "2"]) == 0
    assert main(["train", "--out", str(typo), "--resume", "auto", "--steps", "3"]) == 0
    assert [r["step"] for r in rows(typo, "train")] == [1, 2, 3]


def _kill_cli_with_workers(out: Path, workers: int) -> subprocess.CompletedProcess:
    """Start a CLI run whose train loader has `workers` processes and kill -9 it once a checkpoint exists."""
    from tests.train.test_checkpoint import signal_at_checkpoint

    cmd = [sys.executable, "-m", "vitlab", "train", "--out", str(out), *TINY_FLAGS, "--steps", "60",
           "--save-every", "5"]
    cmd[cmd.index("--workers") + 1] = str(workers)
    return signal_at_checkpoint(cmd, {**os.environ, "OMP_NUM_THREADS": "1"}, out, signal.SIGKILL, after_step=10)


def test_kill_then_immediate_resume_is_not_refused_by_orphaned_loader_workers(tmp_path):
    """The loader workers of a killed run live on for seconds (they notice their parent is gone every 5 s); they
    inherited the run lock's open file, so the lock stayed taken and an immediate --resume was refused."""
    out = tmp_path / "run"
    proc = _kill_cli_with_workers(out, workers=2)
    assert proc.returncode == -signal.SIGKILL
    lock = RunLock(out)  # at once: before the fix this raised "in use by another vitlab run"
    lock.release()
    resumed = subprocess.run([sys.executable, "-m", "vitlab", "train", "--out", str(out), "--resume", "--workers",
                              "2"], env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stderr


def test_a_forked_child_does_not_keep_the_lock(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    lock = RunLock(out)
    ready, started = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: like a loader worker that outlives its parent
        os.write(started, b"1")  # the fork's handlers have run by now
        time.sleep(30)
        os._exit(0)
    assert os.read(ready, 1) == b"1"
    try:
        lock.release()  # the parent lets go (as its death would): the child must not be holding it
        RunLock(out).release()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_eval_never_replaces_a_metrics_json_it_did_not_write(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run(tiny(run_dir, steps=2))
    mine = tmp_path / "report"
    mine.mkdir()
    (mine / "metrics.json").write_text('{"my": "numbers"}\n')
    before = tree_hashes(mine)
    capsys.readouterr()
    assert main(["eval", "--weights", str(run_dir), "--data", "digits", "--out", str(mine)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{mine / 'metrics.json'} was not written by vitlab eval" in err
    assert tree_hashes(mine) == before
    # a folder of its own is written, and rewritten by the next evaluation
    ours = tmp_path / "eval"
    assert main(["eval", "--weights", str(run_dir), "--data", "digits", "--out", str(ours)]) == 0
    first = json.loads((ours / "metrics.json").read_text())
    assert first["written_by"] == "vitlab eval" and math.isfinite(first["top1"])
    assert main(["eval", "--weights", str(run_dir), "--data", "digits", "--out", str(ours), "--split", "train"]) == 0
    assert json.loads((ours / "metrics.json").read_text())["split"] == "train"


def test_experiment_report_without_results_keeps_the_report(tmp_path, capsys):
    report = tmp_path / "REPRODUCTION.md"
    shutil.copyfile(Path(__file__).parents[2] / "REPRODUCTION.md", report)
    before = hashlib.sha256(report.read_bytes()).hexdigest()
    assert campaign(["experiment", "report", "--out", str(tmp_path / "no-results"), "--report", str(report)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no full results" in err and "left unchanged" in err
    assert hashlib.sha256(report.read_bytes()).hexdigest() == before


def test_experiment_report_keeps_the_sections_it_has_no_results_for(tmp_path):
    """Results for one experiment only (runs/ is not committed; a new machine has few): the other sections keep
    their measured text and summary rows instead of turning into "pending"."""
    from reproduction.experiment import write_results
    from reproduction.report.report import write_report

    report = tmp_path / "REPRODUCTION.md"
    everything = tmp_path / "earlier-machine"  # a report measured in full, with the current designs
    for name in ("pilot", "data-scaling", "compute", "pos-embed", "token-vs-gap", "attention-distance", "mpp"):
        (everything / name).mkdir(parents=True)
        write_results(everything / name / "results.json", _fake_results(name, f"MEASURED-{name}"))  # sealed
    write_report(everything, report)
    previous = report.read_text()
    out = tmp_path / "results"
    results = _fake_results("mpp")
    (out / "mpp").mkdir(parents=True)
    write_results(out / "mpp" / "results.json", results)
    write_report(out, report)
    text = report.read_text()
    assert "MEASURED-BY-THE-TEST" in text
    for name in ("data-scaling", "compute", "pos-embed", "token-vs-gap", "attention-distance"):
        assert _section(text, name) == _section(previous, name)
        assert _summary(text, name) == _summary(previous, name)
    assert "Verdict: pending" not in text and "pending: no full run yet" not in text


def _section(text: str, name: str) -> str:
    start = text.index(f". {name}: ")
    end = text.index(f"<!-- /section:{name} -->", start)  # the report's sections end so
    return text[start:end]


def _summary(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {name} |"))


def _fake_results(name: str, measured: str = "MEASURED-BY-THE-TEST") -> dict:
    """Full results of `name`'s current design (a result of another design version is not reported as its)."""
    from reproduction.experiments import experiments

    design = experiments()[name].design
    return {"experiment": name, "mode": "full", "paper": "Section 4.6", "setup": "A setup.", "seeds": [0],
            "choices": {}, "command": f"vitlab experiment {name}", "wall_seconds": 60.0, "run_seconds": 60.0,
            "finished": "2026-12-01", "versions": {"vitlab": "0.1.0", "torch": "2.14.1"}, "tables": [],
            "figures": [], "measured": [measured], "design": design.to_dict() if design else None,
            "check": {"holds": False, "rule": "a rule", "details": ["a detail"]}}
