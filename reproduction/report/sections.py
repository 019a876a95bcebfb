"""The text of REPRODUCTION.md (a report a skimming reader can read): one screen of summary (what
was asked, what was measured, the pre-registered verdict and the post-hoc audit label), the rules stated once, then
per experiment a short design, its main table, the figure, the preconditions and the verdict beside its audit.
Everything longer (the full design with its changes, every table, every measured line, the notes) is in the
appendix (experiments.history)."""

from __future__ import annotations

import re
from typing import Any

from reproduction.report.audit import PLATEAU_POINTS, PLATEAU_RULE, PLATEAU_STEPS
from reproduction.report.lineage import MARK as RETRAINED_MARK
from reproduction.stats import RULE, SEEDS_RULE

APPENDIX = "reproduction/HISTORY.md"
NOT_RUN = ("**Verdict: pending.** No full run yet; `{command}` produces the numbers, the figure and the measured "
           "comparison that replace this line.")
PENDING_LABEL = "pending: no full run yet"


def anchor(number: int | str, name: str) -> str:
    """The appendix heading's anchor (mkdocs and GitHub: lower case, spaces to '-', punctuation dropped)."""
    return f"{number}-{name}".lower()


def summary(rows: list[str], retrained: list[dict[str, Any]]) -> list[str]:
    """The summary table, the rules it was judged by, and the runs trained twice."""
    lines = ["## Summary", "", "| experiment | paper | measured | verdict (pre-registered) | audit (post hoc) | runs |",
             "|---|---|---|---|---|---|", *rows, "",
             "*Verdicts* are the designs' own, fixed before each full run: a rule and the preconditions (a) "
             "pre-training learns its task, (b) it helps transfer, (c) no learning rate at the edge of its grid, (d) "
             "the effect beyond the seed spread; *inconclusive* when one fails. *Audits* came after the runs and "
             f"change no verdict. Their rules, stated once: {PLATEAU_RULE}. Paired statistics: {RULE}. Power: "
             f"{SEEDS_RULE}. ± is one standard deviation over seeds; a run shared by two experiments counts in both "
             "times.", ""]
    if retrained:
        lines += ["*Runs trained twice.* A run known only from its record was trained again on a second machine "
                  "when its weights were wanted; every section reads the original's final top-1, and a number "
                  f"read from the retrained weights is marked {RETRAINED_MARK}.", "",
                  "| run | record | original top-1 | retrained top-1 | computed on the retrain |",
                  "|---|---|---|---|---|",
                  *(f"| {r['label']} | {r['key']} | {r['top1']:.1f} % | {r['retrained_top1']:.1f} % | "
                    f"{', '.join(r['evals'] + [f'fine-tuning {k}' for k in r['finetuned']]) or 'nothing'} |"
                    for r in retrained), ""]
    return lines


def summary_row(name: str, r: dict[str, Any] | None, paper: str, minutes: str) -> str:
    if r is None:
        return f"| {name} | {paper} | {PENDING_LABEL} | | | |"
    audit = r.get("audit") or {}
    if "decision" in r:  # the pilot: a choice made by its rule, not a finding of the paper
        short = brief(r["decision"])
        return f"| {name} | {r['paper']} | {short} | a choice of source, not a finding | | {minutes} |"
    measured = audit.get("measured") or (r["verdict"]["result"] if "verdict" in r else "; ".join(r["measured"]))
    state = r["verdict"]["state"] if "verdict" in r else ("holds" if r["check"]["holds"] else "does not hold")
    short = _short(state)
    return f"| {name} | {r['paper']} | {measured} | **{short}** | {audit.get('label', '—')} | {minutes} |"


def design_lines(name: str, number: int | str, design: dict[str, Any] | None) -> list[str]:
    """The short design: its question (the primary metric, the decision rule, the preconditions and the changes:
    the appendix; the verdict names the metric and says what the rule found)."""
    if not design:
        return []
    return [f"<!-- design:{name} v{design['version']} -->",
            f"**Design (version {design['version']}, fixed before the full run).** {design['question']}", ""]


