"""Predictions as files: `vitlab predict --csv PATH` / `--json-out PATH` and `vitlab eval --errors PATH`, written
atomically under the output rule (vitlab.files.outputs.check_output: an earlier output of the same verb and kind is
replaced, any other file only with --force).

CSV: one row per image read, `image, class_1, probability_1, …, class_k, probability_k` (probabilities as
fractions in [0, 1]), for spreadsheets and pandas; eval's errors: one row per misclassified image, `image, true,
predicted, confidence`. A text cell that a spreadsheet would read as a formula (starting with =, +, -, @, a tab or a
carriage return: file and class names are the user's data, possibly hostile) is written with a leading apostrophe,
as OWASP recommends against CSV injection. A CSV's header row is its mark (`files.marks.CSV_HEADERS`): a rerun
replaces its own file. JSON: one record, `written_by` first (so a later run may replace it), then the weights, the
images skipped with why, and every image's top-k. No file ever replaces the weights or images the predictions were
made from."""

from __future__ import annotations

import csv
from pathlib import Path

from vitlab.eval.prediction import Predictions
from vitlab.files.outputs import CSV, JSON, WRITTEN_BY, Kind, atomic_write, check_output
from vitlab.files.outputs import write_json as write_json_file

WRITER = "vitlab predict"
CSV_KIND, JSON_KIND = Kind(WRITER, CSV), Kind(WRITER, JSON)
ERRORS_KIND = Kind("vitlab eval", CSV)  # eval --errors: the misclassified images
ERRORS_HEADER = ["image", "true", "predicted", "confidence"]
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what makes a spreadsheet read a cell as a formula


def check_destinations(csv_path: str | Path | None, json_path: str | Path | None, force: bool = False,
                       inputs: tuple[str | Path, ...] = ()) -> None:
    """Before any work: each destination may be written (OutputRefused otherwise), and neither is one of the
    `inputs` (the weights and the images)."""
    if csv_path and json_path and Path(csv_path).resolve() == Path(json_path).resolve():
        raise ValueError(f"--csv and --json-out both name {csv_path}; give them different files")
    for path, kind in ((csv_path, CSV_KIND), (json_path, JSON_KIND)):
        if path:
            check_output(path, force, kind=kind, inputs=inputs)


def encodable(text: str) -> str:
    """`text` as UTF-8 can hold it: the bytes of a file name that is not UTF-8 (which Python reads as surrogate
    escapes) written as `\\xff`, so one such name is shown, not fatal to the whole file."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def spreadsheet_safe(cell: str) -> str:
    """`cell` as UTF-8 can hold it (`encodable`), with a leading apostrophe when a spreadsheet would evaluate it
    as a formula."""
    cell = encodable(cell)
    return "'" + cell if cell.startswith(FORMULA_STARTS) else cell


def write_csv(predictions: Predictions, path: str | Path, force: bool = False,
              inputs: tuple[str | Path, ...] = ()) -> Path:
    k = max((len(r["top"]) for r in predictions.results), default=0)
    header = ["image"] + [f"{name}_{i}" for i in range(1, k + 1) for name in ("class", "probability")]

    rows = ([spreadsheet_safe(r["image"])] + [v for t in r["top"] for v in (
        spreadsheet_safe(t["class"]), f"{t['probability']:.6g}")] for r in predictions.results)
    return _write_rows(path, header, rows, CSV_KIND, force, inputs)


def write_errors(misclassified: list[dict], path: str | Path, force: bool = False,
                 inputs: tuple[str | Path, ...] = ()) -> Path:
    """`vitlab eval --errors PATH`: one row per misclassified image (`EvalResult.misclassified`), the header alone
    when there is none."""
    rows = ([spreadsheet_safe(r["image"]), spreadsheet_safe(r["true"]), spreadsheet_safe(r["predicted"]),
             f"{r['confidence']:.6g}"] for r in misclassified)
    return _write_rows(path, ERRORS_HEADER, rows, ERRORS_KIND, force, inputs)


def _write_rows(path: str | Path, header: list[str], rows, kind: Kind, force: bool,
                inputs: tuple[str | Path, ...]) -> Path:
    def write(tmp: str) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            out = csv.writer(f)
            out.writerow(header)
            out.writerows(rows)

    atomic_write(path, write, user_named=True, force=force, kind=kind, inputs=inputs)
    return Path(path)


def write_predictions_json(predictions: Predictions, path: str | Path, weights: str | Path, force: bool = False,
               inputs: tuple[str | Path, ...] = ()) -> Path:
    record = {WRITTEN_BY: WRITER, "weights": str(weights), "images": len(predictions.results),
              "skipped": predictions.skipped, "predictions": predictions.results}
    write_json_file(path, record, end="\n", user_named=True, force=force, inputs=inputs)
    return Path(path)
