"""Sharded checkpoints of FSDP runs (torch.distributed.checkpoint): each process writes its shards into one step
folder that is atomic and verified by its manifest as a gathered one is; the folder resumes on 2 processes (bit for
bit) and on 1, converts to the run's gathered weights exactly, and loads with `vitlab.load`; gathered checkpoints
(a one-process run's, those written before shards) still resume, on more processes too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import vitlab
from tests.train.test_distributed import losses, single, torchrun
from vitlab.cli import main
from vitlab.files.rundir import (
    MANIFEST,
    STATE,
    WEIGHTS,
    is_sharded_checkpoint,
    latest_valid_checkpoint,
    verify_checkpoint,
)


def same_weights(a: Path, b: Path) -> bool:
    first, second = load_file(a), load_file(b)
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sharded") / "fsdp"
    torchrun(out, "--fsdp")
    return out


def test_an_fsdp_run_of_two_processes_writes_one_shard_file_per_process(sharded_run):
    for step in (10, 20):
        ckpt = sharded_run / "checkpoints" / f"step_{step:08d}"
        assert is_sharded_checkpoint(ckpt) and verify_checkpoint(ckpt) is None
        assert sorted(p.name for p in ckpt.iterdir()) == [MANIFEST, "shards", STATE]
        files = json.loads((ckpt / MANIFEST).read_text())["files"]
        assert sorted(files) == ["shards/.metadata", "shards/__0_0.distcp", "shards/__1_0.distcp", STATE]
    assert (sharded_run / WEIGHTS).is_file()  # the final weights stay one file
    assert not list((sharded_run / "checkpoints").glob(".step_*"))


def test_a_sharded_checkpoint_converts_and_loads_as_the_runs_gathered_weights(sharded_run, tmp_path):
    ckpt = sharded_run / "checkpoints" / "step_00000020"
    assert main(["convert", str(ckpt), str(tmp_path / "out.safetensors")]) == 0
    assert same_weights(tmp_path / "out.safetensors", sharded_run / WEIGHTS)  # saved from the same step-20 state
    model = vitlab.load(ckpt)
    final = load_file(sharded_run / WEIGHTS)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in final.items())
    assert len(model.class_names) == model.config.num_classes == 10


def test_a_damaged_shard_makes_resuming_fall_back_to_the_previous_checkpoint(sharded_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(sharded_run, run)
    shard = run / "checkpoints" / "step_00000020" / "shards" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert "does not match its checksum" in verify_checkpoint(shard.parent.parent)
    assert latest_valid_checkpoint(run).name == "step_00000010"


def test_a_sharded_checkpoint_resumes_on_two_processes_bit_for_bit_and_on_one(sharded_run, tmp_path):
    for world in (2, 1):
        run = tmp_path / f"on{world}"
        shutil.copytree(sharded_run, run)
        shutil.rmtree(run / "checkpoints" / "step_00000020")
        (run / WEIGHTS).unlink()
        if world == 2:
            done = torchrun(run, "--fsdp", "--resume")
            assert "resuming from" in done.stderr + done.stdout
            assert same_weights(run / WEIGHTS, sharded_run / WEIGHTS)
        else:
            single(run, "--fsdp", "--resume")  # the shards read whole into one process
            # one process sums the batch in another order than two: the curves agree, not the bits
            assert losses(run) == pytest.approx(losses(sharded_run), rel=1e-5)
            assert (run / "checkpoints" / "step_00000020" / WEIGHTS).is_file()  # one process writes gathered


@pytest.mark.slow
def test_a_gathered_checkpoint_resumes_on_two_fsdp_processes(tmp_path):
    """A one-process run's checkpoints (gathered: model.safetensors and the whole optimizer in state.pt, as every
    FSDP checkpoint was before shards) resume under FSDP on two processes, each taking its shards of them."""
    single(tmp_path / "one", "--fsdp")
    assert not is_sharded_checkpoint(tmp_path / "one" / "checkpoints" / "step_00000010")
    run = tmp_path / "resumed"
    shutil.copytree(tmp_path / "one", run)
    shutil.rmtree(run / "checkpoints" / "step_00000020")
    (run / WEIGHTS).unlink()
    torchrun(run, "--fsdp", "--resume")
    assert is_sharded_checkpoint(run / "checkpoints" / "step_00000020")
    assert losses(run) == pytest.approx(losses(tmp_path / "one"), rel=1e-5)


def test_async_save_writes_the_same_checkpoints_and_they_resume_bit_for_bit(sharded_run, tmp_path):
    """--async-save: the shards are written while training goes on, yet each step folder appears only sealed (its
    manifest verifies), holds what the in-place write holds, keep_last applies, no temporary folder stays, and a
    resume from it continues bit for bit."""
    out = tmp_path / "async"
    torchrun(out, "--fsdp", "--async-save", "--keep-last", "1")
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000020"]  # keep_last after the write
    ckpt = out / "checkpoints" / "step_00000020"
    assert is_sharded_checkpoint(ckpt) and verify_checkpoint(ckpt) is None
    assert main(["convert", str(ckpt), str(tmp_path / "async.safetensors")]) == 0
    assert same_weights(tmp_path / "async.safetensors", sharded_run / WEIGHTS)
    assert same_weights(out / WEIGHTS, sharded_run / WEIGHTS)
    assert losses(out) == losses(sharded_run)
    run = tmp_path / "resumed"
    shutil.copytree(sharded_run, run)
    shutil.rmtree(run / "checkpoints" / "step_00000020")
    (run / WEIGHTS).unlink()
    torchrun(run, "--fsdp", "--async-save", "--resume")
    assert same_weights(run / WEIGHTS, sharded_run / WEIGHTS)
