"""The one error type for weights that cannot be read: a single line naming the file, the tensor and the fix.

It sits at the bottom of the package because every layer raises or reports it: the format readers, the download
cache (a corrupt or offline download), the run-directory reader and the command line."""

from __future__ import annotations

from pathlib import Path


class WeightsError(ValueError):
    """Raised for unknown formats, corrupt files, missing/extra tensors and shape mismatches.
    The message is one line: `<file>: <what is wrong> (<tensor>); <how to fix it>`."""

    def __init__(self, path: str | Path, problem: str, fix: str = ""):
        self.path, self.problem, self.fix = str(path), problem, fix
        super().__init__(f"{path}: {problem}" + (f"; {fix}" if fix else ""))
