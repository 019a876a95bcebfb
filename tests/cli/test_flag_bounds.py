"""Every numeric flag has an upper bound checked while parsing (one line, exit code 2), and a
weights file's metadata cannot declare sizes that make `vitlab info` overflow or allocate; Python
warnings reach the console as vitlab's one-line `vitlab <verb>: warning: ...`, not as source paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import vitlab
from reproduction.cli import register
from vitlab.cli import build_parser

CAMPAIGN = {"experiment": register}  # the campaign's verb, which vitlab finds as a plug-in

TIMEOUT_S = 120

INT = "an integer in [{}, {}]"
# (verb, flag, value, what the flag allows): the cases first, then every other numeric flag of their class
TOO_BIG = [
    ("train", "--width", "100000000", INT.format(1, 16384)),
    ("train", "--batch-size", "100000000", INT.format(1, 65536)),
    ("train", "--randaug-ops", "1000000000", INT.format(0, 16)),
    ("train", "--workers", "1000", INT.format(0, 256)),
    ("train", "--depth", "100000", INT.format(1, 1024)),
    ("train", "--heads", "100000", INT.format(1, 1024)),
    ("train", "--mlp-dim", "100000000", INT.format(1, 65536)),
    ("train", "--representation-size", "100000000", INT.format(0, 16384)),
    ("train", "--accum", "1000000", INT.format(1, 65536)),
    ("train", "--eval-batch-size", "100000000", INT.format(1, 65536)),
    ("train", "--steps", "10000000000", INT.format(1, 10**9)),
    ("train", "--warmup", "10000000000", INT.format(0, 10**9)),
    ("train", "--eval-every", "10000000000", INT.format(0, 10**9)),
    ("train", "--fewshot-every", "10000000000", INT.format(0, 10**9)),
    ("train", "--save-every", "10000000000", INT.format(0, 10**9)),
    ("train", "--log-every", "10000000000", INT.format(1, 10**9)),
    ("train", "--keep-last", "1000000000", INT.format(1, 1_000_000)),
    ("train", "--seed", str(2**40), INT.format(0, 2**32 - 1)),
    ("train", "--lr", "1e9", "a number (finite, >= 0 and <= 100)"),
    ("train", "--wd", "1e9", "a number (finite, >= 0 and <= 100)"),
    ("train", "--linear-end", "1e9", "a number (finite, >= 0 and <= 100)"),
    ("train", "--mixup", "1e9", "a number (finite, >= 0 and <= 100)"),
    ("train", "--cutmix", "1e9", "a number (finite, >= 0 and <= 100)"),
    ("train", "--randaug-mstd", "1e9", "a number (finite, >= 0 and <= 20)"),
    ("train", "--clip", "1e300", "a number (finite, >= 0 and <= 1e+06)"),
    ("train", "--head-bias-init", "1e9", "a number (finite, >= -100 and <= 100)"),
    ("finetune", "--workers", "1000", INT.format(0, 256)),
    ("eval", "--batch-size", "100000000", INT.format(1, 65536)),
    ("eval", "--workers", "1000", INT.format(0, 256)),
    ("predict", "--top-k", "1000000000", INT.format(1, 1_000_000)),
    ("fewshot", "--batch-size", "100000000", INT.format(1, 65536)),
    ("fewshot", "--seeds", "1000000", INT.format(1, 1000)),
    ("fewshot", "--l2", "1e300", "a number (finite, > 0 and <= 1e+12)"),
    ("analyze", "--num-images", "1000000", INT.format(1, 1024)),
    ("analyze", "--components", "1000000", INT.format(1, 1024)),
    ("bench", "--batch-size", "100000000", INT.format(1, 65536)),
    ("bench", "--workers", "1000", INT.format(0, 256)),
    ("bench", "--threads", "1000000", INT.format(1, 1024)),
    ("bench", "--repeats", "1000000000", INT.format(1, 10_000)),
    ("bench", "--warmup", "1000000000", INT.format(0, 10_000)),
    ("bench", "--images", "1000000000", INT.format(1, 1_000_000)),
    ("experiment", "--jobs", "1000", INT.format(1, 256)),
    ("experiment", "--seeds", str(2**40), INT.format(0, 2**32 - 1)),
    ("shards", "--val-fraction", "nan", "a number (finite, > 0 and < 1)"),
]

LR_LIST = "expected learning rates like 0.003,0.01, each a number (finite, > 0 and <= 100)"


def parse_error(argv: list[str], capsys) -> list[str]:
    """The stderr lines of parsing `vitlab ARGV`, which must stop with exit code 2 (nothing is run)."""
    with pytest.raises(SystemExit) as stop:
        build_parser(CAMPAIGN).parse_args(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("verb, flag, value, allowed", TOO_BIG, ids=[f"{v}{f}={x}" for v, f, x, _ in TOO_BIG])
def test_a_number_beyond_a_flags_bound_is_one_line_while_parsing(verb, flag, value, allowed, capsys):
    assert parse_error([verb, flag, value], capsys) == [
        f"vitlab {verb}: error: argument {flag}: must be {allowed}, got {value!r} (see vitlab {verb} --help)"]


@pytest.mark.parametrize("argv, says", [
    (["fewshot", "--shots", "1,1000000000"], "must be integers from 1 to 1,000,000 or 'all'"),
    (["fewshot", "--l2-sweep", "1,1e300"], "must be numbers (> 0 and <= 1e12), comma-separated"),
    (["finetune", "--init", "w", "--lr-sweep", "0.1,1e9"], LR_LIST),
    (["finetune", "--init", "w", "--lr-sweep", "0.1,nan"], LR_LIST),
    (["train", "--mean", "1e9", "0", "0"], "argument --mean: must be a number (finite, >= -10 and <= 10)"),
    (["train", "--std", "1e9", "1", "1"], "argument --std: must be a number (finite, > 0 and <= 10)"),
    (["shards", "--val-fraction", "1e9"], "argument --val-fraction: must be a number (finite, > 0 and < 1)"),
])
def test_list_flags_are_bounded_too(argv, says, capsys):
    lines = parse_error(argv, capsys)
    assert len(lines) == 1 and says in lines[0], lines


@pytest.mark.parametrize("argv", [
    ["train", "--width", "768", "--depth", "12", "--heads", "12", "--mlp-dim", "3072", "--batch-size", "4096",
     "--workers", "8", "--randaug-ops", "2", "--seed", str(2**32 - 1), "--lr", "0.03", "--mixup", "0.2"],
    ["fewshot", "--weights", "w", "--shots", "1,5,10,25,all", "--l2-sweep", "0.0009765625,1024", "--seeds", "5"],
    ["experiment", "pilot", "--jobs", "2", "--seeds", "0", "1", "2"],
])
def test_the_values_people_use_still_parse(argv):
    build_parser(CAMPAIGN).parse_args(argv)


def isolated(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter whose address space is capped at what the library's imports mapped plus 2 GiB
    (vitlab.api: torch and the weight readers, which the command line itself imports only when a verb runs): an
    allocation for a crafted size fails there instead of swapping this machine; killed after TIMEOUT_S."""
    limit = ("import re, resource, sys, json, vitlab.api, vitlab.cli\n"
             "vm = int(re.search(r'VmSize:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) * 1024\n"
             "resource.setrlimit(resource.RLIMIT_AS, (vm + 2 * 2**30, vm + 2 * 2**30))\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", limit + code], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=TIMEOUT_S)


