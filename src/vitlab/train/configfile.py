"""A `--config FILE` (a run's config.json, or JSON / YAML of TrainConfig fields) read as untrusted input, and
the type check every layer of settings passes before any rule does arithmetic on it.

A settings file is a few kilobytes of plain values: it is refused, in one line naming the file, when it is
larger than MAX_BYTES, nested deeper than the parser can follow, or uses YAML aliases (`*name`: a 400-byte
"billion laughs" file expands to 10^9 values). Values of the wrong type (`steps: "4"`, `steps: [1, 2]`) are
refused by name before they reach the warm-up rule or the banner.
"""

from __future__ import annotations

import functools
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitlab.train.config import TrainConfig

MAX_BYTES = 1 << 20  # a run's config.json is about 4 KB; a megabyte of settings is not a settings file


def parse_settings(path: str) -> Any:
    """The parsed content of a --config file (JSON, or YAML for .yaml / .yml); ValueError naming the file."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise ValueError(f"--config {path}: {size:,} bytes, more than a settings file holds (limit "
                             f"{MAX_BYTES:,}); pass a run's config.json or a short JSON / YAML file")
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"--config {path}: cannot read it ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise ValueError(f"--config {path}: not a text file (not UTF-8)") from None
    kind = "YAML" if p.suffix in (".yaml", ".yml") else "JSON"
    try:
        return _load_yaml(text) if kind == "YAML" else json.loads(text)
    except RecursionError:
        raise ValueError(f"--config {path}: nested too deeply to be a settings file") from None
    except _AliasError:
        raise ValueError(f"--config {path}: uses YAML aliases (*name); write each value out (aliases let a few "
                         "bytes expand to billions of values, so settings files may not use them)") from None
    except Exception as err:  # json and yaml raise their own error types
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"--config {path}: not valid {kind} ({first})") from None


class _AliasError(Exception):
    pass


def _load_yaml(text: str) -> Any:
    """yaml.safe_load with aliases refused while composing, before anything is expanded."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise _AliasError
            return super().compose_node(parent, index)

    return yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 (a SafeLoader subclass)


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def check_types(values: Mapping[str, Any], where: str) -> None:
    """ValueError naming the first setting whose value is not of its TrainConfig field's type (unknown keys are
    left to the caller). Ranges and choices are vitlab.train.config.validate's."""
    hints = _field_types()
    for key, value in values.items():
        hint = hints.get(key)
        if hint is None or _matches(value, hint):
            continue
        hint_text = ""
        if isinstance(value, str) and _is_number_text(value) and _describe(hint) in ("an integer", "a number"):
            # quoted, or YAML 1.1 reading an exponent without a decimal point (1e-3) as text
            hint_text = "; write it unquoted" + (", with a decimal point (1.0e-3)" if "e" in value.lower() else "")
        raise ValueError(f"{where}: {key} must be {_describe(hint)}, got {value!r} ({_kind(value)}){hint_text}")


def check_record(path: Path, record: dict[str, Any], record_keys: frozenset[str]) -> None:
    """A stored run's config.json beyond what config_from_json checks: value types, and its sources and notes
    (what the banner prints), so that an edited file is one line naming it, never a traceback."""
    check_types({k: v for k, v in record.items() if k not in record_keys}, str(path))
    sources, notes = record.get("sources", {}), record.get("notes", [])
    if not isinstance(sources, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in sources.items()):
        raise ValueError(f"{path}: 'sources' must map each setting to where its value came from, got "
                         f"{json.dumps(sources)[:60]}; the file was edited or is damaged: restore it")
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise ValueError(f"{path}: 'notes' must be a list of lines, got {json.dumps(notes)[:60]}; the file was "
                         "edited or is damaged: restore it")


def check_model_args_type(model_args: Any, where: str) -> None:
    """model_args: a mapping of model config field names to values (the model decides which names it has)."""
    if not isinstance(model_args, Mapping) or not all(isinstance(k, str) for k in model_args):
        raise ValueError(f"{where}: model_args must be a mapping of model settings (e.g. {{depth: 4}}), got "
                         f"{model_args!r}")


def _matches(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin is typing.Literal:
        return isinstance(value, str)  # which strings: the choice check names them
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        return len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args, strict=True))
    if origin is dict:
        return isinstance(value, dict)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if hint is type(None):
        return "null"
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
        return f"a list of {len(args)} {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def _kind(value: Any) -> str:
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
            tuple: "a list", dict: "a mapping", type(None): "null"}.get(type(value), type(value).__name__)


def _is_number_text(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
