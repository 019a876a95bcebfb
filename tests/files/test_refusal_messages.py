"""Refusals name what the user named: a legacy (non-zip) torch.save file is weights to the output rule, so
--force does not replace it with a record; a write into an immutable folder names the file, never vitlab's
temporary beside it."""

from __future__ import annotations

import hashlib
import subprocess

import pytest
import torch

import vitlab
from vitlab.cli import main
from vitlab.files.marks import WEIGHTS, kind_of


def test_a_legacy_torch_save_file_is_weights_and_never_replaced_by_a_record(tmp_path, random_tiny_vit, noise_image,
                                                                           capsys):
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(3)}, legacy, _use_new_zipfile_serialization=False)
    assert kind_of(legacy).format == WEIGHTS
    weights = tmp_path / "w.safetensors"
    vitlab.save(random_tiny_vit(0), weights)
    before = hashlib.sha256(legacy.read_bytes()).hexdigest()
    image = noise_image(tmp_path / "x.png")
    assert main(["-q", "predict", "--weights", str(weights), str(image), "--json-out", str(legacy), "--force"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(legacy) in err[0] and "weights" in err[0], err
    assert hashlib.sha256(legacy.read_bytes()).hexdigest() == before


@pytest.fixture
def immutable(tmp_path):
    folder = tmp_path / "immutable"
    folder.mkdir()
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i needs root and a file system that supports it")
    yield folder
    subprocess.run(["chattr", "-i", str(folder)], capture_output=True)


@pytest.mark.parametrize("verb", ["export", "convert"])
def test_a_write_into_an_immutable_folder_names_the_file_not_a_temporary(tmp_path, random_tiny_vit, immutable,
                                                                        capsys, verb):
    weights = tmp_path / "w.safetensors"
    vitlab.save(random_tiny_vit(0), weights)
    target = immutable / ("x.onnx" if verb == "export" else "x.safetensors")
    assert main(["-q", verb, str(weights), str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"vitlab {verb}: error: {target}: Operation not permitted; check the permissions, or write "
                   "elsewhere"], err
    assert list(immutable.iterdir()) == []
