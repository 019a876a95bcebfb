"""`vitlab predict --csv PATH` / `--json-out PATH`: the predictions as files, written atomically under the output
rule (vitlab.files.outputs.check_output: a file vitlab did not write is replaced only with --force).

CSV: one row per image read, `image, class_1, probability_1, …, class_k, probability_k` (probabilities as
fractions in [0, 1]), for spreadsheets and pandas. A text cell that a spreadsheet would read as a formula (starting
with =, +, -, @, a tab or a carriage return: file and class names are the user's data, possibly hostile) is written
with a leading apostrophe, as OWASP recommends against CSV injection. A CSV has nowhere to carry vitlab's mark, so
replacing an existing one always takes --force. JSON: one record, `written_by` first (so a later run may replace
it), then the weights, the images skipped with why, and every image's top-k. Neither file ever replaces the
weights or images the predictions were made from."""

from __future__ import annotations

import csv
from pathlib import Path

from vitlab.eval.prediction import Predictions
from vitlab.files.outputs import JSON, TEXT, WRITTEN_BY, Kind, atomic_write, check_output
from vitlab.files.outputs import write_json as write_json_file

WRITER = "vitlab predict"
CSV_KIND, JSON_KIND = Kind(WRITER, TEXT), Kind(WRITER, JSON)
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


def spreadsheet_safe(cell: str) -> str:
    """`cell` with a leading apostrophe when a spreadsheet would evaluate it as a formula."""
    return "'" + cell if cell.startswith(FORMULA_STARTS) else cell


def write_csv(predictions: Predictions, path: str | Path, force: bool = False,
              inputs: tuple[str | Path, ...] = ()) -> Path:
    k = max((len(r["top"]) for r in predictions.results), default=0)
    header = ["image"] + [f"{name}_{i}" for i in range(1, k + 1) for name in ("class", "probability")]

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            out = csv.writer(f)
            out.writerow(header)
            for r in predictions.results:
                out.writerow([spreadsheet_safe(r["image"])] + [v for t in r["top"] for v in (
                    spreadsheet_safe(t["class"]), f"{t['probability']:.6g}")])

    atomic_write(path, write, user_named=True, force=force, kind=CSV_KIND, inputs=inputs)
    return Path(path)


def write_json(predictions: Predictions, path: str | Path, weights: str | Path, force: bool = False,
               inputs: tuple[str | Path, ...] = ()) -> Path:
    record = {WRITTEN_BY: WRITER, "weights": str(weights), "images": len(predictions.results),
              "skipped": predictions.skipped, "predictions": predictions.results}
    write_json_file(path, record, end="\n", user_named=True, force=force, inputs=inputs)
    return Path(path)
