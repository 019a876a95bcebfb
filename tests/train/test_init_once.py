"""`vitlab finetune --init RUN` locates and verifies its initial weights once: the resolution step finds the run's
newest intact checkpoint (its manifest checked: size and SHA-256 of every file) and the model is built from that
same read, so a large checkpoint is never hashed twice before step 1."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import vitlab
from tests.conftest import TINY_VIT_ARGS
from vitlab.cli import main
from vitlab.files import rundir
from vitlab.train.checkpoint import write_checkpoint

DIGITS = [str(i) for i in range(10)]


def count_verifications(monkeypatch, original) -> list[Path]:
    """Every call of the manifest check, whichever module calls it: each vitlab module that holds the function
    (imported at its top or read at call time) gets a counting wrapper."""
    calls: list[Path] = []

    def counting(path, *args, **kwargs):
        calls.append(Path(path))
        return original(path, *args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("vitlab") and getattr(module, "verify_checkpoint", None) is original:
            monkeypatch.setattr(module, "verify_checkpoint", counting)
    return calls


def test_finetune_from_a_run_directory_verifies_its_checkpoint_once(tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    source = vitlab.create_model("ViT-Ti/4", image_size=8, **TINY_VIT_ARGS, num_classes=10)
    run = tmp_path / "pretrained"  # a run with checkpoints and no final weights yet: --init means its newest one
    for step in (2, 4):
        write_checkpoint(run, step, source.state_dict(), source.config, DIGITS, {"step": step})
    calls = count_verifications(monkeypatch, rundir.verify_checkpoint)
    code = main(["finetune", "--init", str(run), "--data", "digits", "--out", str(tmp_path / "ft"), "--steps", "1",
                 "--batch-size", "8", "--workers", "0", "--eval-every", "0"])
    assert code == 0, capsys.readouterr().err
    of_init = [p for p in calls if run in p.parents]
    assert of_init == [rundir.step_dir(run, 4)], of_init  # the newest, checked exactly once
