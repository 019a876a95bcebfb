"""--precision: the auto rule on both kinds of CPU (simulated through the flag reader) and on CUDA, the
choice recorded in config.json and kept on resume, bf16's numerical bound against float32 on a trained model,
bf16 training, and the experiments pinned to float32 without any run key changing."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
import torch

import vitlab
from reproduction.cli import main as campaign  # vitlab's command line with the campaign's verb
from tests.conftest import TINY_TRAIN, TINY_VIT_ARGS
from vitlab.cli import main
from vitlab.constants import BF16_GAINS
from vitlab.models.registry import model_config
from vitlab.runtime.precision import (
    USES,
    Precision,
    autocast_for,
    config_shape,
    config_tokens,
    cpu_flags,
    native_bf16,
    prepare_for_inference,
    resolve_precision,
    training_precision,
)
from vitlab.train import resolve_config, run
from vitlab.train.resolution import resolve

CPU = torch.device("cpu")
# /proc/cpuinfo excerpts of the three kinds of CPU (flags abridged to what matters and a few neighbours)
XEON_AMX = "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 " \
           "amx_tile amx_int8\n"
COOPER_LAKE = "model name\t: Intel(R) Xeon(R) Platinum 8380H\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
EPYC_MILAN = "model name\t: AMD EPYC 7763 64-Core Processor\nflags\t\t: fpu sse2 avx2 fma bmi2 sha_ni\n"

def tiny(out, **overrides):
    base = {**TINY_TRAIN, "out": str(out), "steps": 8, "eval_every": 0, "save_every": 4}
    return resolve_config("demo", **{**base, **overrides})


# --- the auto rule ---------------------------------------------------------------------------------------------
def test_flag_reader_finds_native_bf16():
    assert native_bf16(cpu_flags(XEON_AMX)) and native_bf16(cpu_flags(COOPER_LAKE))
    assert not native_bf16(cpu_flags(EPYC_MILAN))
    assert cpu_flags("model name\t: no flags line\n") == frozenset()


@pytest.mark.parametrize("cpuinfo, width, expected", [
    (XEON_AMX, 768, "bf16"), (XEON_AMX, 384, "bf16"), (XEON_AMX, 192, "fp32"), (XEON_AMX, 64, "fp32"),
    (COOPER_LAKE, 1024, "bf16"), (COOPER_LAKE, 64, "fp32"),
    (EPYC_MILAN, 1280, "fp32"), (EPYC_MILAN, 64, "fp32"),
    (XEON_AMX, None, "fp32"),  # a model of unknown size: never risk being slower
])
def test_auto_on_cpu(cpuinfo, width, expected):
    """Training a ViT of head dim 64 on 16 px images (17 tokens): only the width decides."""
    chosen = resolve_precision("auto", CPU, use="train", width=width, head_dim=64, tokens=17,
                               flags=cpu_flags(cpuinfo))
    assert chosen.name == expected
    assert chosen.reason.startswith("auto: ")


def test_auto_reasons_say_why():
    amx = cpu_flags(XEON_AMX)
    assert resolve_precision("auto", CPU, use="infer", width=768, head_dim=64, tokens=197, flags=amx).reason == \
        "auto: CPU has amx_bf16 and width 768 >= 160 (bf16 gains in inference)"
    assert resolve_precision("auto", CPU, use="train", width=768, head_dim=64, tokens=197, flags=amx).reason == \
        "auto: CPU has amx_bf16 and width 768 >= 256 and head dim 64 >= 64 (bf16 gains in training)"
    assert resolve_precision("auto", CPU, use="infer", width=64, head_dim=32, tokens=65, flags=amx).reason == \
        "auto: CPU has amx_bf16 but width 64, head dim 32 and 65 tokens per image are too small to gain from bf16 " \
        "in inference"
    assert resolve_precision("auto", CPU, use="infer", width=64, flags=amx).reason == \
        "auto: CPU has amx_bf16 but width 64 is too small to gain from bf16 in inference"  # a BiT's width alone
    assert "no native bf16" in resolve_precision("auto", CPU, use="infer", width=768,
                                                 flags=cpu_flags(EPYC_MILAN)).reason


def test_auto_on_cuda_is_bf16_whatever_the_size():
    for width in (32, 768):
        assert resolve_precision("auto", torch.device("cuda"), use="train", width=width, flags=frozenset()) == \
            Precision("bf16", "auto: CUDA computes bf16 natively")


def test_explicit_choices_and_refusals():
    assert resolve_precision("fp32", torch.device("cuda"), use="train").name == "fp32"
    assert resolve_precision("bf16", CPU, use="train", flags=frozenset()).name == "bf16"
    assert resolve_precision("int8", CPU, use="infer").name == "int8"
    with pytest.raises(ValueError, match=r"^--precision int8 is for the inference verbs only \(eval, predict, bench, "
                                         r"export\); use auto, fp32 or bf16 here$"):
        resolve_precision("int8", CPU, use="train")
    with pytest.raises(ValueError, match=r"^--precision must be one of auto, fp32, bf16, int8, not 'fp16'$"):
        resolve_precision("fp16", CPU, use="infer")


def test_every_named_model_is_fp32_on_a_cpu_without_native_bf16():
    """On a CPU without native bf16 (an AMD EPYC Milan's flags) auto picks float32 for every model."""
    amd = cpu_flags(EPYC_MILAN)
    for name in vitlab.list_models():
        shape = config_shape(model_config(name))
        assert resolve_precision("auto", CPU, use="infer", **shape, flags=amd).name == "fp32", name


def auto(use: str, name: str, **args) -> Precision:
    """`auto` on an AMX Xeon for the named model with these arguments."""
    return resolve_precision("auto", CPU, use=use, **config_shape(model_config(name, **args)),
                             flags=cpu_flags(XEON_AMX))


def test_on_native_bf16_the_catalogue_infers_in_bf16_and_short_narrow_sequences_in_float32():
    """Inference: ViT-Ti/16 and larger at 224 px (measured 1.12-1.75x faster, 1.9-3.1x for ViT-Ti/16 on an AMX
    Xeon) compute in bf16; a width-128 ViT on 17 tokens of 16 px images (the demo's, 0.86-0.97x) and the
    experiments' width-64 models (0.91x at batch 1) in float32, while width 160 gains from 17 tokens (1.12-1.27x),
    width 192 too (1.18-1.23x); width 64 stays float32 at 197 tokens, where it loses at batch 1 (0.85-0.95x)."""
    assert [auto("infer", n).name for n in ("ViT-Ti/16", "ViT-S/16", "ViT-B/16", "ViT-L/16", "R50+ViT-B/16",
                                            "BiT-R50x1")] == ["bf16"] * 6
    assert auto("infer", "ViT-Ti/4", image_size=32, depth=6, width=64, num_heads=2, mlp_dim=128).name == "fp32"
    assert auto("infer", "ViT-Ti/4", image_size=16, depth=4, width=128, num_heads=4, mlp_dim=256).name == "fp32"
    assert auto("infer", "ViT-Ti/16", image_size=112, width=128, num_heads=2, mlp_dim=512).name == "bf16"  # 50 tokens
    assert auto("infer", "ViT-Ti/16", image_size=64).reason == \
        "auto: CPU has amx_bf16 and width 192 >= 160 (bf16 gains in inference)"
    assert auto("infer", "ViT-Ti/16", image_size=64, width=160, num_heads=2, mlp_dim=640).name == "bf16"  # 17 tokens
    assert auto("infer", "ViT-Ti/16", image_size=224, width=64, num_heads=1, mlp_dim=256).name == "fp32"


def test_each_use_reads_its_own_regions(monkeypatch):
    """Inference and training read their own entry of the one table, and the reason names the use."""
    monkeypatch.setitem(BF16_GAINS, "infer", ({"width": 512},))
    assert auto("infer", "ViT-S/16") == Precision("fp32", "auto: CPU has amx_bf16 but width 384, head dim 64 and "
                                                          "197 tokens per image are too small to gain from bf16 in "
                                                          "inference")
    assert auto("train", "ViT-S/16").name == "bf16"


def test_training_gains_from_wide_heads_or_long_sequences():
    """Training: ViT-Ti/16 at 224 px (197 tokens, 1.31-1.56x) and width 160-192 from 50 tokens (1.13-1.30x) in bf16;
    on the demo's 17 tokens a head dim of 64 gains from width 256 (1.22-1.26x) while head dim 32 loses even at
    width 256-384 (0.74-0.99x), as do the same models on small images and the experiments' 32 px models (65
    tokens, widths 48-96); a BiT by its width (256: 1.19-1.37x)."""
    assert config_tokens(model_config("ViT-Ti/16")) == 197
    assert auto("train", "ViT-Ti/16").name == "bf16"
    assert auto("train", "ViT-Ti/16", width=128, num_heads=4, mlp_dim=512) == Precision(
        "bf16", "auto: CPU has amx_bf16 and width 128 >= 64 and 197 tokens per image >= 197 (bf16 gains in training)")
    assert auto("train", "ViT-Ti/16", image_size=112).reason == (
        "auto: CPU has amx_bf16 and width 192 >= 160 and head dim 64 >= 64 and 50 tokens per image >= 50 (bf16 "
        "gains in training)")
    assert auto("train", "ViT-Ti/16", image_size=64).reason == (
        "auto: CPU has amx_bf16 but width 192, head dim 64 and 17 tokens per image are too small to gain from bf16 "
        "in training")
    demo_shape = {"image_size": 16, "depth": 4}
    assert auto("train", "ViT-Ti/4", **demo_shape, width=256, num_heads=4, mlp_dim=1024).name == "bf16"  # head 64
    assert auto("train", "ViT-Ti/4", **demo_shape, width=256, num_heads=8, mlp_dim=1024).name == "fp32"  # head 32
    assert auto("train", "ViT-Ti/4", **demo_shape, width=384, num_heads=12, mlp_dim=768).name == "fp32"  # head 32
    assert auto("train", "ViT-Ti/4", image_size=32, depth=6, width=64, num_heads=2, mlp_dim=128).name == "fp32"
    assert auto("train", "ViT-Ti/16", width=32, num_heads=1, mlp_dim=128).name == "fp32"  # narrower than measured
    assert config_tokens(model_config("BiT-R50x1")) is None
    assert auto("train", "BiT-R50x1").reason == "auto: CPU has amx_bf16 and width 256 >= 256 (bf16 gains in training)"
    assert training_precision(model_config("ViT-Ti/16"), CPU).name == ("bf16" if native_bf16(cpu_flags()) else
                                                                         "fp32")


def test_the_table_has_regions_for_each_use_bounding_only_what_a_config_has():
    assert set(BF16_GAINS) == set(USES)
    assert all(region and set(region) <= {"width", "tokens", "head_dim"} and "width" in region
               for regions in BF16_GAINS.values() for region in regions)


# --- the setting recorded and kept ---------------------------------------------------------------------------
def test_auto_is_resolved_once_with_its_reason(monkeypatch):
    monkeypatch.setattr("vitlab.runtime.precision.cpu_flags", lambda text=None: cpu_flags(XEON_AMX))
    wide = resolve("demo", {"model": "ViT-S/16", "image_size": 32, "device": "cpu"})
    assert wide.config.precision == "bf16"
    assert wide.sources["precision"] == ("auto: CPU has amx_bf16 and width 384 >= 256 and head dim 64 >= 64 (bf16 "
                                         "gains in training)")
    small = resolve("demo", {"device": "cpu"})  # the demo's ViT, width 128, 17 tokens of 16 px images
    assert (small.config.precision, small.sources["precision"]) == \
        ("fp32", "auto: CPU has amx_bf16 but width 128, head dim 32 and 17 tokens per image are too small to gain "
                 "from bf16 in training")
    given = resolve("demo", {"model": "ViT-S/16", "device": "cpu", "precision": "fp32"})
    assert (given.config.precision, given.sources["precision"]) == ("fp32", "flag")


def test_precision_is_recorded_and_kept_on_resume(tmp_path, caplog):
    out = tmp_path / "run"
    with caplog.at_level("INFO", logger="vitlab"):
        first = run(tiny(out, precision="bf16", steps=2, batch_size=16))
    assert first.status == "completed"
    record = json.loads((out / "config.json").read_text())
    assert (record["precision"], record["sources"]["precision"]) == ("bf16", "given")
    assert "compute bf16 (given)" in caplog.text  # the banner
    assert tiny(out, resume=True, precision="auto", steps=6, batch_size=16).precision == "bf16"  # the run's choice
    assert tiny(out, resume=True, steps=6, batch_size=16).precision == "bf16"
    with pytest.raises(ValueError, match=r"^--precision fp32 contradicts the run in .*run \(stored: bf16\); resume "
                                         r"without it, or start a new run with another --out DIR$"):
        tiny(out, resume=True, precision="fp32", steps=6, batch_size=16)


def test_a_run_recorded_before_the_setting_resumes_as_it_computed(tmp_path, monkeypatch):
    """No 'precision' in config.json: float32 on CPU, as such a run computed (bf16 autocast on CUDA only), even
    where auto would now choose bf16."""
    out = tmp_path / "run"
    run(tiny(out, steps=2, precision="fp32"))
    record = json.loads((out / "config.json").read_text())
    del record["precision"], record["sources"]["precision"]
    (out / "config.json").write_text(json.dumps(record))
    manifest = json.loads((out / "checkpoints" / "step_00000002" / "manifest.json").read_text())
    del manifest["settings"]["precision"]  # nor did its checkpoints record it
    (out / "checkpoints" / "step_00000002" / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr("vitlab.runtime.precision.cpu_flags", lambda text=None: cpu_flags(XEON_AMX))
    resumed = resolve(None, {"out": str(out), "resume": True, "precision": "auto"})
    assert resumed.config.precision == "fp32" and "recorded before --precision" in resumed.sources["precision"]


def test_cli_refuses_int8_for_training_and_another_precision_for_experiments(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--precision", "int8", "--steps", "1"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("vitlab train: error: argument --precision: int8 is for the inference verbs "
                                       "only (eval, predict, bench, export); use auto, fp32 or bf16 here (see "
                                       "vitlab train --help)\n")
    assert campaign(["experiment", "pilot", "--precision", "bf16", "--estimate"]) == 2
    assert capsys.readouterr().err == ("vitlab experiment: error: --precision bf16: the experiment designs pin fp32 "
                                       "(their recorded runs were trained in it, and a run's result must not depend "
                                       "on the machine); use auto or fp32\n")


# --- bf16 against float32 on a trained model ------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "run"
    run(tiny(out, steps=60, save_every=0, precision="fp32", lr=3e-3))
    return out


def _val_batch(model, n=256):
    from vitlab.data import build_datasets

    data, transform = build_datasets("digits", None, False), vitlab.transforms(model)
    return torch.stack([transform(data.val.load(i)) for i in range(n)])  # held-out, normalised as eval does


def test_bf16_inference_is_within_its_bound_of_float32(trained):
    """bf16 weights (prepare_for_inference) on held-out digits: logits within 2% relative (bf16 keeps 8 bits of
    mantissa: 0.4% per rounding), the same top-1 for at least 98% of the images (measured: 0.51%, 99.6%)."""
    model = vitlab.load(trained / "model.safetensors")
    x = _val_batch(model)
    with torch.no_grad():
        reference = model(x)
        fast = prepare_for_inference(vitlab.load(trained / "model.safetensors"), "bf16")
        assert next(fast.parameters()).dtype == torch.bfloat16
        with autocast_for(CPU, "bf16"):
            logits = fast(x)
    assert logits.dtype == torch.float32  # callers see float32 logits
    relative = ((logits - reference).norm() / reference.norm()).item()
    agreement = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
    print(f"bf16 vs float32: logits {relative:.2%} relative, top-1 agreement {agreement:.1%}")
    assert relative < 0.02 and agreement >= 0.98, (relative, agreement)
    assert relative > 0  # it did compute in bf16


def test_eval_cli_records_the_precision(trained, capsys, tmp_path):
    weights = tmp_path / "model.safetensors"  # outside its run: no confusion figure to write
    weights.write_bytes((trained / "model.safetensors").read_bytes())
    assert main(["eval", "--weights", str(weights), "--data", "digits", "--json", "--precision", "fp32"]) == 0
    record = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert record["precision"] == {"name": "fp32", "reason": "requested: float32 (exact)"}


# --- bf16 training ----------------------------------------------------------------------------------------------
def test_bf16_training_runs_and_learns_with_float32_master_weights(tmp_path):
    out = tmp_path / "run"
    result = run(tiny(out, precision="bf16", steps=30, batch_size=16, lr=3e-3, log_every=1, save_every=30))
    losses = [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if r.get("split") == "train"]
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1
    state = torch.load(next((out / "checkpoints").iterdir()) / "state.pt", weights_only=True)
    moments = [t for s in state["optimizer"]["state"].values() for t in s.values() if t.dim() > 0]
    assert moments and all(t.dtype == torch.float32 for t in moments)  # optimizer state stays float32
    assert all(p.dtype == torch.float32 for p in vitlab.load(result.weights).parameters())


@pytest.mark.slow
def test_kill_then_resume_is_bit_identical_under_bf16(tmp_path, monkeypatch):
    from tests.train.test_checkpoint import _cli, _env, same_weights, signal_at_checkpoint
    from vitlab.cli import build_parser
    from vitlab.cli.train import build_config

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    extra = ("--precision", "bf16")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run(build_config(build_parser().parse_args(_cli(tmp_path / "ref", *extra)[3:])))
    finally:
        torch.set_num_threads(threads)
    killed = signal_at_checkpoint(_cli(tmp_path / "run", *extra), _env(), tmp_path / "run", signal.SIGKILL, 40)
    assert killed.returncode == -signal.SIGKILL
    resumed = subprocess.run(_cli(tmp_path / "run", "--resume"), env=_env(), capture_output=True, text=True,
                             timeout=900)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((tmp_path / "run" / "config.json").read_text())["precision"] == "bf16"
    assert same_weights(tmp_path / "ref" / "model.safetensors", tmp_path / "run" / "model.safetensors")


# --- the experiments stay float32 and keep their keys ----------------------------------------------------------
RECORDS = Path(__file__).resolve().parents[2] / "reproduction" / "records"
EXPERIMENTS = ("data-scaling", "compute", "pos-embed", "token-vs-gap", "attention-distance", "mpp")


def test_committed_records_keep_their_keys():
    from reproduction.spec import RunSpec

    paths = sorted(RECORDS.glob("*.json"))
    assert len(paths) > 100
    for path in paths:
        spec = json.loads(path.read_text())["spec"]
        rebuilt = RunSpec(spec["label"], spec["recipe"], spec["settings"], spec["verb"], spec["init"], spec["curve"])
        assert rebuilt.key == spec["key"] == path.name.split("-")[0], path.name


def test_an_experiment_run_computes_in_float32_even_where_auto_would_not(tmp_path, monkeypatch):
    from reproduction.runner import train_spec
    from reproduction.spec import RunSpec

    monkeypatch.setattr("vitlab.runtime.precision.cpu_flags", lambda text=None: cpu_flags(XEON_AMX))
    settings = {"model": "ViT-Ti/4", "model_args": {**TINY_VIT_ARGS, "width": 384, "num_heads": 6}, "image_size": 8,
                "batch_size": 16, "steps": 2, "warmup": 0, "workers": 0, "data": "digits"}
    spec = RunSpec("wide", "demo", settings)
    assert resolve("demo", {**settings, "device": "cpu"}).config.precision == "bf16"  # what auto would pick
    train_spec(spec, tmp_path / "run", None)
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    assert record["precision"] == "fp32" and record["sources"]["precision"] == "flag"


@pytest.mark.slow
def test_every_experiment_run_is_still_done(tmp_path, capsys, monkeypatch):
    """`vitlab experiment all --estimate` with the committed records: nothing to train again."""
    monkeypatch.chdir(RECORDS.parents[1])
    assert campaign(["experiment", "all", "--estimate", "--out", str(tmp_path / "x")]) == 0
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.split(":")[0] in EXPERIMENTS]
    assert len(lines) == 6 and all("every run is already done" in line for line in lines), lines


def test_load_with_a_precision(trained):
    model = vitlab.load(trained / "model.safetensors", precision="bf16")
    assert model.precision == Precision("bf16", "requested")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model(torch.zeros(2, 3, 8, 8)).dtype == torch.float32  # float32 images in, float32 logits out
    exact = vitlab.load(trained / "model.safetensors", precision="fp32")
    assert exact.precision.name == "fp32" and next(exact.parameters()).dtype == torch.float32
