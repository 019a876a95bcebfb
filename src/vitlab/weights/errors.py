"""The one error type for weights that cannot be read: a single line naming the file, the tensor and the fix."""

from __future__ import annotations

from pathlib import Path


class WeightsError(ValueError):
    """Raised for unknown formats, corrupt files, missing/extra tensors and shape mismatches.
    The message is one line: `<file>: <what is wrong> (<tensor>); <how to fix it>`."""

    def __init__(self, path: str | Path, problem: str, fix: str = ""):
        self.path, self.problem, self.fix = str(path), problem, fix
        super().__init__(f"{path}: {problem}" + (f"; {fix}" if fix else ""))
