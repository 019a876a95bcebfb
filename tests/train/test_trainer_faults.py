"""What a user types or a disk does never loses a run: --out that is not a run, two trainings into one folder,
unwritable outputs found before step 1, a full disk mid-run, SIGTERM or Ctrl-C inside a long evaluation."""

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import TINY_TRAIN
from vitlab.cli import main
from vitlab.data import DataError
from vitlab.files.rundir import LOCK, verify_checkpoint
from vitlab.train import resolve_config, run
from vitlab.train.checkpoint import RunLock

TINY = {**TINY_TRAIN, "steps": 4, "eval_every": 2, "eval_batch_size": 8}


def tiny(out, **overrides):
    return resolve_config("demo", **{**TINY, "out": str(out), **overrides})


def hashes(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_out_that_is_not_a_run_is_refused_untouched(tmp_path, capsys):
    export = tmp_path / "hf_export"
    export.mkdir()
    (export / "config.json.bak").write_text("{}")
    (export / "model.safetensors").write_bytes(b"weights")
    before = hashes(export)
    assert main(["train", "--out", str(export), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not empty and not a vitlab run (it holds 'config.json.bak' and 1 more)" in err
    assert hashes(export) == before and sorted(p.name for p in export.iterdir()) == sorted(before)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert main(["train", "--out", str(a_file), "--steps", "1"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err and a_file.read_text() == "mine"


def test_unwritable_out_is_one_line_before_step_1(capsys):
    assert main(["train", "--out", "/sys/vitlab-run", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "vitlab train: error: cannot write to /sys/vitlab-run (Operation not permitted); choose a " \
                  "writable --out"


def test_two_trainings_into_one_folder_are_excluded(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = RunLock(out)  # another training, in this process: flock excludes a second open file description
    try:
        with pytest.raises(ValueError, match=rf"{out} is in use by another vitlab run \(process {os.getpid()}\)"):
            run(tiny(out))
    finally:
        holder.release()
    assert sorted(p.name for p in out.iterdir()) == [LOCK]  # nothing was written by the refused run


def test_a_killed_run_never_blocks_its_own_resume(tmp_path):
    out = tmp_path / "run"
    run(tiny(out, steps=2, eval_every=0))
    code = f"from vitlab.train.checkpoint import RunLock; from pathlib import Path; RunLock(Path({str(out)!r})); " \
           "print('locked', flush=True); import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    with pytest.raises(ValueError, match="in use by another vitlab run"):
        run(tiny(out, steps=3, eval_every=0, resume=True))
    proc.kill()  # kill -9: the OS drops the lock
    proc.wait()
    assert run(tiny(out, steps=3, eval_every=0, resume=True)).step == 3


def test_full_disk_mid_run_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    from vitlab.errors import OutputError
    from vitlab.train import checkpoint as ckpt

    out = tmp_path / "run"
    real_save = torch.save
    calls = {"n": 0}

    def save_then_fill_the_disk(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint's state.pt: the disk is full
            open(f, "wb").write(b"half")
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", save_then_fill_the_disk)
    with pytest.raises(OutputError, match=r"cannot write .*state\.pt \(No space left on device\) at step 4; the "
                                          r"last good checkpoint is .*step_00000002: free space"):
        run(tiny(out))
    left = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert left == ["step_00000002"]  # no half-written temporary directory
    assert verify_checkpoint(out / "checkpoints" / "step_00000002") is None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_inside_a_long_evaluation_saves_and_resumes_exactly(tmp_path, monkeypatch, signum):
    """The signal arrives while the validation set is being evaluated (one batch of 8 of 359 images done): the
    evaluation ends at the next batch, the finished step is saved, and resuming reproduces the uninterrupted run
    bit for bit."""
    from vitlab.data import transforms

    reference = run(tiny(tmp_path / "reference"))
    real_call = transforms.EvalTransform.__call__
    seen = {"n": 0}

    def signal_during_evaluation(self, img, rng=None):
        seen["n"] += 1
        if seen["n"] == 3:
            os.kill(os.getpid(), signum)
        return real_call(self, img, rng)

    monkeypatch.setattr(transforms.EvalTransform, "__call__", signal_during_evaluation)
    stopped = run(tiny(tmp_path / "run"))
    monkeypatch.undo()
    assert stopped.status == "preempted" and stopped.step == 2
    assert seen["n"] <= 16  # at most the batch in flight and the next: not the 359 images of the evaluation
    assert (tmp_path / "run" / "checkpoints" / "step_00000002").is_dir()
    resumed = run(tiny(tmp_path / "run", resume=True))
    assert resumed.status == "completed" and resumed.step == 4
    import vitlab

    a = vitlab.load(reference.weights).state_dict()
    b = vitlab.load(resumed.weights).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_to_a_cli_run_in_evaluation_exits_soon_with_a_checkpoint(tmp_path):
    """Through the command line, as a job scheduler sends it: exit code 143 (a preempted run is not a finished one),
    the resume command, a checkpoint at the step whose evaluation was running (the in-process test above shows the
    evaluation itself is cut short)."""
    out = tmp_path / "run"
    args = [sys.executable, "-m", "vitlab", "train", "--out", str(out), "--model", "ViT-Ti/4", "--depth", "1",
            "--width", "32", "--heads", "2", "--mlp-dim", "64", "--image-size", "8", "--batch-size", "32",
            "--steps", "50", "--warmup", "1", "--eval-every", "25", "--eval-batch-size", "1", "--workers", "0",
            "--log-every", "1"]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while not (out / "metrics.jsonl").exists() or "step 25" not in (out / "metrics.jsonl").read_text().replace(
            '"step": 25', "step 25"):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # the step-25 evaluation (359 batches of one image) has just begun
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "Traceback" not in stderr
    assert "preempted at step 25; continue with: vitlab train --out" in stdout
    assert (out / "checkpoints" / "step_00000025").is_dir()


def test_an_empty_training_split_is_one_line_and_exits(tmp_path, capsys):
    from PIL import Image

    for name in ("a", "b"):
        (tmp_path / "d" / "train" / name).mkdir(parents=True)
        (tmp_path / "d" / "val" / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "d" / "val" / name / "0.png")
    with pytest.raises(DataError):
        run(tiny(tmp_path / "run", data=str(tmp_path / "d")))


def test_torn_files_of_a_killed_run_do_not_block_its_resume(tmp_path, caplog):
    """kill -9 while appending to metrics.jsonl leaves a torn last line: resume drops it with a warning. A
    truncated config.json is named in one line."""
    out = tmp_path / "run"
    run(tiny(out, steps=2, eval_every=0))
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "split": "tra')
    with caplog.at_level("WARNING", logger="vitlab"):
        assert run(tiny(out, steps=3, eval_every=0, resume=True)).step == 3
    assert "dropped a torn last line" in caplog.text
    import json

    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 3
    (out / "config.json").write_text((out / "config.json").read_text()[:100])
    with pytest.raises(ValueError, match=r"config\.json: cannot read the stored run .*; it is damaged"):
        tiny(out, steps=4, resume=True)
