"""What vitlab writes and reads on disk: the output rule (atomic writes, marks, refusals), the run-directory layout
and the cache folder."""

from vitlab.files.digest import sha256_file
from vitlab.files.outputs import OutputRefused, atomic_write, mark_text, refuse_run_file, refuse_special, write_json
from vitlab.files.rundir import CHECKPOINTS, CONFIG, METRICS, WEIGHTS, list_checkpoints

__all__ = ["CHECKPOINTS", "CONFIG", "METRICS", "WEIGHTS", "OutputRefused", "atomic_write", "list_checkpoints",
           "mark_text", "refuse_run_file", "refuse_special", "sha256_file", "write_json"]
