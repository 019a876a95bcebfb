"""Every numeric flag refuses nonsense as one line with exit code 2 and no traceback, and still runs with a
valid value.

The table is (verb, flag, valid value, invalid values): add a row per flag. NONSENSE is {0, -1, nan, inf,
1e30}; a row lists what is invalid for its flag (`but(...)` removes the values that are legal there, e.g. 0
workers). BASE gives each verb's minimal command line; `run=False` rows only parse their valid value, for
verbs too slow to run in a unit test (e.g. train: add its flags with run=False or a tiny BASE).
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from PIL import Image

import vitlab
from vitlab.cli import build_parser, main
from vitlab.eval.prediction import predict
from vitlab.models import ViTConfig, build_model

NONSENSE = ("0", "-1", "nan", "inf", "1e30")
DEVICES = ("bogus", "cuda:x", "CUDA", "-1")
TOO_BIG = ("4097", "1" + "0" * 30)  # image sizes beyond MAX_IMAGE_SIZE: a typo must not allocate for it


def but(*legal: str) -> tuple[str, ...]:
    return tuple(v for v in NONSENSE if v not in legal)


@dataclass(frozen=True)
class Flag:
    verb: str
    flag: str
    valid: str
    invalid: tuple[str, ...] = NONSENSE
    run: bool = True  # False: only parse the valid value
    extra: tuple[str, ...] = ()  # flags the row needs besides BASE (e.g. models --pretrained)
    says: str = "must be"  # what the error line says about the allowed values


FLAGS = [
    Flag("eval", "--batch-size", "64"),
    Flag("eval", "--workers", "0", but("0")),
    Flag("eval", "--device", "cpu", DEVICES),
    Flag("predict", "--top-k", "2"),
    Flag("predict", "--device", "cpu", DEVICES),
    Flag("fewshot", "--shots", "2,all"),
    Flag("fewshot", "--seeds", "2"),
    Flag("fewshot", "--l2", "32", but("1e30")),
    Flag("fewshot", "--l2-sweep", "1,32", (*but("1e30"), "1,nan", "4,-2")),
    Flag("fewshot", "--batch-size", "64"),
    Flag("fewshot", "--val-fraction", "0.5", (*NONSENSE, "1")),
    Flag("fewshot", "--device", "cpu", DEVICES),
    Flag("analyze", "--image-size", "16", (*NONSENSE, *TOO_BIG)),
    Flag("analyze", "--num-images", "2"),
    Flag("analyze", "--discard-ratio", "0.5", (*but("0"), "1")),
    Flag("analyze", "--components", "2"),
    Flag("analyze", "--out", "{tmp}/figures", ("{file}",), says="existing file"),
    Flag("convert", "--image-size", "16", (*NONSENSE, *TOO_BIG)),
    Flag("convert", "--num-classes", "4", (*NONSENSE, "1000001")),
    Flag("models", "--image-size", "32", (*NONSENSE, *TOO_BIG)),
    Flag("models", "--resolution", "224", extra=("--pretrained",)),
    Flag("bench", "--batch-size", "2"),
    Flag("bench", "--image-size", "16", (*NONSENSE, *TOO_BIG)),
    Flag("bench", "--threads", "1"),
    Flag("bench", "--repeats", "2"),
    Flag("bench", "--warmup", "0", but("0")),
    Flag("bench", "--min-time", "0.01", (*but("0"), "3601")),
    Flag("bench", "--device", "cpu", DEVICES),
    Flag("bench", "--json", "{tmp}/bench.json", ("{tmp}", "{tmp}/missing/bench.json"), says="folder"),
    # train and finetune: BASE resolves and prints the settings (--print-config), so valid values run in ms
    *[Flag("train", f, v) for f, v in [("--steps", "5"), ("--batch-size", "8"), ("--accum", "2"),
                                        ("--eval-batch-size", "8"), ("--log-every", "5"), ("--keep-last", "1")]],
    *[Flag("train", f, "0", but("0")) for f in ("--warmup", "--eval-every", "--save-every", "--fewshot-every",
                                                 "--workers", "--seed", "--representation-size")],
    *[Flag("train", f, "0.01", but("0", "1e30")) for f in ("--lr", "--wd", "--clip", "--linear-end", "--mixup")],
    *[Flag("train", f, "0.1", (*but("0"), "1")) for f in ("--val-fraction", "--ema")],
    *[Flag("train", f, "0.1", (*but("0"), "1")) for f in ("--momentum", "--label-smoothing", "--dropout")],
    Flag("train", "--image-size", "16", (*NONSENSE, *TOO_BIG)),
    Flag("train", "--num-classes", "10", (*NONSENSE, "1000001")),
    Flag("train", "--head-bias-init", "-10", ("nan", "inf")),
    *[Flag("train", f, "8") for f in ("--depth", "--width", "--heads", "--mlp-dim")],
    Flag("train", "--device", "cpu", DEVICES),
    Flag("finetune", "--dev-fraction", "0.02", (*NONSENSE, "1"), extra=("--lr-sweep", "0.01,0.03")),
]


@dataclass
class Env:
    tmp: Path
    weights: Path
    image: Path
    file: Path  # an existing file the user owns: must never be overwritten

    def fill(self, text: str) -> str:
        return text.format(tmp=self.tmp, file=self.file)


BASE = {
    "eval": lambda e: ["eval", "--weights", str(e.weights), "--data", "digits"],
    "predict": lambda e: ["predict", "--weights", str(e.weights), str(e.image)],
    "fewshot": lambda e: ["fewshot", "--weights", str(e.weights), "--data", "digits", "--shots", "1", "--seeds", "1"],
    "analyze": lambda e: ["analyze", "--weights", str(e.weights), "--out", str(e.tmp / "figs"), "--num-images", "1"],
    "convert": lambda e: ["convert", str(e.weights), str(e.tmp / "converted.safetensors")],
    "models": lambda e: ["models"],
    "train": lambda e: ["train", "--print-config", "--out", str(e.tmp / "run")],
    "finetune": lambda e: ["finetune", "--print-config", "--init", str(e.weights), "--data", "digits", "--out",
                           str(e.tmp / "ft")],
    "bench": lambda e: ["bench", "--model", "ViT-Ti/16", "--batch-size", "1", "--image-size", "32", "--repeats", "1",
                        "--warmup", "0", "--min-time", "0", "--threads", "1", "--mode", "infer"],
}


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Env:
    tmp = tmp_path_factory.mktemp("fuzz")
    torch.manual_seed(0)
    model = build_model(ViTConfig(image_size=8, patch_size=4, width=16, depth=1, mlp_dim=32, num_heads=2,
                                  num_classes=10))
    model.class_names = [str(d) for d in range(10)]  # the embedded digits' classes
    vitlab.save(model, tmp / "tiny.safetensors")
    Image.new("RGB", (8, 8), (10, 200, 30)).save(tmp / "x.png")
    (tmp / "notes.txt").write_text("the user's own file\n")
    return Env(tmp, tmp / "tiny.safetensors", tmp / "x.png", tmp / "notes.txt")


def run_cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit_:  # argparse exits while parsing
        return int(exit_.code)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


INVALID = [pytest.param(f, v, id=f"{f.verb} {f.flag} {v}") for f in FLAGS for v in f.invalid]


@pytest.mark.parametrize("flag,value", INVALID)
def test_invalid_value_is_one_line_exit_2(env, capsys, flag, value):
    before = digest(env.file), digest(env.weights)
    argv = [*BASE[flag.verb](env), *flag.extra, flag.flag, env.fill(value)]
    assert run_cli(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"vitlab {flag.verb}: error: ") and flag.says in lines[0], lines[0]
    assert flag.flag in lines[0] and out == ""
    assert (digest(env.file), digest(env.weights)) == before


VALID = [pytest.param(f, id=f"{f.verb} {f.flag} {f.valid}") for f in FLAGS]


@pytest.mark.parametrize("flag", VALID)
def test_valid_value_still_runs(env, capsys, monkeypatch, flag):
    from vitlab.bench import measure

    monkeypatch.setattr(measure, "gemm_peak_gflops", lambda *a, **k: 100.0)  # bench: skip timing the machine
    argv = [*BASE[flag.verb](env), *flag.extra, flag.flag, env.fill(flag.valid)]
    if not flag.run:
        build_parser().parse_args(argv)  # raises SystemExit on a refusal
        return
    assert run_cli(argv) == 0, capsys.readouterr().err
    assert not re.search(r"\bnan\b", capsys.readouterr().out, re.IGNORECASE)


def test_top_k_above_the_class_count_is_clamped_with_a_note(env, capsys, caplog):
    with caplog.at_level(logging.WARNING, logger="vitlab"):
        assert run_cli(["predict", "--weights", str(env.weights), "--top-k", "50", str(env.image)]) == 0
    assert "top-k 50 is more than the model's 10 classes: showing all 10" in caplog.text
    results = predict(env.weights, [str(env.image)], top_k=50, device="cpu")
    assert len(results[0]["top"]) == 10


@pytest.mark.parametrize("argv,says", [
    (["eval", "--weights", "w", "--data", "digits", "--split", "test"], "invalid choice: 'test'"),
    (["fewshot", "--weights"], "expected one argument"),
    (["bogus-verb"], "invalid choice: 'bogus-verb'"),
])
def test_every_argparse_error_is_one_line(capsys, argv, says):
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and err[0].startswith("vitlab")


def test_device_that_does_not_exist_is_one_line(env, capsys):
    """Parses (cuda:N is a device name) but names a device this machine lacks."""
    index = torch.cuda.device_count() + 3
    assert run_cli(["predict", "--weights", str(env.weights), "--device", f"cuda:{index}", str(env.image)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cuda" in err[0] and "Traceback" not in err[0]
