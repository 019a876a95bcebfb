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


def count_calls(monkeypatch, name: str, original, wanted=lambda path: True) -> list[Path]:
    """Every call of the function `original` (named `name`) on a path `wanted` accepts, whichever module calls it:
    each vitlab module that holds the function (imported at its top or read at call time) gets a counting
    wrapper."""
    calls: list[Path] = []

    def counting(path, *args, **kwargs):
        if wanted(Path(path)):
            calls.append(Path(path))
        return original(path, *args, **kwargs)

    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("vitlab") and getattr(module, name, None) is original:
            monkeypatch.setattr(module, name, counting)
    return calls


def count_verifications(monkeypatch, original) -> list[Path]:
    """Every call of the manifest check."""
    return count_calls(monkeypatch, "verify_checkpoint", original)


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


def count_weight_reads(monkeypatch, weights: Path) -> list[Path]:
    """Every read of the file `weights` through the weights reader, whichever vitlab module calls it."""
    from vitlab.weights import load as weights_load

    return count_calls(monkeypatch, "read_weights", weights_load.read_weights,
                       lambda path: path.resolve() == weights.resolve())


TINY_FINETUNE = ["--data", "digits", "--steps", "2", "--batch-size", "8", "--workers", "0", "--eval-every", "0"]


def _tiny_weights(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    weights = tmp_path / "init.safetensors"
    vitlab.save(vitlab.create_model("ViT-Ti/4", image_size=8, **TINY_VIT_ARGS, num_classes=10), weights)
    return weights


def _keep_only_config(run: Path) -> None:
    """The run as a stop before its first checkpoint leaves it: its config.json and nothing else."""
    import shutil

    for path in run.iterdir():
        if path.name != "config.json":
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def test_each_way_to_start_from_init_reads_the_weights_once(tmp_path, monkeypatch, capsys):
    import vitlab.train.trainer  # noqa: F401  (the trainer's module is patched too)

    weights = _tiny_weights(tmp_path)
    calls = count_weight_reads(monkeypatch, weights)
    run = tmp_path / "run"
    for argv in (["--print-config"], ["--print-config", "json"], []):
        calls.clear()
        assert main(["finetune", "--init", str(weights), "--out", str(run), *TINY_FINETUNE, *argv]) == 0
        assert len(calls) == 1, (argv, calls)
    _keep_only_config(run)  # resumed without a checkpoint: the model starts from --init again, read once
    calls.clear()
    assert main(["finetune", "--out", str(run), "--resume", "--steps", "3"]) == 0, capsys.readouterr().err
    assert len(calls) == 1, calls
    calls.clear()
    vitlab.fit("finetune", init=str(weights), data="digits", steps=1, batch_size=8, workers=0, eval_every=0,
               out=str(tmp_path / "fit"), progress=False)
    assert len(calls) == 1, calls


def test_a_resumed_sweep_reads_its_initial_weights_once_for_all_its_runs(tmp_path, monkeypatch, capsys):
    import vitlab.train.trainer  # noqa: F401

    weights = _tiny_weights(tmp_path)
    calls = count_weight_reads(monkeypatch, weights)
    sweep = tmp_path / "sweep"
    argv = ["finetune", "--init", str(weights), "--out", str(sweep), *TINY_FINETUNE, "--lr-sweep", "0.01,0.03",
            "--dev-fraction", "0.2"]
    assert main(argv) == 0, capsys.readouterr().err
    assert len(calls) == 1, calls
    for run in sweep.glob("lr_*"):  # stopped before any run's first checkpoint
        _keep_only_config(run)
    for path in sweep.iterdir():
        if path.is_file():
            path.unlink()
    calls.clear()
    assert main([*argv, "--resume"]) == 0, capsys.readouterr().err  # the same command continues it
    assert len(calls) == 1, calls
