"""SIGTERM during a verb that writes a file: one line, exit code 143, and neither the half-written temporary nor a
work folder left beside the output (what Ctrl-C already did, exit code 130)."""

from __future__ import annotations

import os
import signal

import pytest

import vitlab
from vitlab.cli import main


class ReachedTheDefault(Exception):
    """SIGTERM fell through to the test's own handler: the verb did not handle it."""


@pytest.fixture(autouse=True)
def sigterm_does_not_kill_pytest():
    """Without the verb's own handler SIGTERM would end the test process; here it raises instead."""

    def fallback(signum, frame):
        raise ReachedTheDefault

    previous = signal.signal(signal.SIGTERM, fallback)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_while_predict_writes_its_csv_leaves_nothing(tmp_path, random_tiny_vit, noise_image, monkeypatch,
                                                             capsys):
    import vitlab.eval.prediction_files as files

    vitlab.save(random_tiny_vit(0), tmp_path / "w.safetensors")
    (tmp_path / "images").mkdir()
    for i in range(3):
        noise_image(tmp_path / "images" / f"{i}.png", seed=i)
    real_writer = files.csv.writer

    def writer_stopped_after_the_header(f):
        out = real_writer(f)

        class Stopping:
            def writerow(self, row):
                out.writerow(row)
                f.flush()
                os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next row

        return Stopping()

    monkeypatch.setattr(files.csv, "writer", writer_stopped_after_the_header)
    out = tmp_path / "out"
    out.mkdir()
    code_now = main(["predict", "--weights", str(tmp_path / "w.safetensors"), str(tmp_path / "images"),
                     "--csv", str(out / "p.csv")])
    assert code_now == 143
    assert capsys.readouterr().err.splitlines() == ["vitlab predict: terminated (SIGTERM)"]
    assert list(out.iterdir()) == []  # no p.csv, no temporary


def test_sigterm_during_export_removes_its_work_folder(tmp_path, random_tiny_vit, monkeypatch, capsys):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from vitlab.deploy import onnx_export

    vitlab.save(random_tiny_vit(0), tmp_path / "w.safetensors")
    real_trace = onnx_export._trace

    def trace_then_stop(*args, **kwargs):
        real_trace(*args, **kwargs)  # the traced file is in the work folder now
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(onnx_export, "_trace", trace_then_stop)
    out = tmp_path / "out"
    out.mkdir()
    assert main(["export", str(tmp_path / "w.safetensors"), str(out / "m.onnx")]) == 143
    assert capsys.readouterr().err.splitlines() == ["vitlab export: terminated (SIGTERM)"]
    assert list(out.iterdir()) == []


def test_a_process_forked_under_the_handler_dies_of_sigterm_as_before():
    """Loader workers and other forked children keep the default action: the parent's exception is not theirs."""
    import time

    from vitlab.cli import terminated_as_exception

    with terminated_as_exception():
        ready, tell = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: say it runs, then wait for the signal; never return into pytest
            try:
                os.write(tell, b"1")
                for _ in range(1000):  # 10 s at most; each wake-up runs a handler due
                    time.sleep(0.01)
            finally:
                os._exit(0)
        assert os.read(ready, 1) == b"1"
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
