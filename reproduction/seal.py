"""`python -m reproduction.seal FILE...`: give records and results.json files written by a vitlab before
checksums (experiments.records) their checksum, after checking their types and ranges. For files you trust, once:
the history of a committed file shows what changed in it."""

from __future__ import annotations

import sys
from pathlib import Path

from reproduction import records as r


def main(argv: list[str] | None = None) -> int:
    """Seal each file (one already sealed is verified and left as it is): 0; 2 with one line at the first file
    that cannot be sealed."""
    try:
        for path in [Path(p) for p in (sys.argv[1:] if argv is None else argv)]:
            seal_file(path)
    except (r.RecordError, OSError) as err:
        print(f"reproduction.seal: {err}", file=sys.stderr)
        return 2
    return 0


def seal_file(path: Path) -> None:
    content = r.read_json(path, r.MAX_RESULTS_BYTES)
    if not isinstance(content, dict):
        raise r.RecordError(f"{path}: no JSON object to seal")
    if content.get(r.CHECKSUM) is not None:
        r.verify(content, path, "a record")
        return
    if "spec" in content:  # a record: named <key>-<label>.json, or result.json in <key>-<label>/
        r.check_record(content, path, (path.parent if path.name == "result.json" else path).name[:12])
    else:
        r.check_results(content, path)
    r.write_json(path, content)
    print(f"sealed {path}")


if __name__ == "__main__":
    sys.exit(main())
