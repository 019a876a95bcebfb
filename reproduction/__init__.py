"""The paper's findings reproduced at small scale, one command per experiment (`python -m reproduction NAME`, or
`vitlab experiment NAME` from a checkout).

This package sits beside the library, not in its wheel: a campaign's designs, records and report change on their
own schedule, and shipping them is not the promise a library makes. It imports only the library's documented
second tier (docs/api.md). Each experiment module (`reproduction.experiments`) holds its paper reference, the
finding, a plan (the runs it needs) and an analysis (tables, figures, the measured comparison); `runner` trains and
evaluates the runs, shared between experiments through a run cache keyed by what each run computes;
`report` writes REPRODUCTION.md from the results.
"""

NAMES = ("data-scaling", "compute", "pos-embed", "token-vs-gap", "attention-distance", "mpp")  # `all` runs these
PILOT = "pilot"  # run before them: it chooses their pre-training source