def test_train_with_an_absurd_width_is_one_line_in_bounded_memory(tmp_path):
    proc = isolated("sys.exit(vitlab.cli.main(['train', '--width', '100000000', '--steps', '1', '--out', 'run']))",
                    tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "vitlab train: error: argument --width: must be an integer in [1, 16384], got '100000000' "
        "(see vitlab train --help)"]
    assert not (tmp_path / "run").exists()


# config field -> (crafted value, what `vitlab info` says about it)
METADATA = {
    "width": (10**9, "width 1,000,000,000 is beyond vitlab's limit of 16,384"),
    "mlp_dim": (10**9, "mlp_dim 1,000,000,000 is beyond vitlab's limit of 65,536"),
    "num_heads": (2**20, "num_heads 1,048,576 is beyond vitlab's limit of 1,024"),
    "num_classes": (10**12, "num_classes 1,000,000,000,000 is beyond vitlab's limit of 1,000,000"),
    "image_size": ([10**7, 10**7], "image_size 10000000x10000000 is beyond vitlab's limit of 16,384 pixels"),
    "patch_size": (10**6, "patch_size 1,000,000 is beyond vitlab's limit of 1,024"),
    "representation_size": (10**9, "representation_size 1,000,000,000 is beyond vitlab's limit of 16,384"),
}


@pytest.fixture(scope="module")
def crafted_info(tmp_path_factory) -> dict:
    """`vitlab info` on a small vitlab file whose metadata declares each METADATA size, all in one bounded
    subprocess: case -> (exit code, stderr lines)."""
    base = tmp_path_factory.mktemp("crafted")
    model = vitlab.create_model("ViT-Ti/16", num_classes=2, image_size=32, depth=1)
    vitlab.save(model, base / "m.safetensors")
    with safe_open(base / "m.safetensors", "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for field, (value, _) in METADATA.items():
        config = json.loads(meta["config"])
        config[field] = value
        save_file(tensors, base / f"{field}.safetensors", metadata={**meta, "config": json.dumps(config)})
    code = ("import contextlib, io\nout = {}\n"
            f"for case in {list(METADATA)!r}:\n"
            "    err = io.StringIO()\n"
            "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
            "        rc = vitlab.cli.main(['info', case + '.safetensors'])\n"
            "    out[case] = (rc, err.getvalue().strip().splitlines())\n"
            "print(json.dumps(out))\n")
    proc = isolated(code, base)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("field", list(METADATA))
def test_info_refuses_sizes_in_metadata_beyond_the_limits(crafted_info, field):
    rc, lines = crafted_info[field]
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"vitlab info: error: {field}.safetensors: invalid vitlab config in metadata: ")
    assert METADATA[field][1] in lines[0] and lines[0].endswith("; re-save the model")


def test_a_warning_is_said_as_vitlab_says_things(tmp_path):
    """`convert --to jax-npz` of a model with exact GELU warns that the official code computes it with tanh: one
    line starting with `vitlab convert: warning:`, no source path, no `UserWarning`, no code line."""
    model = vitlab.create_model("ViT-Ti/16", num_classes=2, image_size=32, depth=1)
    vitlab.save(model, tmp_path / "m.safetensors")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "vitlab", "convert", "m.safetensors", "m.npz", "--to", "jax-npz"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "vitlab convert: warning: the model uses gelu='exact' (official: 'tanh')"), lines
    assert "UserWarning" not in proc.stderr and ".py:" not in proc.stderr
    assert torch.equal(vitlab.load(tmp_path / "m.npz").pos_embed, model.pos_embed)
