"""`vitlab bench --precision`: both implementations compute in the resolved precision, each in its own form, and
every % peak is a share of the same precision's GEMM peak, measured in the same run."""

from __future__ import annotations

import json

import pytest
import torch

import vitlab.runtime.precision
from vitlab.bench import BenchSettings, forms, measure, run_benchmark, timm_equivalent
from vitlab.bench.peaks import precision_peak
from vitlab.cli import main
from vitlab.runtime.precision import Precision
from vitlab.runtime.quantize import is_int8

pytest.importorskip("timm")

TINY = {"model": "ViT-Ti/16", "image_size": 32, "batch_size": 2, "repeats": 2, "warmup": 1, "min_time": 0.0,
        "threads": 1, "compare": "timm", "gemm_size": 512}  # the precision's peak: a product of side <= 512


@pytest.fixture
def fixed_fp32_peak(monkeypatch):
    monkeypatch.setattr(measure, "gemm_peak_gflops", lambda device, size=None, repeats=5: 100.0)


def test_int8_runs_both_libraries_in_int8_against_the_int8_peak(fixed_fp32_peak):
    result = run_benchmark(BenchSettings(**TINY, modes=("infer",), precision="int8"))
    assert result.precision["requested"] == "int8" and result.precision["name"] == "int8"
    assert set(result.gemm_peaks) == {"fp32", "int8"} and result.gemm_peaks["fp32"]["gflops"] == 100.0
    assert result.gemm_peak_gflops == result.gemm_peaks["int8"]["gflops"] != 100.0
    for m in result.measurements:
        assert m.peak_gflops == result.gemm_peak_gflops
        assert m.pct_peak == pytest.approx(100 * m.gflops / result.gemm_peaks["int8"]["gflops"])
    data = result.to_dict()
    assert data["precision"]["name"] == "int8" and "dynamic int8" in data["precision"]["forms"]
    assert "precision: int8 (requested: dynamic int8 Linear layers)" in result.table()


def test_timm_gets_the_same_int8_form_and_its_head_stays_float():
    _, theirs = timm_equivalent("ViT-Ti/16", 10, 32)
    q = forms.inference_model("timm", theirs, Precision("int8", "test"))
    assert is_int8(q) and not is_int8(theirs)  # a converted copy: training still gets the float32 model
    assert type(q.head) is torch.nn.Linear


@pytest.mark.slow
def test_bf16_computes_in_bf16_and_reports_the_bf16_peak(fixed_fp32_peak):
    """bf16 is emulated (slow: 50 s here) on CPUs without AVX512-BF16/AMX: the tiniest model, one repeat each."""
    result = run_benchmark(BenchSettings(**{**TINY, "repeats": 1}, modes=("infer", "train"), precision="bf16"))
    assert result.precision["name"] == "bf16" and set(result.gemm_peaks) == {"fp32", "bf16"}
    assert result.environment["precision"] == "bf16"
    assert len(result.measurements) == 4  # vitlab and timm, inference and training


def test_bf16_forms_vitlab_bf16_weights_timm_autocast():
    ours = forms.inference_model("vitlab", vitlab.create_model("ViT-Ti/16", image_size=32), Precision("bf16", "t"))
    assert next(ours.parameters()).dtype == torch.bfloat16  # vitlab's form: bf16 weights (eval --precision bf16)
    _, theirs = timm_equivalent("ViT-Ti/16", 10, 32)
    assert forms.inference_model("timm", theirs, Precision("bf16", "t")) is theirs  # timm: autocast, float32 weights


def test_auto_follows_the_processor_and_the_width(monkeypatch):
    settings = BenchSettings(model="ViT-S/16", modes=("infer",))
    monkeypatch.setattr(vitlab.runtime.precision, "cpu_flags", lambda text=None: frozenset({"avx2", "fma"}))
    assert forms.resolve(settings).name == "fp32"
    monkeypatch.setattr(vitlab.runtime.precision, "cpu_flags", lambda text=None: frozenset({"avx2", "amx_bf16"}))
    assert forms.resolve(settings).name == "bf16"  # width 384
    assert forms.resolve(BenchSettings(model="ViT-Ti/16", modes=("infer",))).name == "bf16"  # width 192 >= 128
    assert forms.resolve(BenchSettings(model="ViT-Ti/16", modes=("train",))).name == "bf16"  # 197 tokens
    small = BenchSettings(model="ViT-Ti/16", modes=("train",), image_size=64)  # width 192 < 256, 17 tokens
    assert forms.resolve(small).name == "fp32"


def test_precision_peaks_are_measured_at_a_size_that_fits(monkeypatch):
    gflops, size = precision_peak("int8", "cpu", max_size=512, repeats=1)
    assert gflops > 0 and 256 <= size <= 512
    _, size = precision_peak("fp32", "cpu", max_size=256, repeats=1)
    assert size == 256


def test_cli_int8_measures_inference_and_records_the_precision(tmp_path, capsys, fixed_fp32_peak, monkeypatch):
    monkeypatch.setattr(measure, "precision_peak", lambda precision, device, max_size, repeats=3: (50.0, 256))
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", "ViT-Ti/16", "--image-size", "32", "--batch-size", "2", "--repeats", "1",
            "--warmup", "1", "--min-time", "0", "--threads", "1", "--precision", "int8", "--json", str(out)]
    assert main(argv) == 0
    saved = json.loads(out.read_text())
    assert saved["precision"]["name"] == "int8" and saved["settings"]["modes"] == ["infer"]
    assert saved["settings"]["precision"] == "int8" and saved["gemm_peak_gflops"] == 50.0
    capsys.readouterr()
    assert main([*argv[:-2], "--mode", "train"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["vitlab bench: error: --precision int8 measures inference only (there is no int8 training): "
                   "add --mode infer"]
