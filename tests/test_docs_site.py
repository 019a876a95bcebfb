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


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The documentation site as `mkdocs build` writes it."""
    pytest.importorskip("mkdocs")
    import subprocess

    out = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(out)], cwd=ROOT,
                   check=True, capture_output=True)
    return out


def _search(site: Path, query: str) -> list[str]:
    """The pages the site's search box lists for `query`, in order: Material's own search worker, run in Node on
    the built search index (tests/search_rank.js)."""
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js runs the site's search worker; it is not installed")
    done = subprocess.run([node, str(ROOT / "tests" / "search_rank.js"), str(site), query], check=True,
                          capture_output=True, text=True)
    return done.stdout.split()


@pytest.mark.slow
def test_the_search_for_onnx_lists_the_guides_before_the_generated_and_measured_pages(site):
    pages = _search(site, "onnx")
    assert pages[:2] == ["deployment.html", "tutorial.html"], pages
    for record in ("api.html", "benchmarks.html"):  # the ONNX_OPSET constant, the int8/ONNX measurement log
        assert pages.index(record) > pages.index("tutorial.html"), pages


def test_the_home_page_lists_the_tutorial():
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert "(tutorial.md)" in home
