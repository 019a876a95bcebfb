"""The GPU check script (benchmarks/device_check.py) dry-run on CPU, so that it cannot rot while no GPU is
available: tiny models, few steps, the CUDA-only parts skipped with a printed reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPT = BENCHMARKS / "device_check.py"
sys.path.insert(0, str(BENCHMARKS))

import device_check  # noqa: E402
import device_check_multi  # noqa: E402
import device_check_parity  # noqa: E402
import device_check_speed  # noqa: E402


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One dry run for the whole module (the budget raised so that a busy CI machine skips no section)."""
    out = tmp_path_factory.mktemp("device_check")
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--device", "cpu", "--out", str(out),
                           "--budget", "900"], capture_output=True, text=True, timeout=600)
    return done, json.loads((out / "device_check.json").read_text()), (out / "device_check.md").read_text()


def test_dry_run_passes_and_writes_every_section(dry_run):
    done, data, md = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert data["plan"]["name"] == "dry-run" and data["environment"]["device"] == "cpu"
    assert list(data["sections"]) == ["parity", "runs", "multi", "speed", "loader"]
    for name, section in data["sections"].items():
        assert section["status"] == "ok", (name, section)
        assert section["seconds"] > 0 or name == "multi"  # the dry run skips it whole (its own test runs it)
        assert f"### {name} (ok, " in md
    assert 0 < data["total_seconds"] < 900


def test_dry_run_prints_why_the_cuda_parts_are_skipped(dry_run):
    done, data, md = dry_run
    assert "skipped fp32 CUDA vs CPU rows: no CUDA device" in done.stdout
    assert "skipped torch.compile: not in the dry run" in done.stdout
    assert "skipped torchrun DDP/FSDP2: not in the dry run" in done.stdout
    assert "skipped: torch.compile" in md and "skipped: torchrun DDP/FSDP2" in md
    assert "skipped torchrun FSDP2 sharded save, resume on another world size and DDP: not in the dry run" \
        in done.stdout


def test_parity_on_cpu_is_within_bounds(dry_run):
    checks = {c["name"]: c for c in dry_run[1]["sections"]["parity"]["checks"]}
    for model in ("ViT-B/16", "R50+ViT-B/16"):
        for what in ("logits", "attention"):
            # float32 against float64 on the same weights: the floor the CUDA comparison (<= 1e-5) must reach
            assert 0 < checks[f"{model} {what} fp32 cpu vs fp64 cpu"]["value"] <= 1e-5
            bf16 = checks[f"{model} {what} bf16 autocast cpu vs fp32 cpu"]
            assert bf16["bound"] == 0.05 and 1e-4 < bf16["value"] <= 0.05 and bf16["passed"]
    bit = checks["BiT-R50x1 logits bf16 autocast cpu vs fp32 cpu"]
    assert bit["passed"] and "timm's bf16 error" in bit["note"]
    assert "BiT-R50x1 attention bf16 autocast cpu vs fp32 cpu" not in checks  # a CNN has none
    assert not any("cuda" in name for name in checks)


def test_speed_rows_and_targets(dry_run):
    speed = dry_run[1]["sections"]["speed"]
    rows = {(r["impl"], r["mode"], r["compiled"]): r for r in speed["rows"]}
    assert set(rows) == {(i, m, False) for i in ("vitlab", "timm") for m in ("train", "infer")}
    assert rows[("timm", "train", False)]["model"] == "vit_tiny_patch16_224"
    for r in rows.values():
        assert r["images_per_s"] > 0 and 0 < r["mfu_pct"] < 100
        assert r["mfu_pct"] == pytest.approx(r["pct_measured_gemm"])  # CPU: the measured GEMM is the peak
    # ViT-Ti/16 at 32 px, by hand: 5 tokens of width 192 (MLP 768), 12 blocks, 4 patches, a 1000-class head;
    # multiply-adds per block: qkv 5·192·576 + out 5·192·192 + q·kᵀ and a·v 2·5·5·192 + MLP 2·5·192·768
    macs = 12 * (5 * 192 * 576 + 5 * 192 * 192 + 2 * 5 * 5 * 192 + 2 * 5 * 192 * 768) + 4 * 3 * 16 * 16 * 192 \
        + 192 * 1000
    assert speed["flops_per_train_image"] == 2 * 3 * macs  # 2 FLOPs per multiply-add, training = 3 x forward
    assert [t["name"] for t in speed["targets"]] == ["vitlab train eager >= timm train eager (img/s ratio)"]


