"""`vitlab experiment` stops its runs on SIGTERM and Ctrl-C at the next step with a checkpoint and exits 143 / 130,
leaving no process behind, whether the runs train side by side or one after the other in their own process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.test_distributed_signals import alive, descendants, trained_a_step, wait_until

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process trees from /proc")

REPO = Path(__file__).resolve().parents[2]
TINY = ("{'model': 'ViT-Ti/4', 'model_args': {'depth': 1, 'width': 32, 'num_heads': 2, 'mlp_dim': 64}, "
        "'data': 'digits', 'image_size': 8, 'batch_size': 8, 'steps': 100000, 'eval_every': 0, 'log_every': 1, "
        "'workers': 0, 'lr': 0.001}")

# `vitlab experiment pilot` with the pilot replaced by two runs too long to finish: the command line as users run it
EXPERIMENT_SCRIPT = f"""
import sys
import reproduction.experiments as package
from reproduction.cli import main
from reproduction.estimate import CostModel, StepTime
from reproduction.experiment import Experiment
from reproduction.spec import RunSpec

CostModel.step_time = lambda self, spec: StepTime(0.01, 0.001)  # no timing of models before the runs


def plan(ctx):
    return [ctx.run(RunSpec(f"long-s{{seed}}", "demo", {{**{TINY}, "seed": seed}})) for seed in (0, 1)]


def analyze(ctx, records, out):
    return {{"tables": [], "figures": [], "measured": [], "check": {{"holds": True, "rule": "none", "details": []}}}}


if __name__ == "__main__":  # the workers are spawned: they import this file as a module
    real = package.experiments
    package.experiments = lambda: {{**real(), "pilot": Experiment("pilot", "Long", "-", "-", "two long runs", plan,
                                                                 analyze, (0,))}}
    sys.exit(main(sys.argv[1:]))
"""


def run_dirs(out: Path) -> list[Path]:
    runs = out / "_runs"
    return sorted(runs.iterdir()) if runs.is_dir() else []


def signal_the_experiment(tmp_path: Path, signum: int, jobs: int) -> tuple[subprocess.CompletedProcess, set[int]]:
    script = tmp_path / "experiment.py"
    script.write_text(EXPERIMENT_SCRIPT)
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}  # the campaign sits beside src/
    cmd = [sys.executable, str(script), "-q", "experiment", "pilot", "--quick", "--out", str(out), "--jobs", str(jobs)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = jobs  # side by side: both runs; one after the other: the first
        wait_until(lambda: sum(trained_a_step(d) for d in run_dirs(out)) >= started, 240, "the runs to train")
        below = descendants(proc.pid)
        os.kill(proc.pid, signum)
        stdout, stderr = proc.communicate(timeout=120)  # before the fix: runs went on for 100,000 steps
    finally:
        if proc.poll() is None:
            for pid in descendants(proc.pid):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), below


def check_stopped_with_checkpoints(done: subprocess.CompletedProcess, below: set[int], out: Path, code: int,
                                   name: str, runs: int) -> None:
    assert done.returncode == code, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("vitlab experiment:")]
    assert lines == [f"vitlab experiment: stopped by {name}: the runs in progress stopped at a checkpoint; run the "
                     "same command again to continue"], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    started = [d for d in run_dirs(out) if trained_a_step(d)]
    assert len(started) == runs
    for run_dir in started:  # stopped at a step with what resume needs, not finished
        checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
        assert checkpoints and all((checkpoints[-1] / f).is_file() for f in ("manifest.json", "state.pt"))
        assert 0 < int(checkpoints[-1].name.split("_")[1]) < 100_000
        assert not (run_dir / "result.json").exists() and not (run_dir / "model.safetensors").exists()
    # the workers (and their helpers) went with the command
    wait_until(lambda: not any(alive(pid) for pid in below), 10, f"processes {sorted(below)} to end")


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_experiment_runs_side_by_side_stop_with_checkpoints_on_a_signal(tmp_path, signum, code):
    done, below = signal_the_experiment(tmp_path, signum, jobs=2)
    assert len(below) >= 2  # the two workers were running
    check_stopped_with_checkpoints(done, below, tmp_path / "out", code, signal.Signals(signum).name, runs=2)


@pytest.mark.slow
def test_experiment_run_in_its_own_process_stops_with_a_checkpoint_on_sigterm(tmp_path):
    done, below = signal_the_experiment(tmp_path, signal.SIGTERM, jobs=1)
    check_stopped_with_checkpoints(done, below, tmp_path / "out", 143, "SIGTERM", runs=1)
