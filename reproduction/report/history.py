"""The appendix of REPRODUCTION.md, `reproduction/HISTORY.md`: what a skimming reader does not need and an
auditor does: each design in full with every change made to it and why, every table and measured line
of each run, the verdict's details, and the notes people wrote on each run (`<!-- notes:NAME -->` ...
`<!-- /notes:NAME -->`, kept when the appendix is rewritten; the notes of a report from before the appendix are
moved here). The notes were written when each run finished: a number in them can predate a later re-analysis, and
REPRODUCTION.md's numbers supersede them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from reproduction.design import Design, describe
from reproduction.report.sections import table_lines

TITLE = "# Reproduction: designs, histories and notes (appendix of REPRODUCTION.md)"
# the appendix's opening, with the campaign's history it cites: a file beside this module
INTRO = (Path(__file__).parent / "history.intro.md").read_text(encoding="utf-8")


def notes(previous: str, name: str) -> str:
    """A person's notes on an experiment from a report or appendix being replaced (empty if none)."""
    found = re.search(rf"<!-- notes:{re.escape(name)} -->\n(.*?)\n?<!-- /notes:{re.escape(name)} -->", previous, re.S)
    return found.group(1).strip("\n") if found else ""


def section(number: int | str, name: str, title: str, results: dict[str, Any] | None,
            design: Design | None, noted: str) -> str:
    """One experiment's appendix section."""
    lines = [f"## {number}. {name}", "", f"*{title}*", ""]
    if design is not None:
        lines += [describe(design), ""]
    elif results and results.get("design"):
        lines += [describe(Design(**{k: tuple(v) if k == "changes" else v for k, v in results["design"].items()})),
                  ""]
    if results is not None:
        lines += [f"**Setup.** {results['setup']}", ""]
        for table in results["tables"]:
            lines += table_lines(table)
        lines += ["**Measured.**", "", *(f"- {m}" for m in results["measured"]), ""]
        checks = (results.get("verdict") or {}).get("preconditions", [])
        lines += (["*Preconditions, run by run*", "", "| precondition | runs | measured | holds |", "|---|---|---|---|",
                   *(f"| ({c['key']}) {c['name']} | {c['what']} | {c['value']} | "
                     f"{'yes' if c['holds'] else 'no' if c['holds'] is False else 'not measured'}"
                     f"{f' (a condition of {d} only)' if (d := c.get('decides')) else ''} |" for c in checks),
                   *(f"| (a′) plateau (post hoc) | {p['what']} | {p['value']} | "
                     f"{'yes' if p['holds'] else 'no' if p['holds'] is False else 'not measured'} |"
                     for p in (results.get("audit") or {}).get("plateau", [])), ""] if checks else [])
        details = results["check"]["details"]
        lines += (["**Details of the verdict.**", "", *(f"- {d}" for d in details), ""] if details else [])
    lines += [f"<!-- notes:{name} -->", *([noted] if noted else []), f"<!-- /notes:{name} -->", ""]
    return "\n".join(lines)


def kept(previous: str, number: int | str, name: str) -> str | None:
    """The appendix section of an experiment as the appendix being replaced has it (None if none)."""
    found = re.search(rf"^## {number}\. {re.escape(name)}\n.*?<!-- /notes:{re.escape(name)} -->\n", previous,
                      re.S | re.M)
    return found.group(0) if found else None
