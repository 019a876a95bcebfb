"""Every numeric training setting has one declared range (vitlab.train.settings): the flag parses with it and the
training config checks by it, so a value a flag refuses is refused the same way from a --config file or a vitlab.fit
keyword."""

from __future__ import annotations

import dataclasses
import re

import pytest

from vitlab.cli import build_parser
from vitlab.ranges import Range, float_range, int_range
from vitlab.train.config import TrainConfig, validate
from vitlab.train.settings import FIELDS
from vitlab.train.settings import SETTINGS as DECLARED

SETTINGS = {name: DECLARED[name].range for name in FIELDS if DECLARED[name].range is not None}


def test_every_field_is_declared_and_only_fields_and_flag_only_settings_are():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(FIELDS) == fields
    assert set(DECLARED) - fields == {"epochs", "depth", "width", "heads", "mlp_dim"}


@pytest.mark.parametrize("allowed, inside, outside", [
    (int_range(1, 10), [1, 10], [0, 11, 2.0, True, "3"]),
    (int_range(0), [0, 10**30], [-1, 0.5]),
    (float_range(0.0, 1.0, low_open=True, high_open=True), [0.5, 1e-9], [0.0, 1.0, float("nan"), "0.5"]),
    (float_range(-1.0, 1.0), [-1.0, 1, 0.0], [1.0001, float("inf"), None]),
])
def test_a_range_holds_exactly_its_values(allowed: Range, inside, outside):
    assert all(allowed.holds(v) for v in inside)
    assert not any(allowed.holds(v) for v in outside)


def flag_of(name: str) -> str:
    return DECLARED[name].option


def just_outside(allowed: Range) -> str:
    if allowed.high is not None:
        return str(int(allowed.high) + 1) if allowed.kind is int else repr(allowed.high * 2 + 1)
    return str(int(allowed.low) - 1) if allowed.kind is int else repr(allowed.low - 1)


SCALARS = [name for name in SETTINGS if name not in ("betas", "mean", "std", "crop_scale", "crop_ratio", "lr_drops",
                                                     "lr_sweep")]


@pytest.mark.parametrize("name", SCALARS)
def test_the_flag_and_the_config_refuse_the_same_value_in_the_same_words(name, capsys):
    allowed = SETTINGS[name]
    value = just_outside(allowed)
    verb = "finetune" if name in ("dev_fraction",) else "train"
    argv = [verb, "--init", "w"] if verb == "finetune" else [verb]
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, flag_of(name), value])
    flag_error = capsys.readouterr().err
    assert f"must be {allowed.allowed(note=False)}, got {value!r}" in flag_error
    number = int(value) if allowed.kind is int else float(value)
    named = "--ema" if name == "ema" else flag_of(name)  # the config names the setting; the flag has an alias
    with pytest.raises(ValueError, match=re.escape(f"{named} must be {allowed.allowed()}, got ")):
        validate(TrainConfig(**{name: number}))


def test_tuple_settings_and_model_sizes_from_a_file_meet_the_flags_bounds():
    with pytest.raises(ValueError, match=r"--betas must be two numbers, each a number \(finite, >= 0 and < 1\), "
                                         r"got 0.9 1.5"):
        validate(TrainConfig(betas=(0.9, 1.5)))
    with pytest.raises(ValueError, match=r"--lr-drops must be increasing fractions"):
        validate(TrainConfig(lr_drops=(0.6, 0.3)))
    with pytest.raises(ValueError, match=r"--depth must be an integer in \[1, 1024\], got 5000"):
        validate(TrainConfig(model_args={"depth": 5000}))
    assert validate(TrainConfig(steps=10**9, model_args={"depth": 1024})).steps == 10**9
