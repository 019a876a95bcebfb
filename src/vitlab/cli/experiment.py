"""`vitlab experiment NAME`: the paper-reproduction campaign, a plug-in verb. The campaign lives beside the library
in a checkout (`reproduction/`), not in the wheel, and the command line never imports it: the verb is what an
installed campaign registers under the `vitlab.commands` entry-point group, else a launcher that runs `python -m
reproduction` (the campaign's own entry, which registers the verb itself) in the current checkout, else one line
saying where the campaign is."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vitlab.cli import UserError

MISSING = ("the reproduction campaign is not installed with the package: it lives in the repository beside src/; "
           "clone it and run `python -m reproduction NAME` (or `vitlab experiment NAME`) from its root")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("experiment", help="reproduce one of the paper's findings (needs the repository checkout)",
                       description="Runs `python -m reproduction` of the checkout in the current folder (its --help "
                                   "lists the experiments and flags). " + MISSING, add_help=False,
                       prefix_chars="\0")  # no option of its own: every argument, --help included, is the campaign's
    p.add_argument("rest", nargs="*")
    p.set_defaults(func=_launch)


def checkout(folder: Path) -> Path | None:
    """The repository root holding the campaign at or above `folder`, or None."""
    for root in (folder, *folder.parents):
        if (root / "reproduction" / "__main__.py").is_file():
            return root
    return None


def _launch(args: argparse.Namespace) -> int:
    root = checkout(Path.cwd())
    if root is None:
        raise UserError(MISSING)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))}
    loud = {-1: ["-q"], 1: ["-v"]}.get(args.verbosity, [])
    sys.stdout.flush()
    # the campaign's process replaces this one (same process id: a supervisor's signals reach it)
    os.execve(sys.executable, [sys.executable, "-m", "reproduction", *loud, *args.rest], env)
    return 0  # not reached
