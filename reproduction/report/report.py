"""REPRODUCTION.md, written from the experiments' results.json files (full runs only: a --quick run checks the
pipeline, not the findings), so that running an experiment again rewrites its section; and its appendix,
`reproduction/HISTORY.md` (experiments.history), beside the archived results.

The report is one screen of summary (what was asked, what was measured, the pre-registered verdict and the post-hoc
audit's label), the rules stated once, then per experiment a short design, its main table, the figure, the
preconditions and the verdict beside its audit (experiments.sections). The full designs with their changes, every
table and measured line, and a person's notes between `<!-- notes:NAME -->` and `<!-- /notes:NAME -->` (which survive
every rewrite) are in the appendix. Each experiment's results.json and figures are copied next to the report
(`reproduction/NAME/`), to be committed: the report does not point into a run folder, and `reproduction/` is itself
an OUT the report can be rebuilt from on a machine without the runs (`vitlab experiment report --out reproduction`).
The GPU scale experiment (benchmarks/gpu_scale_experiment.py) has a section of its own when its results.json is there.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from reproduction import NAMES, PILOT
from reproduction.experiment import RESULTS, describe_setup, read_results
from reproduction.experiments import experiments
from reproduction.families import model_table
from reproduction.recipes import PRETRAIN_SMALL
from reproduction.records import KEY, RecordError, read_bytes, read_record
from reproduction.report import history
from reproduction.report import sections as text_of
from reproduction.runner import RESULT, RUNS
from reproduction.scale import FULL
from vitlab.errors import OutputRefused
from vitlab.files import atomic_write, mark_text, refuse_run_file, refuse_special
from vitlab.train import RECIPES

FIGURES = "reproduction"
HISTORY = "HISTORY.md"  # the appendix, in FIGURES beside the report
MARK = mark_text("vitlab experiment report")  # the report's first line: the mark of a file it may replace
MAX_REPORT_BYTES = 16 << 20  # REPRODUCTION.md is about 30 KB
MAX_FIGURE_BYTES = 64 << 20  # a figure is under 100 KB
NOT_RUN = text_of.NOT_RUN
GPU = "gpu-scale"  # benchmarks/gpu_scale_experiment.py's results (not a `vitlab experiment` name)
GPU_TITLE = "The scale questions on a GPU (paper Section 4.2 and 4.4, Figs. 3-5)"
GPU_PENDING = ("**Prepared, not run.** `python benchmarks/gpu_scale_experiment.py --out reproduction` on one H200 "
               "(bf16; under 8 minutes) writes `reproduction/gpu-scale/results.json`, which this section then shows: "
               "ViT and BiT at three sizes on synthetic data drawn on the GPU, steps scaled to matched compute, "
               "transfer scored few-shot.")

INTRO = """# Reproducing the paper's findings at small scale

Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021), at CPU scale: every experiment is one command,
`vitlab experiment NAME`; pre-training is on glyphs drawn from matplotlib's fonts (`fonts:64:N`, the pilot's
fallback: no source met its preconditions), transfer to MNIST. Every number below comes from one committed run
record (`reproduction/records/`, read through `reproduction/NAME/results.json`); `vitlab experiment report --out
reproduction` rebuilds this file from them. Each experiment's decision rule, preconditions, design changes, every
table and the notes on its run are in the appendix, `reproduction/HISTORY.md`, in the section of the same number.
"""


def write_report(out: str | Path, path: str | Path, allow_pending: bool = False, force: bool = False) -> Path:
    """Rewrite the report at `path` and its appendix from the results under `out` (the --out of the experiments).
    With no results at all the report is left alone unless `allow_pending` (a new design replacing every
    section's). A file at `path` (or at the appendix's place) that is not one vitlab wrote is replaced only with
    `force` (`previous_report`)."""
    out, path, table = Path(out), Path(path), experiments()
    appendix = path.parent / FIGURES / HISTORY
    previous = previous_report(path, force)
    before = previous_report(appendix, force)
    found = {name: _full_results(out, name, table[name], path.parent) for name in (PILOT, *NAMES)}
    if previous and not any(found.values()) and not allow_pending:
        raise ValueError(f"no full results under {out} (runs/ is not committed: run `vitlab experiment NAME` "
                         f"first); {path} left unchanged")
    parts, rows, appendices, retrained = [], [], [], {}
    for number, name in enumerate((PILOT, *NAMES)):
        exp, full = table[name], found[name]
        noted = history.notes(before, name) or history.notes(previous, name)
        kept = None if full else _measured_section(previous, number, name, exp)
        if kept is not None:  # measured on another machine or in another folder: its text stays as it was
            parts.append(kept[0])
            rows.append(kept[1])
            appendices.append(history.kept(before, number, name) or history.section(
                number, name, exp.title, None, exp.design, noted))
            continue
        figures = _archive(name, full, out / name, path.parent) if full else []
        parts.append(section(number, name, full, figures))
        rows.append(_summary_row(name, full, table[name].paper))
        appendices.append(history.section(number, name, f"{exp.title} (paper {exp.paper})", full, exp.design, noted))
        retrained.update({r["key"]: r for r in (full or {}).get("retrained", [])})
    gpu = _gpu_results(out)
    number = len(NAMES) + 1
    parts.append(_gpu_section(number, gpu, _archive(GPU, gpu, out / GPU, path.parent) if gpu else []))
    rows.append(_summary_row(GPU, gpu, "Sections 4.2, 4.4") if gpu else
                f"| {GPU} | Sections 4.2, 4.4 | prepared for a GPU, not run | | | |")
    appendices.append(history.section(number, GPU, GPU_TITLE, gpu, None, history.notes(before, GPU)))
    body = "\n".join([MARK, INTRO, *text_of.summary(rows, list(retrained.values())), shared_setup(), *parts])
    appendix_text = "\n".join([mark_text("vitlab experiment report"), history.TITLE, "", history.INTRO,
                               shared_setup(full=True), *appendices])
    previous_report(path, force)  # again: the paths may have changed while the sections were built
    previous_report(appendix, force)
    appendix.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(appendix, lambda tmp: Path(tmp).write_text(appendix_text.rstrip() + "\n", encoding="utf-8"))
    atomic_write(path, lambda tmp: Path(tmp).write_text(body.rstrip() + "\n", encoding="utf-8"))
    return path


def previous_report(path: Path, force: bool = False) -> str:
    """The text of the report (or appendix) at `path` ('' if there is none), which the rewrite replaces. vitlab's
    output rule (vitlab.files.outputs): never a special file or link (refused, `force` or not); a regular file only if
    it
    is one vitlab wrote, recognisably (its first line is MARK; a report from before the mark starts with INTRO's
    title), unless `force`; else OutputRefused, one line. A run's own file is refused, `force` or not (only its
    training writes it). The text read is bounded."""
    refuse_run_file(path)
    refuse_special(path)
    data = read_bytes(path, MAX_REPORT_BYTES)
    if data is None:
        return ""
    text = data.decode("utf-8", errors="replace")
    if not force and not text.startswith((MARK + "\n", INTRO.split("\n", 1)[0] + "\n")):
        raise OutputRefused(path, f"exists and is not a report vitlab wrote (its first line is not `{MARK}`)",
                            "pass --force to replace it, or choose another --report")
    return text


def shared_setup(full: bool = False) -> str:
    """What every experiment shares: the scale and the recipes, and (`full`: the appendix's) the models with their
    size and cost by vitlab's counters (known before any run)."""
    f = FULL
    warmup = RECIPES["pretrain-i1k"]["warmup"] / RECIPES["pretrain-i1k"]["steps"]
    models = model_table(f, f.categories)
    rows = [f"| {r['family']}-{r['size']} | {r['architecture']} | {r['params']:,} | {r['macs'] / 1e6:.1f} M |"
            for r in models]
    sizes = {fam: "/".join(f"{r['params'] / 1e3:.0f}k" for r in models if r["family"] == fam)
             for fam in dict.fromkeys(r["family"] for r in models)}
    lines = [
        "## Setup shared by the experiments", "",
        f"- Images {f.image_size}×{f.image_size} px; pre-training sets `{f.source}:{f.categories}:N` ({f.categories} "
        f"classes, N training images per class, N in {', '.join(f'{n:,}' for n in f.per_class)}), {f.steps:,} steps of "
        f"{f.batch_size}, lr per model from a grid (precondition (c)); upstream top-1 on the largest set's "
        f"validation split. Models S/M/L: " + "; ".join(f"{fam} {p}" for fam, p in sizes.items())
        + " parameters.",
        f"- Transfer: fine-tuning on `{f.finetune_data[0]}` for {f.finetune_steps:,} steps against the same model "
        f"trained on it alone for {f.reference_steps or f.finetune_steps:,}; few-shot ridge at "
        f"{' and '.join(str(k) for k in f.shots)} shots against the same model untrained.", ""]
    if not full:
        return "\n".join(lines)
    return "\n".join([*lines,
        f"- Pre-training: Adam, cosine decay, `pre_logits` layer (recipe `pretrain-i1k`, warm-up {100 * warmup:.3g} "
        f"% of the steps) with light regularisation ({_settings(PRETRAIN_SMALL)}); N/10 validation images per class; "
        f"learning rate per model from {', '.join(f'{lr:g}' for lr in f.lrs)} by final top-1 (seed 0), the grid "
        "extended when the choice sits at its edge.",
        f"- Fine-tuning on `{f.finetune_data[0]}` ({_labelled(f.finetune_data[0])}; MNIST's 1,000-image test split) "
        "at the model's pre-training recipe and lr.",
        f"- Few-shot: closed-form ridge (big_vision's protocol, {f.fewshot_seeds} draws) on "
        f"{' and '.join(f.fewshot_data)}, on `pre_logits` and on the encoder output.",
        "", "| model | architecture | parameters | multiply-adds per image |", "|---|---|---|---|", *rows, ""])


def _labelled(data: str) -> str:
    """'mnist:10' -> '10 labelled images per class'; a whole set -> 'all its labelled training images'."""
    _, _, per_class = data.partition(":")
    return f"{per_class} labelled images per class" if per_class else "all its labelled training images"


def _settings(values: dict[str, Any]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v[0]:g}–{v[1]:g}" if isinstance(v, list) else f"{k.replace('_', ' ')} {v}"
                     for k, v in values.items())


