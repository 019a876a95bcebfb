"""The run's console: the `vitlab.train` logger, and `<run>/console.log`, which gets every line the run logs,
step and validation lines included: under a progress bar those go to the file only (`FILE_ONLY`)."""

from __future__ import annotations

import logging
from pathlib import Path

from vitlab.files.rundir import CONSOLE_LOG

log = logging.getLogger("vitlab.train")

# Lines for console.log only (the step lines a progress bar replaces on the terminal): ConsoleLog
# writes them to the file; they do not propagate to the terminal's handlers.
FILE_ONLY = logging.getLogger("vitlab.file_only")
FILE_ONLY.propagate = False

_CONSOLE_FORMAT = logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S")


class ConsoleLog:
    """Copies vitlab's log lines into `<run>/console.log` while the run lasts (rank 0 only), and the lines that
    go to the file only (FILE_ONLY: step and validation lines while a progress bar is on screen)."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.handler: logging.Handler | None = None
        if enabled:
            self.handler = logging.FileHandler(run_dir / CONSOLE_LOG, encoding="utf-8")
            self.handler.setFormatter(_CONSOLE_FORMAT)
            self.handler.setLevel(logging.INFO)
            logger = logging.getLogger("vitlab")
            if logger.level == logging.NOTSET:  # library use without logging set up: still record INFO lines
                logger.setLevel(logging.INFO)
            logger.addHandler(self.handler)
            FILE_ONLY.setLevel(logging.INFO)
            FILE_ONLY.addHandler(self.handler)

    def close(self) -> None:
        if self.handler is not None:
            logging.getLogger("vitlab").removeHandler(self.handler)
            FILE_ONLY.removeHandler(self.handler)
            self.handler.close()
            self.handler = None


def append_to_console_log(run_dir: Path, text: str) -> None:
    """A line after the run has closed its log (the command line's final `done:` line), in the same format."""
    path = Path(run_dir) / CONSOLE_LOG
    if path.parent.is_dir():
        record = logging.LogRecord("vitlab", logging.INFO, __file__, 0, text, None, None)
        with open(path, "a", encoding="utf-8") as f:
            f.write(_CONSOLE_FORMAT.format(record) + "\n")
