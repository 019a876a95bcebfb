"""`python -m reproduction.seal`: without a file it prints its usage and exits 2; a record whose checksum is not a
string is named as malformed in one line (sealing would not mend it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from reproduction.seal import main as seal

REPO = Path(__file__).parents[2]


def test_no_file_prints_the_usage_and_exits_2():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    proc = subprocess.run([sys.executable, "-m", "reproduction.seal"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("usage: python -m reproduction.seal [-h] FILE [FILE ...]\n")


def test_a_checksum_that_is_not_a_string_is_a_malformed_record(tmp_path, capsys):
    record = tmp_path / "0123456789ab-lr.json"
    record.write_text(json.dumps({"spec": {}, "checksum": 12345}))
    assert seal([str(record)]) == 2
    assert capsys.readouterr().err == (f"reproduction.seal: {record} is malformed (its checksum is a JSON int, not "
                                       "a string): restore it from its commit, or delete it to train the run again\n")
    assert json.loads(record.read_text()) == {"spec": {}, "checksum": 12345}


def test_a_missing_file_is_named_as_missing(tmp_path, capsys):
    missing = tmp_path / "missing.json"
    assert seal([str(missing)]) == 2
    assert capsys.readouterr().err == (f"reproduction.seal: {missing}: no such file; name a record or results file "
                                       "to seal\n")
