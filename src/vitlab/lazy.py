"""A package's names imported from its modules on first use (PEP 562 `__getattr__`), so that importing the
package (as `vitlab --help` does) does not pay for what those modules import."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, names: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package`: a name of `names` (name -> the module of the package that holds it)
    is imported on first use and kept in `namespace` (the package's `globals()`), so later look-ups are plain
    attributes; any other name is the usual AttributeError."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        namespace[name] = value
        return value

    return __getattr__
