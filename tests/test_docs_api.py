"""The Python API reference (docs/api.md) documents every public name: each of `vitlab.__all__` has its own entry,
and the second tier, generated at build time from the subpackages' `__all__`, names every one of their exports."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

import vitlab

ROOT = Path(__file__).resolve().parents[1]


def _hooks():
    pytest.importorskip("mkdocs")  # the hooks module is MkDocs's (the docs extra)
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "mkdocs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_entry_point_and_config_has_an_entry():
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    entries = set(re.findall(r"^(?:::: |<!-- fields: )([\w.]+)", page, flags=re.M))
    for name in set(vitlab.__all__) - {"__version__"}:
        assert f"vitlab.{name}" in entries, name
    for config in ("ViTConfig", "BiTConfig", "ResNetConfig"):
        assert f"vitlab.models.config.{config}" in entries, config
    assert "<!-- second-tier -->" in page and "<!-- train-settings -->" in page


def test_the_second_tier_names_every_export_of_every_documented_subpackage():
    hooks = _hooks()
    text = hooks.second_tier_markdown()
    for package in hooks.SECOND_TIER:
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
                assert f"::: {value.__module__}.{value.__qualname__}\n" in text, f"{package}.{name}"
            else:
                assert f"`{package}.{name}`" in text, f"{package}.{name}"
    for module in hooks.BOTTOM_MODULES:
        assert f"::: {module}\n" in text, module


def test_every_training_setting_and_config_field_has_a_row_with_its_meaning():
    import dataclasses

    from vitlab.cli.reference import fields_markdown, train_settings_markdown
    from vitlab.models.config import ViTConfig
    from vitlab.train.config import TrainConfig

    settings = train_settings_markdown()
    for f in dataclasses.fields(TrainConfig):
        row = next((line for line in settings.splitlines() if line.startswith(f"| `{f.name}`")), None)
        assert row is not None, f"TrainConfig.{f.name} missing from the training settings"
    assert "| `weight_decay` (`--wd`) |" in settings and "| `lora_rank` (`--lora`) |" in settings
    vit = fields_markdown(ViTConfig)
    for f in dataclasses.fields(ViTConfig):
        row = next(line for line in vit.splitlines() if line.startswith(f"| `{f.name}` |"))
        assert row.rstrip(" |").rsplit("|", 1)[1].strip(), f"ViTConfig.{f.name} has no meaning in the table"


def test_the_field_tables_follow_the_class():
    # Generated, not transcribed: a field added to a dataclass appears with its comment.
    from dataclasses import dataclass

    from vitlab.cli.reference import fields_markdown

    @dataclass
    class Settings:
        depth: int = 2  # blocks in the encoder
        # a group heading, not a field's meaning
        brand_new: float = 0.5  # a field no page mentions,
        # continued on the next line

    table = fields_markdown(Settings)
    assert "| `depth` | `int` | `2` | blocks in the encoder |" in table
    assert "| `brand_new` | `float` | `0.5` | a field no page mentions, continued on the next line |" in table
