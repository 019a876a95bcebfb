"""`vitlab bench --mode infer`'s batch-1 latency of the serving forms (fp32, bf16, int8, an ONNX file): the fields of
the table and of --json, never their values."""

from __future__ import annotations

import json

import pytest

import vitlab
import vitlab.bench as bench
from vitlab.bench import BenchSettings, run_benchmark
from vitlab.bench.result import percentile
from vitlab.cli import main

TINY = dict(model="ViT-Ti/16", batch_size=2, image_size=32, repeats=1, warmup=1, min_time=0.0, gemm_size=64,
            threads=1, modes=("infer",))
FIELDS = {"form", "computes", "batch_size", "p50_ms", "p90_ms", "images_per_s_at_p50", "samples", "ms"}


def test_nearest_rank_percentiles():
    values = [float(v) for v in (7, 1, 10, 3, 2, 9, 4, 8, 6, 5)]
    assert percentile(values, 50) == 5.0 and percentile(values, 90) == 9.0 and percentile(values, 100) == 10.0
    assert percentile([4.0], 50) == percentile([4.0], 90) == 4.0


def test_inference_reports_batch_1_latency_of_every_form():
    result = run_benchmark(BenchSettings(**TINY))
    assert [lat.form for lat in result.latency] == ["fp32", "bf16", "int8"]
    for row in result.to_dict()["latency"]:
        assert set(row) == FIELDS and row["batch_size"] == 1
        assert row["samples"] == len(row["ms"]) >= 20 and 0 < row["p50_ms"] <= row["p90_ms"]
    table = result.table()
    assert "batch-1 latency" in table and "| fp32 |" in table and "| int8 |" in table


def test_no_latency_measures_none():
    result = run_benchmark(BenchSettings(**{**TINY, "latency": False}))
    assert result.latency == [] and result.to_dict()["latency"] == [] and "batch-1 latency" not in result.table()


def test_an_onnx_file_is_timed_beside_them(random_tiny_vit, tmp_path, capsys, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setattr(bench.measure, "gemm_peak_gflops", lambda device, size=None, repeats=5: 100.0)
    path = tmp_path / "m.onnx"
    vitlab.export_onnx(random_tiny_vit(0, num_classes=10), path)
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", "ViT-Ti/16", "--batch-size", "2", "--image-size", "32", "--repeats", "1",
            "--warmup", "1", "--min-time", "0", "--threads", "1", "--mode", "infer", "--onnx", str(path),
            "--json", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["latency"]
    assert [r["form"] for r in rows] == ["fp32", "bf16", "int8", "onnx fp32"]
    assert "ONNX Runtime" in rows[-1]["computes"] and "| onnx fp32 |" in capsys.readouterr().out


def test_onnx_without_inference_is_refused_in_one_line(tmp_path, capsys):
    assert main(["bench", "--mode", "train", "--onnx", str(tmp_path / "m.onnx")]) == 2
    assert "add --mode infer" in capsys.readouterr().err


def test_compile_times_the_frozen_forms(monkeypatch):
    """With --compile every serving form is compiled with frozen weights, as the inference verbs compile."""
    import torch

    calls: list[dict] = []
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or real(model, backend="eager"))
    result = run_benchmark(BenchSettings(**TINY, compile=True))
    assert [lat.form for lat in result.latency] == ["fp32", "bf16", "int8"]
    assert calls == [{"dynamic": False, "options": {"freezing": True}}] * 4  # the throughput's model, then 3 forms
