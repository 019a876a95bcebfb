"""`vitlab.bench` and the `models`/`bench` verbs: structure and arithmetic only, never timings."""

from __future__ import annotations

import json
import math

import pytest
import torch

import vitlab
import vitlab.bench as bench
from vitlab.bench import BenchSettings, run_benchmark, timm_equivalent
from vitlab.cli import main
from vitlab.cli.models import model_rows
from vitlab.models.flops import count_macs
from vitlab.runtime.allocator import allocator_name

# ViT-Ti/16 on 32×32 inputs: 4 patches, a fraction of a second per step.
TINY = dict(model="ViT-Ti/16", batch_size=2, image_size=32, repeats=2, warmup=1, min_time=0.0, gemm_size=128,
            threads=1, tune_malloc=False)


@pytest.fixture(scope="module")
def result() -> bench.BenchResult:
    return run_benchmark(BenchSettings(**{**TINY, "tune_malloc": True}, compare="timm"))


def test_measures_both_implementations_in_both_modes(result: bench.BenchResult) -> None:
    assert [(m.impl, m.mode) for m in result.measurements] == [
        ("vitlab", "infer"), ("timm", "infer"), ("vitlab", "train"), ("timm", "train")]
    assert result.gemm_peak_gflops > 0
    for m in result.measurements:
        assert len(m.images_per_s) == 2 and all(v > 0 and math.isfinite(v) for v in m.images_per_s)
        assert m.steps_per_repeat >= 1


def test_gflops_arithmetic(result: bench.BenchResult) -> None:
    full = count_macs("ViT-Ti/16", 32)
    fast = count_macs("ViT-Ti/16", 32, class_token_last_block=True)
    for m in result.measurements:
        assert m.macs_per_image == (full.total if m.mode == "infer" else full.training)
        executed = fast if m.impl == "vitlab" else full  # the session and the trainer's step: class token alone
        assert m.executed_macs_per_image == (executed.total if m.mode == "infer" else executed.training)
        assert m.gflops == pytest.approx(2 * m.macs_per_image * m.median / 1e9)
        assert m.pct_peak == pytest.approx(100 * m.gflops / result.gemm_peak_gflops)
        assert m.executed_pct_peak <= m.pct_peak * (1 + 1e-12)
        assert m.executed_gflops == pytest.approx(2 * m.executed_macs_per_image * m.median / 1e9)


def test_ratios_pair_the_repeats(result: bench.BenchResult) -> None:
    ratios = result.ratios()
    assert set(ratios) == {"infer", "train"}
    for mode, r in ratios.items():
        ours, theirs = result.get("vitlab", mode), result.get("timm", mode)
        pairs = [a / b for a, b in zip(ours.images_per_s, theirs.images_per_s, strict=True)]
        assert r["per_repeat"] == pytest.approx(pairs)
        assert r["min"] == min(pairs) and r["min"] <= r["median"]


def test_report_and_json(result: bench.BenchResult) -> None:
    table = result.table()
    assert "| vitlab | ViT-Ti/16 | infer |" in table and "| timm | vit_tiny_patch16_224 | train |" in table
    assert "vitlab/timm train: per repeat " in table and "timed back to back" in table
    d = json.loads(json.dumps(result.to_dict()))
    assert d["environment"]["torch"] == torch.__version__ and d["environment"]["threads"] == 1
    assert len(d["measurements"]) == 4 and d["ratios"]["infer"]["median"] > 0
    assert d["environment"]["malloc"] == allocator_name()  # tuned by the module's run: the process's allocator
    assert f"malloc: {allocator_name()}" in table


def test_training_step_is_the_trainers(monkeypatch) -> None:
    """vitlab's training step computes the last block for the class token alone, as the trainer's does while
    nothing observes it; timm's computes every token."""
    from vitlab.models.vit import VisionTransformer

    calls: list[str] = []
    original = VisionTransformer.forward_unobserved
    monkeypatch.setattr(VisionTransformer, "forward_unobserved",
                        lambda self, x: (calls.append("vitlab"), original(self, x))[1])
    settings = BenchSettings(**{**TINY, "modes": ("train",)}, compare="timm")
    models = bench.build_models(settings)
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    for impl, _, m in models:
        bench.make_step(m, "train", x, y)()
        assert calls == ["vitlab"], impl
    assert "forward" not in vars(models[0][2])


