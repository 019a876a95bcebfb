"""`python -m reproduction.seal FILE...`: give records and results.json files written by a vitlab before
checksums (reproduction.records) their checksum, after checking their types and ranges. For files you trust, once:
the history of a committed file shows what changed in it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reproduction import records as r


def main(argv: list[str] | None = None) -> int:
    """Seal each file (one already sealed is verified and left as it is): 0; 2 with one line at the first file
    that cannot be sealed, or with the usage when no file is named."""
    what = __doc__.split("`: ", 1)[1]
    parser = argparse.ArgumentParser(prog="python -m reproduction.seal", description=what[0].upper() + what[1:])
    parser.add_argument("files", nargs="+", metavar="FILE", help="a record or results.json to seal")
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse has printed the usage (or the help) and says how to exit
        return int(stop.code or 0)
    try:
        for path in [Path(p) for p in args.files]:
            seal_file(path)
    except (r.RecordError, OSError) as err:
        print(f"reproduction.seal: {err}", file=sys.stderr)
        return 2
    return 0


def seal_file(path: Path) -> None:
    content = r.read_json(path, r.MAX_RESULTS_BYTES)
    if content is None:
        raise r.RecordError(f"{path}: no such file; name a record or results file to seal")
    if not isinstance(content, dict):
        raise r.RecordError(f"{path}: no JSON object to seal")
    if content.get(r.CHECKSUM) is not None:
        r.verify(content, path, "a record")
        return
    if "spec" in content:  # a record: named <key>-<label>.json, or result.json in <key>-<label>/
        r.check_record(content, path, (path.parent if path.name == "result.json" else path).name[:12])
    else:
        r.check_results(content, path)
    r.write_sealed_json(path, content)
    print(f"sealed {path}")


if __name__ == "__main__":
    sys.exit(main())