def section(number: int, name: str, results: dict[str, Any] | None, figures: list[tuple[str, str]]) -> str:
    """One experiment's section: what the paper found, the design and, when a full run exists, what it measured."""
    exp = experiments()[name]
    design = exp.design.to_dict() if exp.design is not None else None
    lines = [f"## {number}. {name}: {exp.title} (paper {exp.paper})", "", f"**The paper's finding.** {exp.finding}",
             "", *text_of.design_lines(name, number, design)]
    if results is None:
        setup = describe_setup(exp, exp.scales[0], exp.seeds)  # the full scale: the pilot has its own
        lines += [f"**Setup.** {setup} Seeds {', '.join(str(s) for s in exp.seeds)}.", "",
                  NOT_RUN.format(command=f"vitlab experiment {name}"), ""]
    else:
        lines += _measured(results, figures)
    return "\n".join([*lines, f"<!-- /section:{name} -->", ""])


def _gpu_section(number: int, results: dict[str, Any] | None, figures: list[tuple[str, str]]) -> str:
    lines = [f"## {number}. {GPU}: {GPU_TITLE}", ""]
    if results is None:
        lines += [GPU_PENDING, ""]
    else:
        lines += [f"**The question.** {results['finding']} The setup, the design and every run's numbers: "
                  f"{text_of.APPENDIX}, section {number}.", "", *_measured(results, figures, tables=False)]
    return "\n".join([*lines, f"<!-- /section:{GPU} -->", ""])