def test_single_mode_without_comparison_restores_threads() -> None:
    before = torch.get_num_threads()
    res = run_benchmark(BenchSettings(**{**TINY, "modes": ("infer",), "repeats": 1}))
    assert [(m.impl, m.mode) for m in res.measurements] == [("vitlab", "infer")]
    assert res.ratios() == {} and torch.get_num_threads() == before


@pytest.mark.parametrize("name", ["ViT-Ti/16", "ViT-Ti/16-gap"])
def test_timm_equivalent_computes_the_same_function(name: str) -> None:
    ours = vitlab.create_model(name, num_classes=10, image_size=32).eval()
    torch.nn.init.normal_(ours.head.weight)  # the zero-initialised head would make any two models agree
    _, theirs = timm_equivalent(name, num_classes=10, image_size=32)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        a, b = ours(x), theirs.eval()(x)
    assert ((a - b).norm() / b.norm()).item() < 1e-5


@pytest.mark.parametrize("name", ["ViT-Ti/16", "ViT-Ti/16-gap"])
def test_timm_equivalent_has_the_same_gradients(name: str) -> None:
    ours = vitlab.create_model(name, num_classes=0, image_size=32)
    _, theirs = timm_equivalent(name, num_classes=0, image_size=32)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 32, 32)
    ours.forward_features(x).square().mean().backward()
    theirs.forward_features(x).square().mean().backward()
    grads = dict(ours.named_parameters())
    for key, p in theirs.named_parameters():
        assert (grads[key].grad - p.grad).norm() <= 1e-5 * p.grad.norm() + 1e-12, key


def test_bench_bit_against_timm_holds_the_same_weights() -> None:
    """The BiT comparison times timm's resnetv2_50x1_bit holding vitlab's weights (that the two then compute the
    same function is tests/parity/test_timm_bit_weights.py's job)."""
    settings = BenchSettings(model="BiT-R50x1", compare="timm", image_size=64, num_classes=10)
    (_, _, ours), (_, name, theirs) = bench.build_models(settings)
    assert name == "resnetv2_50x1_bit"
    mine = {k.replace(".blocks.", ".").replace("downsample.conv.", "downsample.").replace("head.fc.", "head."): v
            for k, v in theirs.state_dict().items()}  # fmt: skip
    assert set(mine) == set(ours.state_dict())
    assert all(torch.equal(mine[k].reshape(v.shape), v) for k, v in ours.state_dict().items())