def test_resume_and_loader_on_cpu(dry_run):
    sections = dry_run[1]["sections"]
    resume = sections["runs"]["checks"]
    assert [c["passed"] for c in resume] == [True, True] and all("bit-identical" in c["name"] for c in resume)
    assert len(sections["runs"]["single_process_losses"]) == 6
    loader = sections["loader"]
    assert [r["resize"] for r in loader["rows"]] == ["pil", "tensor"]
    assert all(r["images_per_s"] > 0 and r["workers"] >= 0 for r in loader["rows"])
    assert loader["bottleneck"].startswith(("the model", "the loader"))


def test_rel_error_is_max_difference_over_max_reference():
    ref = torch.tensor([[1.0, -4.0], [2.0, 0.5]])
    out = ref + torch.tensor([[0.0, 0.1], [-0.2, 0.0]])
    assert device_check_parity.rel_error(out, ref) == pytest.approx(0.2 / 4.0)
    assert device_check_parity.check("x", 0.3, 0.2)["passed"] is False
    assert device_check_parity.check("x", 0.3, None)["passed"] is None


def test_mfu_peak_and_targets():
    assert device_check_speed.PEAKS["H200"][0] == 989.0
    assert device_check_speed.datasheet_peak(torch.device("cpu"))[0] is None
    rows = [{"impl": "vitlab", "mode": "train", "compiled": True, "mfu_pct": 52.0, "images_per_s": 3000.0},
            {"impl": "vitlab", "mode": "infer", "compiled": True, "images_per_s": 9000.0},
            {"impl": "timm", "mode": "infer", "compiled": True, "images_per_s": 10000.0}]
    got = {t["name"]: (t["value"], t["met"]) for t in device_check_speed.targets(rows)}
    assert got == {"vitlab train MFU compiled >= 50 %": (52.0, True),
                   "vitlab infer compiled >= timm infer compiled": (0.9, False)}