def measured(r: dict[str, Any], figures: list[tuple[str, str]], minutes: str, tables: bool = True) -> list[str]:
    """What a full run measured: the runs, its main table (unless not `tables`), the figures, the preconditions
    (one row per precondition; each run's in the appendix), the verdict and the audit."""
    lines = [f"**Runs.** Seeds {', '.join(str(s) for s in r['seeds'])}; `{r['command']}`, {minutes} of runs "
             f"(finished {r['finished']}).", ""]
    for table in r["tables"][:1] if tables and "decision" not in r else []:  # the pilot's tables: the appendix
        lines += table_lines(table)
    for file, caption in figures:
        lines += [f"![{re.split(r'[.;:] ', caption)[0].rstrip('.')}]({file})", ""]
    if "decision" in r:
        return lines + [f"**Decision (by the rule).** {r['decision']}.", ""]
    audit = r.get("audit") or {}
    if "verdict" in r:
        v = r["verdict"]
        lines += ["| precondition | measured | holds |", "|---|---|---|", *precondition_rows(v["preconditions"]),
                  *_plateau_row(audit.get("plateau", [])), "",
                  f"**Verdict (pre-registered): {_short(v['state'])}.** {v['result']}"
                  + (f" {v['trivial']}" if v["trivial"] else ""), ""]
    else:
        verdict = "holds" if r["check"]["holds"] else "does not hold"
        lines += [f"**Verdict (measured).** At this scale the paper's ordering {verdict} by the rule: "
                  f"{r['check']['rule']}.", ""]
    if audit:
        lines += [f"**Audit (post hoc): {audit['label']}.**", "",
                  *(f"- {line}" for line in audit.get("paired", []) + audit.get("notes", [])), ""]
    return lines


def precondition_rows(checks: list[dict[str, Any]]) -> list[str]:
    """One row per precondition (and per verdict it is a condition of): whether every run's check holds, and the
    measured value of each that does not (every run's value: the appendix)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in checks:
        groups.setdefault((c["key"], c.get("decides") or ""), []).append(c)
    rows = []
    for (key, decides), group in groups.items():
        failed = [c for c in group if c["holds"] is False]
        unmeasured = [c for c in group if c["holds"] is None]
        if failed or unmeasured:
            state = "no" if failed else "not measured"
            shown = "; ".join(f"{c['what']}: {c['value']}" for c in failed + unmeasured)
            if len(group) > len(failed + unmeasured):
                shown += f" (the other {len(group) - len(failed) - len(unmeasured)} hold)"
        else:
            count = "both" if len(group) == 2 else f"all {len(group)}"
            state, shown = "yes", (f"{count} hold" if len(group) > 1 else f"{group[0]['value']}")
        rows.append(f"| ({key}) {group[0]['name']}{f' (a condition of {decides} only)' if decides else ''} | "
                    f"{shown} | {state} |")
    return rows


def _plateau_row(plateaus: list[dict[str, Any]]) -> list[str]:
    if not plateaus:
        return []
    gains = "; ".join(f"{p['what']} {p['gain']:+.1f}" if p["gain"] is not None else f"{p['what']}: {p['value']}"
                      for p in plateaus)
    failed = [p["what"] for p in plateaus if p["holds"] is False]
    state = "no" if len(failed) == len(plateaus) else f"no ({', '.join(failed)})" if failed else "yes"
    return [f"| (a′) plateau (post hoc): under {PLATEAU_POINTS:+g} point in the last {PLATEAU_STEPS:,} steps | "
            f"{gains} points | {state} |"]


def brief(text: str) -> str:
    """`text` without its explanatory parentheses (those with a space inside; '(b)' stays), for the summary."""
    return re.sub(r" \((?=[^()]* )(?:[^()]|\([^()]*\))*\)", "", text)


def _short(state: str) -> str:
    """'inconclusive: precondition (d) failed (slope ...: +0.3, ...)' -> 'inconclusive: precondition (d) failed' (the
    failing value is in the preconditions table)."""
    return state.split(" failed (", 1)[0] + " failed" if " failed (" in state else state


def table_lines(table: dict[str, Any]) -> list[str]:
    """A results table in markdown; a column of percentages says so once, in its header."""
    columns, rows = list(table["columns"]), [[str(c) for c in row] for row in table["rows"]]
    for i in range(len(columns)):
        cells = [row[i] for row in rows if i < len(row) and row[i] not in ("—", "")]
        if cells and all(re.fullmatch(r"[^%]+ %( †)?", c) for c in cells):
            columns[i] += " (%)"
            for row in rows:
                row[i] = row[i].replace(" %", "") if i < len(row) else ""
    return [f"*{table['title']}*", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(row) + " |" for row in rows), ""]


def _choices(choices: dict[str, Any]) -> str:
    parts = []
    for what, value in choices.items():
        text = ", ".join(f"{k} {v:g}" for k, v in value.items()) if isinstance(value, dict) else f"{value:g}"
        parts.append(f"{what.replace('_', ' ')}: {text}")
    return "; ".join(parts) or "none"
