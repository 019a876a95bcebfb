"""Errors and warnings about input data; both carry one line that names the path and the fix."""

from __future__ import annotations

import logging

log = logging.getLogger("vitlab.data")


class DataError(ValueError):
    """Bad input data found before (or, with --strict, during) training: empty class folder, missing split,
    class-count mismatch, unreadable image. A ValueError so that the CLI prints it as one line."""


def describe_paths(paths: list[str], limit: int = 3) -> str:
    """'a, b, c and 4 more': the first few paths of a list, for warnings that must stay one line."""
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")
