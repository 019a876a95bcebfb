"""The finished tiny run the output and path tests write around: 2 steps, a checkpoint at step 2, trained once
per module."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TINY_TRAIN_FLAGS
from vitlab.cli import main


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trained") / "run"
    assert main(["-q", "train", "--out", str(out), *TINY_TRAIN_FLAGS, "--steps", "2", "--save-every", "2",
                 "--eval-every", "0"]) == 0
    return out
