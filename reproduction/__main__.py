"""`python -m reproduction NAME …`: the `vitlab experiment` command, run from the repository root."""

from __future__ import annotations

import sys

from vitlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["experiment", *sys.argv[1:]]))
