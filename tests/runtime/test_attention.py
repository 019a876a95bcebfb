"""--attention: the auto rule's decisions over CPUs (simulated through the flag reader), precisions and shapes, the
choice recorded in config.json and the banner with its reason, the form every attention module of the run computes
in, and the choice kept on resume."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import TINY_TRAIN
from tests.runtime.test_precision import COOPER_LAKE, EPYC_MILAN, XEON_AMX
from vitlab.cli import main
from vitlab.constants import MATMUL_ATTENTION_GAINS, SETTING_CHOICES
from vitlab.models.registry import model_config
from vitlab.runtime.attention import config_attention, training_attention
from vitlab.runtime.precision import cpu_flags
from vitlab.train import resolve, run
from vitlab.train.trainer import Trainer

EPYC_GENOA = "model name\t: AMD EPYC 9654 96-Core Processor\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
# The region measured faster on an AVX512-BF16 EPYC (BENCHMARKS.md "Training attention"), written out here: the rule
# is tested on it whatever the shipped table holds.
MEASURED = ({"cpu_flag": "avx512_bf16", "tokens": 17, "head_dim": 32, "batch": 8},)


@pytest.fixture(autouse=True)
def measured_table(monkeypatch):
    monkeypatch.setattr("vitlab.runtime.attention.MATMUL_ATTENTION_GAINS", MEASURED)


def decide(cpuinfo: str, tokens=197, head_dim=64, batch=32, precision="bf16", device="cpu", requested="auto"):
    return training_attention(requested, device, precision=precision, tokens=tokens, head_dim=head_dim, batch=batch,
                              flags=cpu_flags(cpuinfo))


@pytest.mark.parametrize("cpuinfo, tokens, head_dim, batch, expected", [
    (XEON_AMX, 197, 64, 32, "matmul"),  # ViT-S/16 and ViT-Ti/16 at 224 px, batch 32
    (XEON_AMX, 577, 64, 64, "matmul"),  # 384 px
    (EPYC_GENOA, 197, 64, 8, "matmul"),  # AVX512-BF16 without AMX
    (EPYC_GENOA, 17, 32, 128, "matmul"),  # the demo's shape
    (COOPER_LAKE, 50, 64, 32, "matmul"),
    (EPYC_GENOA, 197, 64, 4, "flash"),  # a batch below the smallest measured
    (EPYC_GENOA, 16, 64, 32, "flash"),  # fewer tokens than measured
    (EPYC_GENOA, 197, 16, 32, "flash"),  # narrower heads than measured
    (EPYC_MILAN, 197, 64, 32, "flash"),  # no native bf16 (bf16 training is emulated there)
    ("flags\t\t: amx_bf16 amx_tile\n", 197, 64, 32, "flash"),  # a flag alone that no region names
])
def test_auto_over_cpus_and_shapes(cpuinfo, tokens, head_dim, batch, expected):
    assert decide(cpuinfo, tokens, head_dim, batch).name == expected


def test_auto_reasons_say_why():
    assert decide(EPYC_GENOA).reason == (
        "auto: CPU has avx512_bf16 and 197 tokens per image >= 17 and head dim 64 >= 32 and batch 32 >= 8 (the "
        "matmul form's backward gains in bf16 training)")
    assert decide(XEON_AMX, batch=4).reason == (
        "auto: CPU has avx512_bf16 but 197 tokens per image, head dim 64, batch 4 is short of the matmul form's gain "
        "(>= 17 tokens per image and head dim >= 32 and batch >= 8)")
    assert decide(EPYC_MILAN).reason == "auto: the matmul form gains only on a CPU with avx512_bf16"
    assert decide(XEON_AMX, precision="fp32") == \
        type(decide(XEON_AMX))("flash", "auto: the matmul form gains in bf16 only, this run computes fp32")
    assert decide(XEON_AMX, device="cuda").reason == "auto: the fused kernel on cuda"
    assert decide(XEON_AMX, tokens=None, head_dim=None).reason == "auto: the model has no attention"


def test_a_form_asked_for_is_taken_anywhere():
    for form in ("flash", "matmul"):
        assert decide(EPYC_MILAN, requested=form, precision="fp32").to_dict() == {"name": form, "reason": "requested"}
    with pytest.raises(ValueError, match="^--attention must be one of auto, flash, matmul, not 'fast'$"):
        decide(XEON_AMX, requested="fast")


def test_the_table_bounds_what_the_rule_reads():
    assert SETTING_CHOICES["attention"] == ("auto", "flash", "matmul")
    assert all(set(region) == {"cpu_flag", "tokens", "head_dim", "batch"} for region in MATMUL_ATTENTION_GAINS)


def test_the_shipped_table_takes_the_matmul_form_for_vit_s16_bf16_training_on_avx512_bf16(monkeypatch):
    """The table as shipped (not the fixture's): ViT-S/16 bf16 training at batch 32 on an AMX Xeon and an
    AVX512-BF16 EPYC computes the matmul form; float32, a CPU without native bf16 and a GPU keep flash."""
    monkeypatch.undo()
    assert decide(XEON_AMX).name == decide(EPYC_GENOA).name == "matmul"
    assert decide(EPYC_GENOA, precision="fp32").name == decide(EPYC_MILAN).name == "flash"
    assert decide(XEON_AMX, device="cuda").name == "flash"


def test_an_empty_table_leaves_auto_at_flash(monkeypatch):
    monkeypatch.setattr("vitlab.runtime.attention.MATMUL_ATTENTION_GAINS", ())
    assert decide(XEON_AMX).to_dict() == {
        "name": "flash", "reason": "auto: the matmul form is used only when asked for (--attention matmul)"}
    assert decide(XEON_AMX, requested="matmul").name == "matmul"


def test_a_config_is_decided_by_its_tokens_and_head_dim(monkeypatch):
    monkeypatch.setattr("vitlab.runtime.attention.cpu_flags", lambda text=None: cpu_flags(XEON_AMX))
    assert config_attention("auto", model_config("ViT-S/16"), "cpu", "bf16", 32).name == "matmul"
    assert config_attention("auto", model_config("ViT-S/16"), "cpu", "bf16", 4).name == "flash"
    assert config_attention("auto", model_config("BiT-R50x1"), "cpu", "bf16", 32).name == "flash"


# --- the setting recorded, applied and kept ----------------------------------------------------------------------
def tiny(out, **overrides):
    """The resolved settings of a tiny run, with where each came from (the rule's reason for an auto choice)."""
    base = {**TINY_TRAIN, "out": str(out), "steps": 2, "eval_every": 0, "save_every": 2}
    return resolve("demo", {**base, **overrides})


def forms_of(model: torch.nn.Module) -> set[str]:
    return {m.attention_form for m in model.modules() if hasattr(m, "attention_form")}


def test_the_run_records_its_form_with_the_reason_and_computes_in_it(tmp_path, monkeypatch, caplog):
    """auto on a CPU with native bf16 for shapes in a region (the table lowered to the tiny run's shape): matmul,
    with the rule's reason in config.json and the banner, every attention module set; on a CPU without, flash."""
    monkeypatch.setattr("vitlab.runtime.attention.MATMUL_ATTENTION_GAINS",
                        ({"cpu_flag": "avx512_bf16", "tokens": 4, "head_dim": 16, "batch": 16},))
    monkeypatch.setattr("vitlab.runtime.attention.cpu_flags", lambda text=None: cpu_flags(XEON_AMX))
    seen: list[set[str]] = []
    real = Trainer._assemble
    monkeypatch.setattr(Trainer, "_assemble", lambda self, r: (real(self, r), seen.append(forms_of(self.model))))
    out = tmp_path / "run"
    with caplog.at_level("INFO", logger="vitlab"):
        assert run(tiny(out, precision="bf16")).status == "completed"
    record = json.loads((out / "config.json").read_text())
    assert record["attention"] == "matmul"
    assert record["sources"]["attention"].startswith("auto: CPU has avx512_bf16 and")
    assert f"attention matmul ({record['sources']['attention']})" in caplog.text
    assert seen == [{"matmul"}]
    monkeypatch.setattr("vitlab.runtime.attention.cpu_flags", lambda text=None: cpu_flags(EPYC_MILAN))
    assert run(tiny(tmp_path / "other", precision="bf16")).status == "completed"
    assert json.loads((tmp_path / "other" / "config.json").read_text())["attention"] == "flash"
    assert seen[-1] == {"flash"}


def test_the_flag_is_recorded_and_kept_on_resume(tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "2", "--attention", "matmul", "--data", "digits",
                 "--model", "ViT-Ti/4", "--depth", "1", "--width", "32", "--heads", "2", "--mlp-dim", "64",
                 "--image-size", "8", "--batch-size", "16", "--workers", "0", "--save-every", "2"]) == 0
    record = json.loads((out / "config.json").read_text())
    assert (record["attention"], record["sources"]["attention"]) == ("matmul", "flag")
    seen: list[set[str]] = []
    real = Trainer._assemble
    monkeypatch.setattr(Trainer, "_assemble", lambda self, r: (real(self, r), seen.append(forms_of(self.model))))
    assert main(["train", "--out", str(out), "--resume", "--steps", "3", "--attention", "auto"]) == 0
    assert seen == [{"matmul"}]  # auto on resume: the run's own choice
    assert main(["train", "--out", str(out), "--resume", "--steps", "4", "--attention", "flash"]) == 0
    assert seen[-1] == {"flash"} and json.loads((out / "config.json").read_text())["attention"] == "flash"


def test_an_unknown_form_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--out", "x", "--attention", "fast"])
    assert exit_info.value.code != 0
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_bench_trains_vitlab_in_the_form_train_would_take(monkeypatch):
    """`vitlab bench --mode train` times vitlab's model in the attention form `vitlab train` decides (auto) or is
    told, and says which."""
    from vitlab.bench import BenchSettings, measure, run_benchmark

    seen: list[set[str]] = []
    real = measure.make_step
    monkeypatch.setattr(measure, "make_step", lambda m, *a, **k: (seen.append(forms_of(m)), real(m, *a, **k))[1])
    base = dict(model="ViT-Ti/16", batch_size=2, image_size=32, repeats=1, warmup=1, min_time=0.0, gemm_size=64,
                threads=1, modes=("train",), precision="fp32")
    auto = run_benchmark(BenchSettings(**base))
    asked = run_benchmark(BenchSettings(**base, attention="matmul"))
    assert seen == [{"flash"}, {"matmul"}]
    assert auto.environment["attention"]["reason"] == "auto: the matmul form gains in bf16 only, this run computes fp32"
    assert "vitlab's training attention: matmul (requested)" in asked.table()
