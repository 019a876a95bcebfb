"""`python -m reproduction [-q|-v] NAME …`: the `vitlab experiment` command, run from the repository root."""

from __future__ import annotations

import sys

from reproduction.cli import main

GLOBAL_FLAGS = ("-q", "--quiet", "-v", "--verbose")  # vitlab's own, which go before the verb

if __name__ == "__main__":
    argv = sys.argv[1:]
    lead = 0
    while lead < len(argv) and argv[lead] in GLOBAL_FLAGS:
        lead += 1
    sys.exit(main([*argv[:lead], "experiment", *argv[lead:]]))
