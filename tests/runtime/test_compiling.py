"""`compile auto|on|off` of the inference verbs: the rule's decisions over image counts, precisions, widths and
devices; a session opened without an image count stays eager until `compile_session` knows it; the verbs' switches
(`--compile`, `--no-compile`, neither) reach the rule, and a small run is never compiled by default."""

from __future__ import annotations

import json

import pytest
import torch

import vitlab
from tests.eval.test_inference import random_vit  # a 10-class ViT with random weights
from vitlab.cli import build_parser, main
from vitlab.constants import COMPILE_PAYS_OFF
from vitlab.runtime.compiling import compile_request, resolve_compile
from vitlab.runtime.session import compile_session, open_session

CPU = torch.device("cpu")
REGION = COMPILE_PAYS_OFF[0]
LEAST, WIDTH, PRECISION = int(REGION["images"]), int(REGION["width"]), str(REGION["precision"])


def decide(requested="auto", images=LEAST, device="cpu", precision=PRECISION, width=WIDTH):
    return resolve_compile(requested, images=images, device=device, precision=precision, width=width)


@pytest.mark.parametrize("images, on", [(1, False), (LEAST - 1, False), (LEAST, True), (10 * LEAST, True)])
def test_auto_compiles_from_the_measured_crossing_on(images, on):
    choice = decide(images=images)
    assert choice.on is on and choice.reason.startswith("auto: ")
    assert f"{LEAST:,}" in choice.reason and f"{images:,} image" in choice.reason


@pytest.mark.parametrize("change, words", [
    ({"precision": "fp32"}, "unmeasured"), ({"precision": "int8"}, "unmeasured"),
    ({"width": WIDTH // 2}, f"width {WIDTH // 2}"), ({"width": None}, "width None"),
    ({"device": "cuda"}, "unmeasured on cuda"), ({"images": None}, "not known up front"),
])
def test_auto_stays_eager_outside_every_measured_region(change, words):
    choice = decide(**{"images": 100 * LEAST, **change})
    assert not choice.on and words in choice.reason


def test_a_wider_model_than_measured_compiles_too():
    assert decide(width=2 * WIDTH).on


@pytest.mark.parametrize("requested, on", [("on", True), (True, True), ("off", False), (False, False)])
def test_an_explicit_choice_is_kept_whatever_the_run(requested, on):
    for images in (None, 1, 100 * LEAST):
        assert decide(requested, images=images, precision="fp32", width=8) == decide(requested, images=images)
        choice = decide(requested, images=images)
        assert choice.on is on and choice.reason == "requested"
        assert choice.to_dict() == {"name": "on" if on else "off", "reason": "requested"}


def test_an_unknown_choice_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"compile must be one of auto, on, off"):
        compile_request("yes")


def test_a_session_without_an_image_count_waits_then_decides(compiles):
    session = open_session(random_vit(16), device=CPU, precision="fp32", compile="auto")
    assert session.compiled is None and compiles == []
    small = compile_session(session, "auto", 10)
    assert not small.compiled.on and small.model is session.model and compiles == []
    assert compile_session(small, "on", 10) is small  # decided once: a decided session is kept as it is
    forced = compile_session(session, "on", 10)
    assert forced.compiled.on and len(compiles) == 1 and forced.model is not session.model


def test_a_session_given_its_image_count_decides_at_once(compiles):
    session = open_session(random_vit(16), device=CPU, precision="fp32", compile="auto", images=10 * LEAST)
    assert session.compiled is not None and not session.compiled.on  # float32: unmeasured, eager
    assert compiles == []


@pytest.mark.parametrize("verb", ["eval", "predict", "fewshot", "analyze"])
@pytest.mark.parametrize("flags, value", [([], "auto"), (["--compile"], "on"), (["--no-compile"], "off"),
                                          (["--compile", "--no-compile"], "off")])
def test_the_verbs_switches(verb, flags, value):
    needed = {"eval": ["--data", "digits"], "predict": ["x.png"], "fewshot": ["--data", "digits"],
              "analyze": ["--out", "d"]}[verb]
    args = build_parser().parse_args([verb, "--weights", "w.safetensors", *needed, *flags])
    assert args.compile == value


def test_eval_of_a_small_split_is_never_compiled_by_default(compiles, tmp_path, capsys):
    """The default (auto) on 359 digits of a tiny model: eager, and the reason is recorded."""
    vitlab.save(random_vit(16), tmp_path / "m.safetensors")
    argv = ["eval", "--weights", str(tmp_path / "m.safetensors"), "--data", "digits", "--json", "--precision", "bf16"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert compiles == [] and record["compile"]["name"] == "off"
    assert record["compile"]["reason"] == "auto: compiling is unmeasured (or does not pay) for a bf16 model of width 32"
    assert main([*argv, "--no-compile"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["compile"] == {"name": "off", "reason": "requested"}
    assert compiles == []
