"""Downloads into the cache against an HTTP server on 127.0.0.1 started here (no other network): progress, resume
after a dropped connection, corrupt files rejected, one download for two processes, offline mode, broken entries."""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import socket
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from vitlab.errors import WeightsError
from vitlab.hub import cache as hub_cache
from vitlab.hub.catalogue import Entry
from vitlab.hub.fetch import fetch


class FileServer:
    """Serves in-memory files with Range support. `drop_once[path] = n`: the next response for `path` stops after
    byte n of the file and closes the connection; `chunk_delay`: seconds between 16 KiB writes; `log` records
    (path, Range header) of every GET."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.drop_once: dict[str, int] = {}
        self.chunk_delay = 0.0
        self.log: list[tuple[str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                server.log.append((self.path, self.headers.get("Range")))
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                if rng := self.headers.get("Range"):
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                stop = server.drop_once.pop(self.path, len(body))
                for i in range(start, stop, 16384):
                    self.wfile.write(body[i:min(i + 16384, stop)])
                    time.sleep(server.chunk_delay)
                if stop < len(body):  # the connection drops halfway
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def gets(self, path: str) -> list[str | None]:
        return [rng for p, rng in self.log if p == path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FileServer()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("VITLAB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "cache"


def npz_bytes(seed: int = 0, n: int = 64_000) -> bytes:
    """An .npz as np.savez writes it (a zip of .npy files, each with its CRC-32)."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    arrays = {"embedding/kernel": rng.standard_normal(n).astype(np.float32), "cls": np.zeros((1, 1, 8), np.float32)}
    np.savez(buf, **arrays)
    return buf.getvalue()


def entry_for(server: FileServer, path: str, **fields) -> Entry:
    return Entry(name="test:ViT-Ti/16", tag="test", model="ViT-Ti/16", format="jax-npz", url=server.url(path), **fields)


def test_download_shows_progress_records_and_is_reused(server, capsys):
    body = npz_bytes()
    server.files["/m.npz"] = body
    entry = entry_for(server, "/m.npz")
    path = fetch(entry)
    assert path.read_bytes() == body
    assert path.parent == hub_cache.cache_dir() / f"127.0.0.1_{server.httpd.server_address[1]}"
    err = capsys.readouterr().err
    kib = round(len(body) / 1024)
    assert "test:ViT-Ti/16: 100%" in err and f"{kib}k/{kib}k" in err and "B/s]" in err  # name, size and rate
    record = hub_cache.read_meta(path)
    assert record["size"] == len(body) and record["sha256"] == hashlib.sha256(body).hexdigest()
    assert not path.with_name(path.name + ".part").exists()
    assert fetch(entry) == path and len(server.log) == 1  # the cache answers; no second request


def test_resume_after_the_server_drops_the_connection_halfway(server):
    body = npz_bytes(1)
    server.files["/drop.npz"] = body
    server.drop_once["/drop.npz"] = half = len(body) // 2
    path = fetch(entry_for(server, "/drop.npz"), progress=False, retry_delay=0)
    assert server.gets("/drop.npz") == [None, f"bytes={half}-"]  # the second request continues where it stopped
    assert path.read_bytes() == body


def test_a_later_run_resumes_an_interrupted_download(server, cache):
    body = npz_bytes(2)
    server.files["/later.npz"] = body
    entry = entry_for(server, "/later.npz")
    part = hub_cache.entry_path(entry).with_name("later.npz.part")
    part.parent.mkdir(parents=True)
    part.write_bytes(body[:30_000])  # what a killed process left
    path = fetch(entry, progress=False)
    assert server.gets("/later.npz") == ["bytes=30000-"]
    assert path.read_bytes() == body


@pytest.mark.parametrize("fields, problem", [
    ({"sha256": hashlib.sha256(b"another file").hexdigest()}, "checksum mismatch"),
    ({"size": 10_000_000, "size_source": "published"}, "size mismatch"),
])
def test_corrupt_download_is_rejected_in_one_line(server, fields, problem):
    server.files["/bad.npz"] = npz_bytes(3)
    entry = entry_for(server, "/bad.npz", **fields)
    with pytest.raises(WeightsError, match=problem) as err:
        fetch(entry, progress=False)
    assert "\n" not in str(err.value) and "deleted" in str(err.value)
    path = hub_cache.entry_path(entry)
    assert not path.exists() and not path.with_name("bad.npz.part").exists()


