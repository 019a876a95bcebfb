"""Files written by vitlab 0.1.0's layout (tests/data/layout-0.1.0, made by make_legacy.py there at commit
506e4c5) keep working: its weights load, and its preempted run resumes through the command line. Its steps 3-4 run
through today's model, whose last block computes every token (as timm's): with dropout the draws differ from the
code that wrote the uninterrupted twin, so the resume is held to resumed.safetensors, recorded by today's code."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

import vitlab
from vitlab.cli import main

DATA = Path(__file__).parents[1] / "data" / "layout-0.1.0"


def test_weights_written_before_load_with_their_config():
    model = vitlab.load(DATA / "uninterrupted.safetensors")
    assert (model.config.depth, model.config.width, model.config.image_size) == (1, 32, (8, 8))
    assert model(torch.rand(2, 3, 8, 8)).shape == (2, 10)


def test_a_preempted_run_written_before_resumes_to_the_recorded_weights(tmp_path):
    run = shutil.copytree(DATA / "preempted", tmp_path / "preempted")
    assert main(["-q", "train", "--out", str(run), "--resume"]) == 0
    resumed, expected = load_file(str(run / "model.safetensors")), load_file(str(DATA / "resumed.safetensors"))
    assert resumed.keys() == expected.keys()
    # bit-equal on the machine that wrote the fixture; other CPUs' kernels (AVX-512 or not) round the last bits of
    # four Adam steps differently, up to about 4e-6 here. 2e-5 still tells a resume apart from a restart: steps 3
    # and 4 move every tensor by more than 1e-3 (checked on the saved step-2 weights).
    before = load_file(str(DATA / "preempted" / "checkpoints" / "step_00000002" / "model.safetensors"))
    for key in expected:
        torch.testing.assert_close(resumed[key], expected[key], rtol=1e-5, atol=2e-5)
        assert (before[key] - expected[key]).abs().max() > 1e-3, key
    steps = [line for line in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    assert len(steps) == 4