def test_cli_bench_bit_reports_a_ratio(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.measure, "gemm_peak_gflops", lambda device, size=None, repeats=5: 100.0)
    argv = ["bench", "--model", "BiT-R50x1", "--compare", "timm", "--batch-size", "1", "--image-size", "32",
            "--repeats", "1", "--warmup", "1", "--min-time", "0", "--threads", "1", "--mode", "infer"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| timm | resnetv2_50x1_bit | infer |" in out and "vitlab/timm infer:" in out and "median" in out


@pytest.mark.parametrize("name", ["R+ViT-Ti/16", "R26+ViT-S/32"])
def test_timm_hybrid_equivalent_has_the_same_parameters(name: str) -> None:
    _, theirs = timm_equivalent(name)
    ours = vitlab.create_model(name)
    assert sum(p.numel() for p in theirs.parameters()) == sum(p.numel() for p in ours.parameters())


def test_bad_settings_raise() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        run_benchmark(BenchSettings(model="ViT-Q/16"))
    with pytest.raises(ValueError, match="modes"):
        run_benchmark(BenchSettings(modes=("predict",)))
    with pytest.raises(ValueError, match="no timm equivalent"):
        timm_equivalent("ViT-B/14")


def test_gemm_peak_is_positive() -> None:
    assert bench.gemm_peak_gflops("cpu", size=64, repeats=2) > 0


def test_models_rows_cover_the_registry() -> None:
    rows = model_rows(224)
    assert [r["name"] for r in rows] == vitlab.list_models()
    by_name = {r["name"]: r for r in rows}
    assert by_name["ViT-B/16"]["params"] == 86_567_656  # official models_test.py
    assert by_name["R50+ViT-B/16"]["params"] == 98_659_112
    assert by_name["ViT-B/16"]["gmacs"] == pytest.approx(17.58, rel=0.01)
    assert by_name["BiT-R50x1"]["params"] == 25_549_352  # BiT-M R50x1 with the ImageNet head (timm's too)
    assert by_name["BiT-R50x1"]["gmacs"] == pytest.approx(4.09, rel=0.01)  # ResNet-50's convolutions (torchvision)
    assert [r["name"][len("BiT-") :] for r in rows if r["name"].startswith("BiT-")] == [
        "R50x1", "R50x2", "R50x3", "R101x1", "R101x3", "R152x1", "R152x2", "R152x4", "R200x3"]  # fmt: skip
    assert all(r["gmacs"] > 0 for r in rows)
    assert {r["name"] for r in model_rows(384) if r["gmacs"] is None} == {"ViT-H/14", "ViT-H/14-gap"}


def test_cli_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "ViT-S/16" in out and "multiply-adds" in out
    assert main(["models", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == len(vitlab.list_models())


def test_cli_bench(tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.measure, "gemm_peak_gflops", lambda device, size=None, repeats=5: 100.0)
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", "ViT-Ti/16", "--batch-size", "2", "--image-size", "32", "--repeats", "1",
            "--warmup", "1", "--min-time", "0", "--threads", "1", "--mode", "infer", "--precision", "fp32",
            "--json", str(out)]  # fp32: the peak is the patched float32 one on every CPU (auto may pick bf16)
    assert main(argv) == 0
    assert "| vitlab | ViT-Ti/16 | infer |" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["gemm_peak_gflops"] == 100.0 and saved["settings"]["modes"] == ["infer"]


@pytest.mark.parametrize("argv", [
    ["bench", "--model", "ViT-Q/16"],
    ["bench", "--model", "ViT-Ti/16", "--image-size", "30"],
    ["bench", "--device", "cuda:99" if torch.cuda.is_available() else "cuda"],
    ["bench", "--threads", "0"],
])
def test_cli_bench_user_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exit_:  # a flag's range is checked while parsing (vitlab.cli.types)
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("vitlab bench: error:") and err.count("\n") == 1


def _paired(ours: list[float], theirs: list[float]) -> bench.BenchResult:
    """A result with hand-set img/s (no timing): vitlab and timm training, repeats paired in order."""
    settings = BenchSettings(model="ViT-Ti/16", modes=("train",), compare="timm", repeats=len(ours))
    result = bench.BenchResult(settings, {"precision": "fp32", "threads": 1}, 100.0)
    for impl, ips in (("vitlab", ours), ("timm", theirs)):
        result.measurements.append(bench.Measurement(impl, impl, "train", ips, 10**9, 10**9, 100.0))
    return result


def test_summary_says_when_the_repeats_disagree() -> None:
    # The case the old one-number summary hid: the median of the paired ratios says 1.091 (vitlab faster) while
    # the img/s medians of the table say vitlab is slower (10 against 11).
    result = _paired([10.0, 12.0, 8.0], [9.0, 11.0, 12.0])
    r = result.ratios()["train"]
    assert r["per_repeat"] == pytest.approx([10 / 9, 12 / 11, 8 / 12]) and r["median"] == pytest.approx(12 / 11)
    assert r["of_medians"] == pytest.approx(10 / 11) and (r["vitlab_faster_in"], r["repeats"]) == (2, 3)
    line = result.ratio_lines()[0]
    assert line.startswith("vitlab/timm train: per repeat 1.111, 1.091, 0.667; median 1.091, ratio of the img/s "
                           "medians above 0.909")
    assert line.endswith("no consistent winner: vitlab faster in 2 of 3 repeats, slower in 1")
    assert "their median need not equal the ratio of the medians" in result.table()


@pytest.mark.parametrize("ours,verdict", [([11.0, 12.0], "vitlab faster in every repeat (2 of 2)"),
                                          ([9.0, 8.0], "vitlab slower in every repeat (2 of 2)")])
def test_summary_of_consistent_repeats(ours: list[float], verdict: str) -> None:
    assert _paired(ours, [10.0, 10.0]).ratio_lines()[0].endswith(verdict)
