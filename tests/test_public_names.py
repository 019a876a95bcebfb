"""`dir(vitlab)` is the public surface: every name in `__all__`, the configuration classes, the subpackages and the
module's dunders, never a name vitlab/__init__.py only uses itself (Any, TYPE_CHECKING)."""

import importlib
import types

import vitlab


def test_dir_lists_the_public_names_only():
    importlib.import_module("vitlab.train")  # a loaded subpackage is an attribute, and listed

    names = set(dir(vitlab))
    assert set(vitlab.__all__) <= names
    subpackages = {n for n in names if isinstance(getattr(vitlab, n), types.ModuleType)}
    assert "train" in subpackages
    configs = {"ViTConfig", "BiTConfig", "ResNetConfig"}  # importable by name, left out of help(vitlab)
    assert configs <= names
    dunders = {n for n in names if n.startswith("__") and n.endswith("__")}
    assert names - set(vitlab.__all__) - subpackages - dunders == configs
