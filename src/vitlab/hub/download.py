"""One HTTPS file into the cache: streamed to `<file>.part`, resumed with a Range request after a dropped
connection (in this run, or a later one), shown with a progress bar (size, rate), verified, then renamed.

Verification, from strongest to weakest, whatever the catalogue has: the published checksum (sha256); the
published size (within its rounding); always the size the server announced and, for zip archives (.npz, torch
zip), every member's CRC-32. A file that fails is deleted and the error says so in one line.
"""

from __future__ import annotations

import http.client
import re
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from vitlab.errors import WeightsError
from vitlab.files.digest import sha256_file
from vitlab.hub.cache import readable

CHUNK = 1 << 20
USER_AGENT = "vitlab (https://github.com/google-research/vision_transformer checkpoints)"


class _Retry(Exception):
    """A transient failure (dropped connection, timeout): resume from what is on disk."""


class HostNotFound(Exception):
    """The download's host does not resolve: no network (or no DNS), which retrying does not mend. Raised at the
    first attempt so that an offline machine fails at once, as VITLAB_OFFLINE=1 does, not after 15-25 s of
    retries."""

    def __init__(self, host: str):
        super().__init__(host)
        self.host = host


class _Transfer:
    def __init__(self, url: str, part: Path, label: str, progress: bool, timeout: float):
        self.url, self.part, self.label, self.progress, self.timeout = url, part, label, progress, timeout
        self.total: int | None = None
        self.bar: Any = None

    def request(self) -> None:
        """One request from the current size of the .part file to the end; raises _Retry if it stops early."""
        have = self.part.stat().st_size if self.part.exists() else 0
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            resp = urllib.request.urlopen(urllib.request.Request(self.url, headers=headers), timeout=self.timeout)
        except urllib.error.HTTPError as err:
            if err.code == 416 and have:  # nothing left to send: the .part is already complete
                self.total = _range_total(err.headers.get("Content-Range")) or have
                if self.total != have:
                    self.part.unlink()
                    raise _Retry(f"server refused the range at {have} of {self.total} bytes") from None
                return
            fix = "check the name; the file may have moved"
            raise WeightsError(self.url, f"HTTP {err.code} {err.reason}", fix) from None
        except (urllib.error.URLError, OSError) as err:
            if isinstance(getattr(err, "reason", err), socket.gaierror):
                raise HostNotFound(urllib.parse.urlsplit(self.url).hostname or self.url) from None
            raise _Retry(getattr(err, "reason", err)) from None
        with resp:
            start = self._start(resp, have)
            self._bar(start)
            with open(self.part, "ab" if start else "wb") as f:
                while True:
                    try:
                        chunk = resp.read(CHUNK)
                    except (http.client.HTTPException, OSError) as err:
                        raise _Retry(f"connection lost: {err!r}") from None
                    if not chunk:
                        break
                    f.write(chunk)
                    if self.bar is not None:
                        self.bar.update(len(chunk))
        got = self.part.stat().st_size
        if self.total is not None and got < self.total:
            raise _Retry(f"connection closed after {got} of {self.total} bytes")

    def _start(self, resp: Any, have: int) -> int:
        """Where this response's bytes go in the file; 0 when the server ignored the Range header."""
        if resp.status == 206:
            m = re.match(r"bytes (\d+)-\d+/(\d+|\*)", resp.headers.get("Content-Range", ""))
            if not m or int(m.group(1)) != have:
                self.part.unlink(missing_ok=True)
                raise _Retry("server resumed at another offset; starting again")
            self.total = int(m.group(2)) if m.group(2) != "*" else None
            return have
        length = resp.headers.get("Content-Length")
        self.total = int(length) if length and length.isdigit() else None
        return 0

    def _bar(self, start: int) -> None:
        if not self.progress:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, initial=start, unit="B", unit_scale=True, unit_divisor=1024,
                            desc=self.label, file=sys.stderr, dynamic_ncols=True)
        else:  # resumed after a drop
            self.bar.n = start
            self.bar.refresh()


def _range_total(content_range: str | None) -> int | None:
    m = re.match(r"bytes \*/(\d+)", content_range or "")
    return int(m.group(1)) if m else None


def download(
    url: str, part: Path, label: str, *, size: int | None = None, size_slack: int = 0, sha256: str | None = None,
    progress: bool = True, retries: int = 5, retry_delay: float = 1.0, timeout: float = 60.0,
) -> dict[str, Any]:
    """Complete `part` from `url` and verify it; returns {"size", "sha256"}. `size` (with `size_slack`) is a
    published size to check against; None skips that check."""
    part.parent.mkdir(parents=True, exist_ok=True)
    transfer = _Transfer(url, part, label, progress, timeout)
    failures = 0
    try:
        while True:
            before = part.stat().st_size if part.exists() else 0
            try:
                transfer.request()
                break
            except _Retry as err:
                now = part.stat().st_size if part.exists() else 0
                failures = 1 if now > before else failures + 1  # progress resets the count
                if failures > retries:
                    fix = f"retry later: the {now} bytes in {part} are resumed" if now else "check the network"
                    raise WeightsError(url, f"download failed {failures} times ({err})", fix) from None
                time.sleep(retry_delay * failures)
    finally:
        if transfer.bar is not None:
            transfer.bar.close()
    return verify(url, part, size=size, size_slack=size_slack, sha256=sha256)


def verify(url: str, part: Path, *, size: int | None, size_slack: int, sha256: str | None) -> dict[str, Any]:
    """Checks a complete download; a file that fails is deleted."""
    got = part.stat().st_size
    digest = sha256_file(part)
    if sha256 and digest != sha256.lower():
        problem = f"checksum mismatch: sha256 {digest[:12]}…, the catalogue publishes {sha256[:12]}…"
    elif size is not None and abs(got - size) > size_slack:
        problem = f"size mismatch: {got} bytes, the catalogue publishes {size} (±{size_slack})"
    else:
        problem = readable(part, deep=True)
    if problem:
        part.unlink(missing_ok=True)
        raise WeightsError(url, f"corrupt download, deleted ({problem})", "retry; if it persists the source changed")
    return {"size": got, "sha256": digest}
