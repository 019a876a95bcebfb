"""Every test in this folder checks vitlab against an independent implementation (timm, transformers, the
official JAX code's numerics, the reference pre-processing pipelines): each carries the `parity` marker, so
`pytest -m parity` runs them wherever they live (cases in other folders are marked one by one)."""

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.parity)