def test_damaged_bytes_fail_the_zip_crc(server):
    body = bytearray(npz_bytes(4))
    body[len(body) // 3] ^= 0xFF  # inside the first array's data: the length is right, the content is not
    server.files["/flip.npz"] = bytes(body)
    with pytest.raises(WeightsError, match="CRC-32"):
        fetch(entry_for(server, "/flip.npz"), progress=False)


def _fetch_in_child(entry: Entry, out: multiprocessing.Queue) -> None:
    out.put(str(fetch(entry, progress=False)))


def test_two_processes_download_once(server, capfd):
    body = npz_bytes(5)
    server.files["/shared.npz"] = body
    server.chunk_delay = 0.03  # ~0.5 s transfer: the second process arrives while the first holds the lock
    entry = entry_for(server, "/shared.npz")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_fetch_in_child, args=(entry, out)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    paths = {out.get(timeout=5), out.get(timeout=5)}
    assert len(paths) == 1 and open(paths.pop(), "rb").read() == body
    assert server.gets("/shared.npz") == [None]  # one request in all
    assert "another process is downloading test:ViT-Ti/16; waiting" in capfd.readouterr().err


@pytest.mark.parametrize("var", ["VITLAB_OFFLINE", "HF_HUB_OFFLINE"])
def test_offline_names_the_missing_file_and_the_command(server, monkeypatch, var):
    server.files["/off.npz"] = npz_bytes(6)
    entry = entry_for(server, "/off.npz")
    monkeypatch.setenv(var, "1")
    with pytest.raises(WeightsError) as err:
        fetch(entry)
    msg = str(err.value)
    assert str(hub_cache.entry_path(entry)) in msg and f"{var}=1" in msg
    assert "run `vitlab download test:ViT-Ti/16`" in msg and "\n" not in msg
    assert server.log == []  # the network was not touched


def test_broken_cache_entry_is_fetched_again_never_loaded(server, monkeypatch, capsys):
    body = npz_bytes(7)
    server.files["/broken.npz"] = body
    entry = entry_for(server, "/broken.npz")
    path = fetch(entry, progress=False)
    path.write_bytes(body[:1000])  # truncated on disk (a full disk, a bad copy)
    assert "bytes on disk" in hub_cache.problem(path)
    monkeypatch.setenv("VITLAB_OFFLINE", "1")
    with pytest.raises(WeightsError, match="broken cache entry"):
        fetch(entry)
    monkeypatch.delenv("VITLAB_OFFLINE")
    assert fetch(entry, progress=False).read_bytes() == body
    assert "re-fetching test:ViT-Ti/16" in capsys.readouterr().err and len(server.gets("/broken.npz")) == 2


def test_missing_file_is_one_line(server):
    with pytest.raises(WeightsError, match="HTTP 404") as err:
        fetch(entry_for(server, "/nowhere.npz"), progress=False)
    assert "\n" not in str(err.value)


def test_zip_check_reads_real_npz(tmp_path):
    path = tmp_path / "a.npz"
    path.write_bytes(npz_bytes(8))
    assert hub_cache.readable(path, deep=True) is None
    assert zipfile.is_zipfile(path)
    path.write_bytes(path.read_bytes()[:-100])  # the central directory is gone
    assert "unreadable zip" in hub_cache.readable(path, deep=False)


def test_unreachable_server_gives_up_in_one_line():
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # a port nobody listens on
    port = closed.getsockname()[1]
    closed.close()
    entry = Entry(name="test:gone", tag="test", model="ViT-Ti/16", format="jax-npz",
                  url=f"http://127.0.0.1:{port}/gone.npz")
    with pytest.raises(WeightsError, match=r"download failed 6 times .*; check the network") as err:
        fetch(entry, progress=False, retry_delay=0)
    assert "\n" not in str(err.value)


def test_a_host_that_does_not_resolve_fails_at_once_with_the_offline_line(tmp_path, monkeypatch):
    import socket

    from vitlab.errors import WeightsError
    from vitlab.hub import download as hub_download
    from vitlab.hub.catalogue import Entry
    from vitlab.hub.fetch import fetch

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("VITLAB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    lookups, sleeps = [], []

    def no_dns(host, *args, **kwargs):  # what a machine without network answers
        lookups.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(hub_download.time, "sleep", sleeps.append)
    entry = Entry(name="augreg:test", tag="augreg", model="ViT-Ti/16", format="jax-npz",
                  url="https://storage.googleapis.com/vit_models/augreg/test.npz")
    with pytest.raises(WeightsError) as online:
        fetch(entry, progress=False)
    assert lookups == ["storage.googleapis.com"] and sleeps == []  # one attempt, no retries
    monkeypatch.setenv("VITLAB_OFFLINE", "1")
    with pytest.raises(WeightsError) as offline:
        fetch(entry, progress=False)
    assert len(lookups) == 1  # offline mode does not even look the host up
    online_line, offline_line = str(online.value), str(offline.value)
    assert online_line == offline_line.replace("VITLAB_OFFLINE=1 forbids downloading",
                                               "storage.googleapis.com does not resolve (offline?)")
    assert online_line.endswith("; run `vitlab download augreg:test` where the network is reachable")
    assert "\n" not in online_line
    assert not any(p.name.endswith(".part") for p in (tmp_path / "cache").rglob("*"))  # nothing half-written
