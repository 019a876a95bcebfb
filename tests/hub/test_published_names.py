"""A published name promises an architecture: a cache entry swapped for another architecture's file, or a
Hugging Face repository entry holding another one, is refused when read (vitlab.load, `vitlab info`, `vitlab eval`),
in one line naming the command that fetches the right file."""

from __future__ import annotations

import json

import pytest

import vitlab
from tests.weights.test_untrusted import TINY, hf_folder, one_line_error, sha256
from vitlab.errors import WeightsError
from vitlab.models import build_model


def test_a_swapped_cache_file_is_refused_for_its_published_name(tmp_path, monkeypatch, capsys):
    """A cache entry replaced by another architecture's file (record rewritten to match, so the size check
    passes) is refused when read: the name promises a ViT-Ti/16, the file holds something else."""
    from vitlab.hub import catalogue
    from vitlab.hub.cache import entry_path, write_meta
    from vitlab.hub.catalogue import Entry
    from vitlab.weights.jax_npz import write_jax_npz

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VITLAB_OFFLINE", "1")  # nothing may be downloaded
    entry = Entry(name="test:ViT-Ti/16", tag="test", model="ViT-Ti/16", format="jax-npz",
                  url="https://example.invalid/vit_models/ti16.npz", resolution=16, num_classes=3)
    real_entries, real_tags = catalogue.entries(), catalogue.tags()
    monkeypatch.setattr(catalogue, "entries", lambda: (*real_entries, entry))
    monkeypatch.setattr(catalogue, "tags", lambda: {**real_tags, "test": "a test checkpoint"})
    path = entry_path(entry)
    path.parent.mkdir(parents=True)
    write_jax_npz(build_model(TINY.replace(gelu="tanh")), path)  # not a ViT-Ti/16
    write_meta(path, {"name": entry.name, "model": entry.model, "size": path.stat().st_size, "sha256": None})
    before = sha256(path)
    with pytest.raises(WeightsError, match="but test:ViT-Ti/16 is a ViT-Ti/16"):
        vitlab.load("test:ViT-Ti/16")
    for argv in (["info", "test:ViT-Ti/16"], ["eval", "--weights", "test:ViT-Ti/16", "--data", "digits"]):
        one_line_error(capsys, argv, "width 32, not 192", "vitlab download test:ViT-Ti/16")
    assert sha256(path) == before


def test_a_hub_repository_of_another_architecture_is_refused_for_its_published_name(tmp_path, monkeypatch):
    """A Hugging Face repository entry (its files live in huggingface_hub's cache, without vitlab's record) is
    checked against its name's architecture by vitlab.load too."""
    import vitlab.hub
    from vitlab.hub import catalogue
    from vitlab.hub.catalogue import Entry

    entry = Entry(name="hf-hub:test/tiny", tag="hf-hub", model="ViT-Ti/16", format="hf", repo="test/tiny")
    real_entries = catalogue.entries()
    monkeypatch.setattr(catalogue, "entries", lambda: (*real_entries, entry))
    folder = hf_folder(tmp_path, json.dumps)  # TINY, not a ViT-Ti/16
    monkeypatch.setattr(vitlab.hub, "fetch", lambda e, **kw: folder if e.name == entry.name else None)
    with pytest.raises(WeightsError, match=r"holds ViT/8 .*width 32, not 192.*but hf-hub:test/tiny is a ViT-Ti/16"):
        vitlab.load("hf-hub:test/tiny")
