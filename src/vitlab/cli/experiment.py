"""`vitlab experiment NAME`: the paper-reproduction campaign. It lives beside the library in a checkout
(`reproduction/`), not in the wheel, so the command line reaches it by name: from the path, or from the checkout
this vitlab is installed from (`pip install -e .`)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

from vitlab.cli import UserError

CHECKOUT = Path(__file__).resolve().parents[3]  # src/vitlab/cli/experiment.py -> the repository root
MISSING = ("the reproduction campaign is not installed with the package: it lives in the repository beside src/; "
           "clone it, run `make setup` there, then `vitlab experiment NAME` (or `python -m reproduction NAME`)")


def campaign() -> ModuleType | None:
    """reproduction.cli (its `register` defines the command), or None where no checkout holds it."""
    if "reproduction" not in sys.modules and (CHECKOUT / "reproduction" / "cli.py").is_file():
        if str(CHECKOUT) not in sys.path:
            sys.path.append(str(CHECKOUT))  # after everything else: an installed package of that name wins
    try:
        module = importlib.import_module("reproduction.cli")
    except ModuleNotFoundError as err:
        if err.name not in ("reproduction", "reproduction.cli"):
            raise
        return None
    return module if hasattr(module, "register") else None


def register(sub: argparse._SubParsersAction) -> None:
    found = campaign()
    if found is not None:
        found.register(sub)
        return
    p = sub.add_parser("experiment", help="reproduce one of the paper's findings (needs the repository checkout)",
                       description=MISSING, add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_missing)


def _missing(args: argparse.Namespace) -> int:
    raise UserError(MISSING)
