"""Checkpoints and recovery: SIGTERM preemption, kill -9 then --resume bit for bit, damaged checkpoints."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import vitlab
from tests.conftest import TINY_TRAIN
from vitlab.files.rundir import list_checkpoints, verify_checkpoint
from vitlab.train import resolve_config, run


def tiny(out, **overrides):
    base = {**TINY_TRAIN, "out": str(out), "steps": 8, "eval_every": 0, "save_every": 2, "keep_last": 3,
            "dropout": 0.1}
    return resolve_config("demo", **{**base, **overrides})


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_file(str(a)), load_file(str(b))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sigterm_saves_and_resume_is_exact(tmp_path, sigterm_during_step):
    """In-process preemption at step 3 (dropout on, so the RNG state must be restored too)."""
    reference = run(tiny(tmp_path / "ref"))
    with sigterm_during_step(3):
        first = run(tiny(tmp_path / "run"))
    assert (first.status, first.step) == ("preempted", 3)
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000003"
    assert verify_checkpoint(ckpt) is None and vitlab.load(ckpt / "model.safetensors").config.depth == 1
    resumed = run(tiny(tmp_path / "run", resume=True))
    assert resumed.status == "completed"
    assert same_weights(reference.weights, resumed.weights)
    steps = [r for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"train"' in r]
    assert len(steps) == 8  # the resumed run continued the log, no step twice


def test_damaged_checkpoint_falls_back_to_previous(tmp_path, caplog):
    reference = run(tiny(tmp_path / "run"))
    final = load_file(str(reference.weights))
    newest = list_checkpoints(tmp_path / "run")[0]
    assert newest.name == "step_00000008"
    path = newest / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])  # truncated on purpose
    with caplog.at_level(logging.INFO):
        resumed = run(tiny(tmp_path / "run", resume=True))
    assert "step_00000008 is damaged (model.safetensors has" in caplog.text and "truncated" in caplog.text
    assert "resuming from" in caplog.text and "step_00000006" in caplog.text
    again = load_file(str(resumed.weights))
    assert all(torch.equal(final[k], again[k]) for k in final)


def _cli(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "vitlab", "train", "--out", str(out), "--model", "ViT-Ti/4", "--depth", "1",
            "--width", "32", "--heads", "2", "--mlp-dim", "64", "--image-size", "8", "--batch-size", "32",
            "--steps", "300", "--warmup", "10", "--eval-every", "0", "--save-every", "20", "--log-every", "100",
            "--workers", "0", "--dropout", "0.1", *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _start_and_signal(out: Path, sig: int, after_step: int, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Start a CLI run and send `sig` once the checkpoint of `after_step` exists."""
    return signal_at_checkpoint(_cli(out, *extra), _env(), out, sig, after_step)