def test_a_failing_section_is_recorded_and_the_next_one_runs(tmp_path):
    report = device_check.Report(tmp_path, device_check.DRY_RUN, torch.device("cpu"))

    def broken():
        raise RuntimeError("no such kernel")

    device_check.run_section(report, device_check.DRY_RUN, "parity", broken)
    ok = {"checks": [device_check_parity.check("a", 1.0, 2.0)]}
    device_check.run_section(report, device_check.DRY_RUN, "runs", lambda: ok)
    data = json.loads((tmp_path / "device_check.json").read_text())
    assert data["sections"]["parity"]["status"] == "error"
    assert data["sections"]["parity"]["error"] == "RuntimeError: no such kernel"
    assert data["sections"]["runs"]["status"] == "ok"
    md = (tmp_path / "device_check.md").read_text()
    assert "error: `RuntimeError: no such kernel`" in md and "| a | 1 | 2 | yes |" in md
    tight = device_check.Plan(**{**device_check.asdict(device_check.DRY_RUN), "budget_s": 0.0})
    device_check.run_section(report, tight, "loader", lambda: pytest.fail("ran without budget"))
    assert "skipped: it needs up to" in json.loads((tmp_path / "device_check.json").read_text())[
        "sections"]["loader"]["reason"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_the_full_check_without_cuda_is_refused_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(
        "error: the full check needs a CUDA device (torch sees none); --dry-run checks the script on CPU")
    assert not (tmp_path / "device_check.json").exists()


@pytest.mark.slow
def test_the_gpu_plan_code_paths_on_cpu(tmp_path):
    """What the dry run leaves out, on CPU at dry-run sizes: torch.compile of both libraries, torchrun with DDP and
    FSDP2 (gloo) and every training run as a subprocess, as the full check runs them on a GPU."""
    plan = device_check.Plan(**{**device_check.asdict(device_check.DRY_RUN), "compile": True, "torchrun": True,
                                "in_process": False, "budget_s": 1800.0,
                                "estimates": {**device_check.DRY_RUN.estimates, "speed_compiled": 60}})
    assert device_check.run_all(plan, torch.device("cpu"), tmp_path) == 0
    sections = json.loads((tmp_path / "device_check.json").read_text())["sections"]
    assert all(s["status"] == "ok" for s in sections.values())
    compiled = [r for r in sections["speed"]["rows"] if r["compiled"]]
    assert len(compiled) == 4 and all(r["images_per_s"] > 0 for r in compiled)
    assert {t["name"] for t in sections["speed"]["targets"]} >= {"vitlab infer compiled >= timm infer compiled"}
    runs = {c["name"]: c for c in sections["runs"]["checks"]}
    for name in ("DDP (gloo)", "FSDP2"):
        assert runs[f"torchrun --nproc-per-node 1 {name} vs 1 process: train losses"]["passed"]


def test_the_multi_process_section_on_two_gloo_processes(tmp_path):
    """The section the dry run leaves out, at dry-run sizes on CPU: 2 gloo processes of FSDP2 write one shard file
    each per checkpoint, the run resumes on 1 process, its last checkpoint converts to its final weights and a
    2-process DDP run trains the same losses."""
    plan = device_check.Plan(**{**device_check.asdict(device_check.DRY_RUN), "torchrun": True, "in_process": False})
    result = device_check_multi.run(plan, torch.device("cpu"))
    assert result["nproc"] == 2 and result["backend"] == "gloo" and result["skipped"] == []
    checks = {c["name"]: c for c in result["checks"]}
    assert all(c["passed"] for c in checks.values()), checks
    assert len(result["fsdp_losses"]) == plan.run_steps
    for step in (3, 6):
        shards = checks[f"FSDP2 step_{step:08d}: one shard file per process"]
        assert shards["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert checks["vitlab convert checkpoints/step_00000006 equals the run's gathered weights"]["value"] is True
    resumed = checks["FSDP2 resumed from step 3 on 1 process (saved on 2): train losses"]
    assert resumed["value"] <= device_check_multi.FSDP_REL
    assert checks["DDP (gloo) vs FSDP2 on 2 process(es): train losses"]["value"] <= device_check_multi.FSDP_REL
    report = device_check.Report(tmp_path, plan, torch.device("cpu"))
    report.record("multi", {**result, "status": "ok", "seconds": 1.0})
    md = (tmp_path / "device_check.md").read_text()
    assert "### multi (ok, 1.0 s)" in md and "| FSDP2 step_00000006: one shard file per process | 3 | 3 | yes |" in md


def test_one_gpu_runs_one_process_and_says_why_world_size_checks_are_skipped(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert device_check_multi.world_size(torch.device("cuda")) == 1
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert device_check_multi.world_size(torch.device("cuda")) == 8
    assert device_check_multi.world_size(torch.device("cpu")) == 2


def test_the_speed_section_computes_in_the_precision_asked_for(monkeypatch):
    """--precision reaches vitlab bench: int8 times inference only, both libraries in int8, and says so."""
    from vitlab.bench import measure

    monkeypatch.setattr(measure, "gemm_peak_gflops", lambda device, size=None, repeats=5: 100.0)
    plan = device_check.Plan(**{**device_check.asdict(device_check.DRY_RUN), "precision": "int8", "speed_repeats": 1})
    report = type("Report", (), {"elapsed": lambda self: 0.0})()
    speed = device_check_speed.run(plan, torch.device("cpu"), report)
    assert {(r["impl"], r["mode"]) for r in speed["rows"]} == {("vitlab", "infer"), ("timm", "infer")}
    assert speed["precision"].startswith("int8 (dynamic int8 Linear layers") and "int8" in speed["gemm_peaks"]
    assert "--precision" in subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                                           text=True, timeout=120).stdout