def _measured(r: dict[str, Any], figures: list[tuple[str, str]], tables: bool = True) -> list[str]:
    return text_of.measured(r, figures, _minutes(_cost(r)), tables)


def _summary_row(name: str, r: dict[str, Any] | None, paper: str) -> str:
    return text_of.summary_row(name, r, paper, _minutes(_cost(r)) if r else "")


def _cost(r: dict[str, Any]) -> float:
    """The wall seconds of every run the experiment reads (results written before they were recorded: the
    invocation's own)."""
    return r.get("run_seconds", r["wall_seconds"])


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _gpu_results(out: Path) -> dict[str, Any] | None:
    """The GPU scale experiment's results (mode 'gpu'; a CPU dry run's are not findings), checked as any
    results.json."""
    results = read_results(out / GPU / RESULTS, GPU)
    return results if results and results.get("mode") == "gpu" else None


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
    found = re.search(rf"^## {number}\. {re.escape(name)}: .*?<!-- /section:{re.escape(name)} -->\n", previous,
                      re.S | re.M)
    row = re.search(rf"^\| {re.escape(name)} \|.*$", previous, re.M)
    if found is None or row is None or "**Verdict: pending.**" in found.group(0):
        return None
    version = experiment.design.version if experiment.design else None
    marker = re.search(rf"<!-- design:{re.escape(name)} v(\d+) -->", found.group(0))
    if (int(marker.group(1)) if marker else None) != version:
        return None
    return found.group(0), row.group(0)