def signal_at_checkpoint(cmd: list[str], env: dict[str, str], out: Path, sig: int,
                         after_step: int) -> subprocess.CompletedProcess:
    """Run `cmd` (a training into `out`) and send `sig` once the checkpoint of `after_step` exists."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    target = out / "checkpoints" / f"step_{after_step:08d}"
    deadline = time.monotonic() + 120
    while not target.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, f"the run ended before it could be interrupted: {proc.communicate()}"
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _reference_in_process(out: Path, *extra: str) -> None:
    """The uninterrupted run, here rather than in one more subprocess; one thread like the CLI runs, since
    the float32 kernels' summation order may depend on the thread count."""
    from vitlab.cli import build_parser
    from vitlab.cli.train import build_config

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run(build_config(build_parser().parse_args(_cli(out, *extra)[3:])))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("source", ["digits", "shards"])
def test_kill_then_resume_equals_uninterrupted_run(tmp_path, monkeypatch, source):
    """kill -9 mid-run, then --resume: the weights of the uninterrupted run, bit for bit. On shards the order
    is a stream (vitlab.data.stream) read by two loader workers, each loading its part of every step."""
    # The run sets its thread count from the CPUs unless OMP_NUM_THREADS is set: pin it like the subprocesses'.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    extra: tuple[str, ...] = ()
    if source == "shards":
        from tests.data.test_shards import make_source
        from vitlab.data.pack import pack_shards

        src, _ = make_source(tmp_path / "src", per_class=11, corrupt=False)
        pack_shards(src, tmp_path / "shards", shard_size=4000)
        extra = ("--data", str(tmp_path / "shards"), "--workers", "2")
    _reference_in_process(tmp_path / "ref", *extra)
    killed = _start_and_signal(tmp_path / "run", signal.SIGKILL, after_step=40, extra=extra)
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "run" / "model.safetensors").exists()
    resumed = subprocess.run(_cli(tmp_path / "run", "--resume", *extra), env=_env(), capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stderr
    assert same_weights(tmp_path / "ref" / "model.safetensors", tmp_path / "run" / "model.safetensors")
    # logged every 100 steps, checkpoints every 20: the mean of steps 41-100 resumes from the checkpoint's sum
    logged = _train_losses(tmp_path / "ref")
    assert _train_losses(tmp_path / "run") == logged and len(logged) == 3


def _train_losses(run_dir: Path) -> list[tuple[int, float]]:
    import json

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r.get("split") == "train"]


def test_sigterm_leaves_a_loadable_checkpoint(tmp_path):
    done = _start_and_signal(tmp_path / "run", signal.SIGTERM, after_step=20)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr  # preempted, not finished: a scheduler requeues it
    assert "preempted at step" in done.stdout and "--resume" in done.stdout
    newest = list_checkpoints(tmp_path / "run")[0]
    assert verify_checkpoint(newest) is None
    step = int(newest.name.split("_")[1])
    assert 20 <= step < 300
    model = vitlab.load(newest / "model.safetensors")
    assert model.class_names == [str(d) for d in range(10)]


@pytest.mark.parametrize("missing", ["manifest.json", "state.pt"])
def test_incomplete_checkpoint_is_not_used(tmp_path, missing):
    run(tiny(tmp_path / "run", steps=4))
    newest = list_checkpoints(tmp_path / "run")[0]
    (newest / missing).unlink()
    assert verify_checkpoint(newest) is not None
    resumed = run(tiny(tmp_path / "run", steps=4, resume=True))
    assert resumed.step == 4


def test_resume_on_other_classes_is_refused(tmp_path):
    """Another --data is refused when the settings are resolved; the same folder whose classes changed since is
    refused when the checkpoint is read."""
    from PIL import Image

    from vitlab.data import DataError

    def make(names):
        for split in ("train", "val"):
            for name in names:
                (tmp_path / "data" / split / name).mkdir(parents=True)
                for i in range(3):
                    Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(tmp_path / "data" / split / name / f"{i}.png")

    make(("a", "b"))
    data = str(tmp_path / "data")
    run(tiny(tmp_path / "run", steps=2, data=data, batch_size=2))
    with pytest.raises(ValueError, match=r"--data .*digits contradicts the run in .*run \(stored: .*data\)"):
        tiny(tmp_path / "run", steps=4, resume=True, data="digits", batch_size=2)
    shutil.rmtree(tmp_path / "data")
    make(("x", "y"))
    with pytest.raises(DataError, match=r"the classes of .*data differ from those of checkpoint .*step_00000002 "
                                        r"\(a, b\); resume on the same data"):
        run(tiny(tmp_path / "run", steps=4, resume=True, data=data, batch_size=2))


def test_resume_of_a_finished_run_only_evaluates(tmp_path):
    first = run(tiny(tmp_path / "run", steps=2))
    log = (tmp_path / "run" / "metrics.jsonl").read_text()
    again = run(tiny(tmp_path / "run", steps=2, resume=True))
    assert again.step == 2 and again.metrics == first.metrics
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == log
