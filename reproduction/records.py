"""The files a verdict rests on, read as untrusted input: a run's record (`OUT/_runs/<run>/result.json` and its
committed copy `reproduction/records/<run>.json`) and an experiment's `results.json`.

- Only regular files are opened (a FIFO, a device or a symbolic link named like a record is refused before
  anything is read from it), and no more than a size bound is read.
- Each file carries a checksum of its content (`"checksum": "sha256:..."`, over the canonical JSON of every
  other field), written by vitlab with the file: a value edited by hand is detected and the file named, not used
  as measured. The checksum detects edits and corruption; it is no signature (anyone can recompute it), so the
  history of the committed files remains the record of who changed what.
- A record is tied to its run: its spec must hash to its key (the key its file name and run folder start with),
  and its values must be of their type and range (top-1 a fraction in [0, 1], every number finite).

Every refusal is a `RecordError` (a ValueError: one line on the command line) naming the file and the fix.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from reproduction.spec import RunSpec
from vitlab.files import write_json as write_json_file

CHECKSUM = "checksum"
MAX_RECORD_BYTES = 1 << 20  # a record is 1-4 KB; a thousand times that is no record
MAX_RESULTS_BYTES = 16 << 20  # a results.json is under 100 KB
KEY = re.compile(r"[0-9a-f]{12}")
FIGURE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,120}\.(png|svg|pdf)")  # what experiments.plots writes
_FRACTIONS = frozenset({"top1", "top5", "mean", "per_seed", "val_top1"})  # stored as fractions, never percent


class RecordError(ValueError):
    """A record or results.json that cannot be used as evidence (one line: the file, what is wrong, the fix)."""


def checksum(content: dict[str, Any]) -> str:
    """The checksum of every field but the checksum itself, over one canonical spelling of the JSON."""
    body = {k: v for k, v in content.items() if k != CHECKSUM}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def seal(content: dict[str, Any]) -> dict[str, Any]:
    """`content` with its checksum (set in place, as the last field, and returned)."""
    content.pop(CHECKSUM, None)
    content[CHECKSUM] = checksum(content)
    return content


def read_json(path: str | Path, limit: int, fix: str = "restore it from its commit or delete it") -> Any | None:
    """The JSON in a regular file of at most `limit` bytes; None if there is no file. `fix`: what the error for
    a file that is not JSON tells the reader to do."""
    data = read_bytes(path, limit)
    if data is None:
        return None
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        reason = str(err).splitlines()[0][:80] if str(err) else type(err).__name__
        raise RecordError(f"{path} is not valid JSON ({reason}); {fix}") from None


def read_bytes(path: str | Path, limit: int) -> bytes | None:
    """The content of a regular file of at most `limit` bytes (never a link, FIFO or device); None if absent."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    _regular(path, mode)
    try:  # O_NOFOLLOW and fstat: what was checked is what is read; O_NONBLOCK: a FIFO put there since never blocks
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        if err.errno == errno.ELOOP:
            _regular(path, stat.S_IFLNK)
        raise
    try:
        _regular(path, os.fstat(fd).st_mode)
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(1 << 16, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise RecordError(f"{path} is larger than {limit >> 10} KiB, which no file vitlab writes there is; "
                          "remove it or restore it from its commit")
    return b"".join(chunks)


def _regular(path: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a directory" if stat.S_ISDIR(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    raise RecordError(f"{path} is {kind}, not a file vitlab wrote; remove it (vitlab reads only regular files there)")


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a measured value")


RECORD_FIX = "restore it from its commit, or delete it to train the run again"
RESULTS_FIX = ("restore it from its commit, or run its experiment again to rewrite it from the runs' records "
               "(nothing finished is trained again)")


def verify(content: Any, path: Path, what: str, fix: str = RECORD_FIX) -> dict[str, Any]:
    """`content` if it is an object whose checksum matches; else a RecordError naming the file."""
    if not isinstance(content, dict):
        raise RecordError(f"{path} holds a JSON {type(content).__name__}, not {what}; {fix}")
    if content.get(CHECKSUM) is not None and not isinstance(content[CHECKSUM], str):
        raise RecordError(f"{path} is malformed (its checksum is a JSON {type(content[CHECKSUM]).__name__}, not a "
                          f"string): {fix}")
    if not isinstance(content.get(CHECKSUM), str):
        raise RecordError(f"{path} has no checksum, so it cannot be told from a hand-edited copy; if you trust it "
                          f"(written by a vitlab before checksums), seal it with `python -m reproduction.seal "
                          f"{path}`, else {fix.split(', or ', 1)[-1]}")
    try:
        same = content[CHECKSUM] == checksum(content)
    except ValueError:  # 1e999 parses as infinity, which no measurement is
        same = False
    if not same:
        raise RecordError(f"{path} was edited after vitlab wrote it (its checksum does not match its content): {fix}")
    return content


def read_record(path: str | Path, key: str | None = None) -> dict[str, Any]:
    """A run's record (result.json or its committed copy), verified; {} if there is none. `key`: the run it must
    be (the key its file was found under)."""
    path = Path(path)
    content = read_json(path, MAX_RECORD_BYTES)
    if content is None:
        return {}
    record = verify(content, path, "a run's record")
    check_record(record, path, key)
    return record


def check_record(record: dict[str, Any], path: Path, key: str | None = None) -> None:
    """The record's fields have their types and ranges, and its spec is the run with this key."""
    where = _Where(path)
    spec = where.field(record, "spec", dict)
    found = where.field(spec, "key", str, "spec.")
    if not KEY.fullmatch(found):
        where.fail("spec.key", found, "12 hexadecimal digits")
    if key is not None and found != key:
        raise RecordError(f"{path} is the record of run {found}, not of {key}, whose name it has; restore it or "
                          "delete it")
    try:
        rebuilt = RunSpec(where.field(spec, "label", str, "spec."), where.field(spec, "recipe", str, "spec."),
                          where.field(spec, "settings", dict, "spec."), where.field(spec, "verb", str, "spec."),
                          spec.get("init"), spec.get("curve", False))
        same = rebuilt.key == found
    except (TypeError, ValueError):  # a spec that is no spec: the record of no run
        same = False
    if not same:
        raise RecordError(f"{path}: its spec does not hash to its key {found} (a setting was edited): it is the "
                          "record of no run vitlab trained; restore it from its commit, or delete it")
    for name in ("train", "retrained"):
        if name in record or name == "train":
            _check_outcome(where.field(record, name, dict), where, name)
    where.field(record, "evals", dict)
    for what, seconds in where.field(record, "wall_seconds", dict).items():
        where.number(seconds, f"wall_seconds.{what}", low=0.0)
    where.numbers(record, "")


def _check_outcome(outcome: dict[str, Any], where: _Where, name: str) -> None:
    val = where.field(outcome, "val", dict, f"{name}.")
    where.number(val.get("top1"), f"{name}.val.top1", 0.0, 1.0)
    if "diverged" in outcome:
        where.field(outcome, "diverged", str, f"{name}.")
        return
    step = where.field(outcome, "step", int, f"{name}.")
    if step < 0:
        where.fail(f"{name}.step", step, "a step count (0 or more)")
    for point in where.field(outcome, "val_curve", list, f"{name}.") if "val_curve" in outcome else ():
        if not (isinstance(point, list) and len(point) == 2):
            where.fail(f"{name}.val_curve", point, "[step, top-1] pairs")
        where.number(point[1], f"{name}.val_curve", 0.0, 1.0)


class _Where:
    """Type and range checks that name the file and the field in their one line."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, field: str, value: Any, expected: str) -> None:
        shown = json.dumps(value, default=str)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise RecordError(f"{self.path}: {field} is {shown}, not {expected}; restore the file from its commit, or "
                          "delete it to compute it again")

    def field(self, parent: dict[str, Any], name: str, kind: type, prefix: str = "") -> Any:
        value = parent.get(name)
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            self.fail(prefix + name, value, f"a JSON {_KINDS.get(kind, kind.__name__)}")
        return value

    def number(self, value: Any, field: str, low: float = -math.inf, high: float = math.inf) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(field, value, "a finite number")
        if not low <= value <= high:
            self.fail(field, value, "a fraction in [0, 1] (stored as a fraction, not percent)" if high == 1.0
                      else f"a percentage in [0, {high:g}]" if high < math.inf else f"a number of at least {low:g}")
        return value

    def numbers(self, value: Any, field: str, top: float = 1.0) -> None:
        """Every number anywhere in `value` finite, and those named like accuracies in [0, `top`] (1: records
        store fractions; 100: a results.json's tables of percent)."""
        if isinstance(value, dict):
            for name, item in value.items():
                self.numbers(item, f"{field}.{name}" if field else str(name), top)
        elif isinstance(value, list):
            for item in value:
                self.numbers(item, field, top)
        elif isinstance(value, float) or isinstance(value, int) and not isinstance(value, bool):
            accuracy = field.rsplit(".", 1)[-1] in _FRACTIONS
            self.number(value, field, *((0.0, top) if accuracy else ()))


_KINDS = {dict: "object", list: "list", str: "string", int: "integer", bool: "true or false"}


def check_results(results: dict[str, Any], path: Path, name: str | None = None) -> None:
    """A results.json's fields the report reads have their types; names in it are names, never paths (the
    experiment is `name`, the folder it was read from; a figure is a plain file name inside that folder)."""
    where = _Where(path)
    for field in ("experiment", "paper", "setup", "mode", "command", "finished"):  # what the report reads
        where.field(results, field, str)
    if name is not None and results["experiment"] != name:
        raise RecordError(f"{path} says it holds the results of experiment {results['experiment'][:40]!r}, not of "
                          f"{name!r}, whose folder it is in; restore it from its commit")
    for seed in where.field(results, "seeds", list):
        if isinstance(seed, bool) or not isinstance(seed, int):
            where.fail("seeds", seed, "a list of integer seeds")
    for figure in where.field(results, "figures", list):
        file = where.field(figure if isinstance(figure, dict) else {}, "file", str, "figures[].")
        where.field(figure, "caption", str, "figures[].")
        if not FIGURE.fullmatch(file):
            raise RecordError(f"{path}: figure {file[:60]!r} is not a plain file name of a figure (.png, .svg or "
                              ".pdf) in the experiment's folder; restore the file from its commit")
    for table in where.field(results, "tables", list):
        where.field(table if isinstance(table, dict) else {}, "title", str, "tables[].")
        for column in where.field(table, "columns", list, "tables[].") + where.field(table, "rows", list, "tables[]."):
            if not isinstance(column, (str, list)):
                where.fail("tables[]", column, "a column name or a row")
    _strings(where, where.field(results, "measured", list), "measured")
    check = where.field(results, "check", dict)
    where.field(check, "rule", str, "check.")
    if not isinstance(check.get("holds"), (bool, type(None))) or "holds" not in check:
        where.fail("check.holds", check.get("holds"), "true or false")
    _strings(where, where.field(check, "details", list, "check."), "check.details")
    where.number(results.get("wall_seconds"), "wall_seconds", low=0.0)
    if "run_seconds" in results:
        where.number(results["run_seconds"], "run_seconds", low=0.0)
    if "decision" in results:
        where.field(results, "decision", str)
    for what, value in where.field(results, "choices", dict).items() if "choices" in results else ():
        for chosen in value.values() if isinstance(value, dict) else [value]:
            where.number(chosen, f"choices.{what}")
    where.field(where.field(results, "versions", dict), "vitlab", str, "versions.")
    where.field(results["versions"], "torch", str, "versions.")
    if results.get("design") is not None:
        where.field(where.field(results, "design", dict), "version", int, "design.")
    if "verdict" in results:
        verdict = where.field(results, "verdict", dict)
        for field in ("state", "result"):
            where.field(verdict, field, str, "verdict.")
        if not isinstance(verdict.get("trivial", 0), (str, type(None))):
            where.fail("verdict.trivial", verdict.get("trivial"), "a sentence or null")
        for condition in where.field(verdict, "preconditions", list, "verdict."):
            for field in ("key", "name", "what"):
                where.field(condition if isinstance(condition, dict) else {}, field, str, "verdict.preconditions[].")
    for run in where.field(results, "runs", list) if "runs" in results else ():
        key = where.field(run if isinstance(run, dict) else {}, "key", str, "runs[].")
        if not KEY.fullmatch(key):
            where.fail("runs[].key", key, "12 hexadecimal digits")
        if run.get("val_top1") is not None:
            where.number(run["val_top1"], "runs[].val_top1", 0.0, 1.0)
    where.numbers({k: v for k, v in results.items() if k != "runs"}, "", top=100.0)


def _strings(where: _Where, values: list[Any], field: str) -> None:
    for value in values:
        if not isinstance(value, str):
            where.fail(field, value, "a list of sentences")


def read_results_file(path: str | Path, name: str | None = None) -> dict[str, Any] | None:
    """An experiment's results.json, verified (its checksum, types and names); None if there is none."""
    path = Path(path)
    content = read_json(path, MAX_RESULTS_BYTES)
    if content is None:
        return None
    results = verify(content, path, "an experiment's results", RESULTS_FIX)
    check_results(results, path, name)
    return {k: v for k, v in results.items() if k != CHECKSUM}


def write_sealed_json(path: Path, content: dict[str, Any]) -> str:
    """Write a record or results.json, sealed (atomically: a reader sees the old file or the new); its text."""
    return write_json_file(path, seal(content))
