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
                                   "lists the experiments and flags). " + MISSING, add_help=False)
    p.add_argument("-h", "--help", nargs=0, action=_CampaignHelp, help="the campaign's help (this one without it)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_launch)


class _CampaignHelp(argparse.Action):
    """--help: the campaign's, from the checkout in the current folder; this parser's where there is none."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        if checkout(Path.cwd()) is not None:
            _run_campaign(["--help"], 0)
        parser.print_help()
        parser.exit()


def checkout(folder: Path) -> Path | None:
    """The repository root holding the campaign at or above `folder`, or None."""
    for root in (folder, *folder.parents):
        if (root / "reproduction" / "__main__.py").is_file():
            return root
    return None


def _launch(args: argparse.Namespace) -> int:
    return _run_campaign(args.rest, args.verbosity)


def _run_campaign(argv: list[str], verbosity: int) -> int:
    """`python -m reproduction ARGV` of the checkout in the current folder, in place of this process (same process
    id: a supervisor's signals reach it)."""
    root = checkout(Path.cwd())
    if root is None:
        raise UserError(MISSING)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))}
    loud = {-1: ["-q"], 1: ["-v"]}.get(verbosity, [])
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "reproduction", *loud, *argv], env)
    return 0  # not reached
