"""Tiny models, settings and runs shared by the library's tests. The constants are for module-level tables and
helpers (import them from `tests.conftest`: a run's settings are resolve_config("demo", **TINY_TRAIN, out=...,
steps=...), its command line `vitlab train --out ... *TINY_TRAIN_FLAGS`); the fixtures give each test its own
object. A file that needs other values keeps its own: these are the ones many files use as they are."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

# ViT-Ti/4 made tiny: one 32-wide block; on 8x8 digits a training step takes milliseconds.
TINY_VIT_ARGS = {"depth": 1, "width": 32, "num_heads": 2, "mlp_dim": 64}
TINY_VIT_FLAGS = ["--model", "ViT-Ti/4", "--depth", "1", "--width", "32", "--heads", "2", "--mlp-dim", "64"]
TINY_TRAIN = {"model": "ViT-Ti/4", "model_args": TINY_VIT_ARGS, "image_size": 8, "batch_size": 32, "warmup": 1,
              "log_every": 1, "workers": 0, "eval_batch_size": 512}
TINY_TRAIN_FLAGS = [*TINY_VIT_FLAGS, "--image-size", "8", "--batch-size", "32", "--warmup", "1", "--workers", "0",
                    "--log-every", "1"]


@pytest.fixture
def tiny_vit_config():
    """The tiny ViT's config for the 10 digits at 8x8 (vitlab.models.build_model builds it)."""
    from vitlab.models import ViTConfig

    return ViTConfig(image_size=8, patch_size=4, num_classes=10, **TINY_VIT_ARGS)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """One finished 3-step `vitlab train` run of the tiny model on the embedded digits, trained once per test
    process: tests that read it share it; a test that changes it works on a copy."""
    from vitlab.cli import main

    out = tmp_path_factory.mktemp("tiny_run") / "run"
    assert main(["train", "--out", str(out), "--steps", "3", *TINY_TRAIN_FLAGS]) == 0
    return out


@pytest.fixture
def random_tiny_vit():
    """`random_tiny_vit(seed, **create_model_kwargs)`: a small ViT (16x16 inputs, patch 4, width 32, 3 classes)
    with random weights everywhere, in eval mode; a zero-initialised head would hide mixed-up files."""
    import vitlab

    def make(seed: int, **kw) -> torch.nn.Module:
        kw = {"image_size": 16, "patch_size": 4, "width": 32, "depth": 1, "mlp_dim": 64, "num_heads": 2,
              "num_classes": 3, **kw}  # fmt: skip
        model = vitlab.create_model("ViT-Ti/16", **kw)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        return model.eval()

    return make


@pytest.fixture
def noise_image():
    """`noise_image(path, size=(W, H), seed=0)`: writes an RGB image of uniform noise (its format from the suffix)
    and returns the path."""

    def write(path: Path, size: tuple[int, int] = (40, 30), seed: int = 0) -> Path:
        rng = np.random.default_rng(seed)
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
        return path

    return write


@pytest.fixture
def small_mount(tmp_path):
    """make(read_only=False): an empty 16 KiB tmpfs (smaller than any export of the tiny models), optionally
    remounted read-only."""
    mounted: list[Path] = []

    def make(read_only: bool = False, size: str = "16k") -> Path:
        target = tmp_path / f"mnt{len(mounted)}"
        target.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)],
                              capture_output=True)
        if done.returncode != 0:
            pytest.skip("mounting a small tmpfs needs root (full-disk and read-only cases)")
        mounted.append(target)
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(target)], check=True, capture_output=True)
        return target

    yield make
    for target in mounted:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


@pytest.fixture
def compiles(monkeypatch) -> list[dict]:
    """The keyword arguments of every torch.compile call, each compiled with dynamo's eager backend (traced, not
    code-generated: seconds, no C++)."""
    calls: list[dict] = []
    real = torch.compile

    def spy(model, **kwargs):
        calls.append(kwargs)
        return real(model, backend="eager")

    monkeypatch.setattr(torch, "compile", spy)
    return calls
