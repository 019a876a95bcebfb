"""The allocator tuning every computing verb starts with, its opt-out, and the allocator the process reports."""

from __future__ import annotations

import pytest

import vitlab.runtime.allocator as allocator
from vitlab.cli import main

GLIBC_MAPS = """\
7f0000000000-7f0000028000 r--p 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1000000000-7f1000001000 r-xp 00000000 08:01 2 /usr/lib/python3.12/lib-dynload/_ctypes.so
7f2000000000-7f2000001000 rw-p 00000000 00:00 0
"""
TCMALLOC_MAPS = GLIBC_MAPS + "7f3000000000-7f3000020000 r-xp 00000000 08:01 3 " \
                             "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.16\n"
JEMALLOC_MAPS = GLIBC_MAPS + "7f3000000000-7f3000020000 r-xp 00000000 08:01 3 " \
                             "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """The glibc tuning recorded instead of applied, from an untuned state and with no allocator preloaded."""
    made: list[str] = []
    monkeypatch.setattr(allocator, "_tuned", False)
    monkeypatch.setattr(allocator, "tune_malloc", lambda: made.append("tuned") or True)
    monkeypatch.setattr(allocator, "preloaded_allocator", lambda maps_text=None: None)
    monkeypatch.delenv(allocator.TUNING_ENV, raising=False)
    return made


def test_a_preloaded_allocator_is_named_from_the_maps():
    assert allocator.preloaded_allocator(GLIBC_MAPS) is None
    assert allocator.preloaded_allocator(TCMALLOC_MAPS) == "tcmalloc"
    assert allocator.preloaded_allocator(JEMALLOC_MAPS) == "jemalloc"
    assert allocator.allocator_name(TCMALLOC_MAPS) == "tcmalloc (preloaded)"


def test_glibc_is_named_tuned_or_default(monkeypatch):
    monkeypatch.setattr(allocator, "_tuned", False)
    assert allocator.allocator_name(GLIBC_MAPS) == "glibc default"
    monkeypatch.setattr(allocator, "_tuned", True)
    assert allocator.allocator_name(GLIBC_MAPS) == "glibc tuned (no mmap, no trim)"


def test_tuning_applies_unless_the_environment_opts_out(calls, monkeypatch):
    allocator.tune_for_compute()
    assert calls == ["tuned"]
    for off in ("0", "false", "OFF"):
        monkeypatch.setenv(allocator.TUNING_ENV, off)
        allocator.tune_for_compute()
    assert calls == ["tuned"]


def test_a_preloaded_allocator_is_left_alone(calls, monkeypatch):
    monkeypatch.setattr(allocator, "preloaded_allocator", lambda maps_text=None: "tcmalloc")
    allocator.tune_for_compute()
    assert calls == []


def test_the_real_tuning_is_reported():
    """glibc's mallopt accepts both settings on the Linux this runs on, and the process then says so."""
    if allocator.preloaded_allocator() is not None:
        pytest.skip("an allocator is preloaded")
    assert allocator.tune_malloc()
    assert allocator.allocator_name() == allocator.GLIBC_TUNED


@pytest.mark.parametrize("argv", [["predict", "missing.png", "--weights", "missing.safetensors"],
                                  ["eval", "--weights", "missing.safetensors", "--data", "digits"]])
def test_computing_verbs_start_tuned(calls, argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(argv)  # refused for the missing file; the tuning comes first
    assert calls == ["tuned"]


def test_listing_verbs_leave_the_allocator(calls, capsys):
    assert main(["models"]) == 0
    assert calls == []
