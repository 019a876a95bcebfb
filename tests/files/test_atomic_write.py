"""Untrusted files and output safety: a crafted config cannot make `load` allocate for it, a shard index cannot
name files outside its folder, written files follow the umask, and a killed writer's temporaries are cleaned."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

import vitlab
import vitlab.cli
from vitlab.errors import WeightsError
from vitlab.files.outputs import atomic_write
from vitlab.models import ViTConfig, build_model
from vitlab.weights.tensors import read_weights_folder

TINY = ViTConfig(image_size=16, patch_size=8, width=16, depth=1, mlp_dim=32, num_heads=2, num_classes=3)


def crafted_file(tmp_path, **config_changes):
    """A small vitlab file whose metadata declares a different architecture than its tensors hold."""
    model = build_model(TINY)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    config = {**TINY.to_dict(), **config_changes}
    path = tmp_path / "crafted.safetensors"
    save_file(tensors, str(path), metadata={"format": "vitlab", "config": json.dumps(config)})
    return path


def test_crafted_image_size_is_refused_before_building(tmp_path, capsys):
    path = crafted_file(tmp_path, image_size=[40000, 40000])  # a (1, 25M + 1, 16) position embedding: 1.6 GB
    # refused by the config's bounds, before any tensor shape is even compared
    with pytest.raises(WeightsError, match=r"image_size 40000x40000 is beyond vitlab's limit of 16,384 pixels"):
        vitlab.load(path)
    assert vitlab.cli.main(["info", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "image_size 40000x40000" in err


def test_crafted_depth_is_refused(tmp_path):
    with pytest.raises(WeightsError, match="missing tensors blocks.1"):
        vitlab.load(crafted_file(tmp_path, depth=2))


def test_shard_index_cannot_leave_its_folder(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    outside = tmp_path / "secret.safetensors"
    save_file({"w": torch.zeros(1)}, str(outside))
    for name in ("../secret.safetensors", str(outside)):
        index = {"weight_map": {"w": name}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        with pytest.raises(WeightsError, match="names a shard outside its folder"):
            read_weights_folder(folder, ("model.safetensors",))


def test_shard_index_symlink_out_of_folder_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    save_file({"w": torch.zeros(1)}, str(tmp_path / "elsewhere.safetensors"))
    (folder / "shard.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "shard.safetensors"}}))
    with pytest.raises(WeightsError, match="outside its folder"):
        read_weights_folder(folder, ("model.safetensors",))


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_follow_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = tmp_path / "m.safetensors"
        vitlab.save(build_model(TINY), path)
        export = tmp_path / "hf_export"
        from vitlab.weights.hf import write_hf

        write_hf(build_model(TINY), export)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == mode
    assert export.stat().st_mode & 0o777 == mode | ((mode & 0o444) >> 2)  # folders: x wherever r
    assert (export / "model.safetensors").stat().st_mode & 0o777 == mode


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporaries_of_a_killed_writer_are_removed_on_the_next_write(tmp_path):
    from vitlab.files.outputs import _host

    dead = _dead_pid()
    stale_file = tmp_path / f".model.safetensors.vitlab-tmp-{_host()}-{dead}-abc123"
    stale_dir = tmp_path / f".export.vitlab-tmp-{_host()}-{dead}-xyz"
    stale_file.write_bytes(b"x" * 1000)
    stale_dir.mkdir()
    (stale_dir / "model.safetensors").write_bytes(b"y")
    live = tmp_path / f".other.vitlab-tmp-{_host()}-{os.getppid()}-q"  # a running writer's: kept
    foreign = tmp_path / f".model.safetensors.vitlab-tmp-otherhost-{dead}-r"  # another machine's: kept
    user_file = tmp_path / ".model.safetensors.backup"  # not ours: kept
    for p in (live, foreign, user_file):
        p.write_text("keep")
    atomic_write(tmp_path / "new.txt", lambda tmp: open(tmp, "w").write("ok"))
    assert not stale_file.exists() and not stale_dir.exists()
    assert live.exists() and foreign.exists() and user_file.exists()
    assert (tmp_path / "new.txt").read_text() == "ok"


def test_failed_write_leaves_no_temporary_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "m.txt"
    path.write_text("old")

    def fail(tmp):
        open(tmp, "w").write("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(path, fail)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.txt"]
