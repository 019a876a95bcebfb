"""Errors and warnings about input data; both carry one line that names the path and the fix."""

from __future__ import annotations

import logging

log = logging.getLogger("vitlab.data")





def describe_paths(paths: list[str], limit: int = 3) -> str:
    """'a, b, c and 4 more': the first few paths of a list, for warnings that must stay one line."""
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")
