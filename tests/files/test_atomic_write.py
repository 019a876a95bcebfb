"""Writing files (vitlab.files.outputs.atomic_write and what writes through it): written files and folders follow
the umask, a killed writer's temporaries are cleaned on the next write (a live or another host's are kept), and a
failed write leaves no temporary and the old file as it was."""

import os
import subprocess
import sys

import pytest

import vitlab
import vitlab.cli
from vitlab.files.outputs import atomic_write
from vitlab.models import ViTConfig, build_model

TINY = ViTConfig(image_size=16, patch_size=8, width=16, depth=1, mlp_dim=32, num_heads=2, num_classes=3)


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
