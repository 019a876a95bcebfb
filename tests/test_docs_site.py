"""The documentation site reads offline, opened as files: the search index is inlined (the offline plugin), no
web fonts are requested, and the polyfill that lets search run from file:// is the site's own script, not one
fetched from the network."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_is_built_to_be_read_offline():
    pytest.importorskip("mkdocs")  # the hooks module is MkDocs's (the docs extra)
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "\n  - offline" in config and "font: false" in config
    spec = importlib.util.spec_from_file_location("mkdocs_hooks_site", ROOT / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = hooks
    spec.loader.exec_module(hooks)
    # what the offline plugin leaves in the config: a polyfill from unpkg.com
    config = SimpleNamespace(extra={"polyfills": ["https://unpkg.com/iframe-worker/shim"]})
    assert hooks.on_config(config).extra["polyfills"] == [hooks.FILE_WORKER]
    assert (ROOT / "docs" / hooks.FILE_WORKER).is_file()
