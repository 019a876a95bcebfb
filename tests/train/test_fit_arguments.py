"""vitlab.fit takes the command line's flags as keywords, the architecture flags included, and checks each as its
flag is checked, before anything starts: an unknown keyword or a value of the wrong type is a one-line TypeError
naming the keyword (with the closest name, or model_args, when one fits), a value outside the flag's range a
ValueError in the flag's words, never an error from inside the resolution."""

from __future__ import annotations

import dataclasses

import pytest

import vitlab
from tests.conftest import TINY_TRAIN
from tests.test_ranges import SCALARS, just_outside
from vitlab.ranges import EPOCHS, MODEL_SIZES
from vitlab.train.config import TrainConfig
from vitlab.train.settings import SETTINGS as DECLARED

SETTINGS = {name: s.range for name, s in DECLARED.items()}
# The flags that are no TrainConfig field, by their keywords, and their ranges (the model's own, for the sizes).
FLAG_ONLY = {"epochs": EPOCHS, "depth": MODEL_SIZES["depth"], "width": MODEL_SIZES["width"],
             "heads": MODEL_SIZES["num_heads"], "mlp_dim": MODEL_SIZES["mlp_dim"]}


def test_the_architecture_flags_are_keywords_and_join_model_args(tmp_path):
    settings = {k: v for k, v in TINY_TRAIN.items() if k != "model_args"}
    result = vitlab.fit(data="digits", steps=1, out=tmp_path / "run", progress=False, **settings,
                        depth=1, width=32, heads=2, model_args={"mlp_dim": 64})
    config = result.model.config
    assert (config.depth, config.width, config.num_heads, config.mlp_dim) == (1, 32, 2, 64)


@pytest.mark.parametrize("name", SCALARS + sorted(FLAG_ONLY))
def test_a_keyword_outside_its_flags_range_is_refused_in_the_flags_words(tmp_path, name):
    allowed = FLAG_ONLY.get(name) or SETTINGS[name]
    text = just_outside(allowed)
    value = int(text) if allowed.kind is int else float(text)
    with pytest.raises(ValueError) as err:
        vitlab.fit(out=tmp_path / "run", progress=False, **{name: value})
    assert str(err.value).startswith(f"{name} must be {allowed.allowed(note=False)}"), err.value
    assert not (tmp_path / "run").exists()  # refused before anything started


FIELDS = [f.name for f in dataclasses.fields(TrainConfig)] + sorted(FLAG_ONLY)


@pytest.mark.parametrize("name", FIELDS)
def test_a_keyword_of_the_wrong_type_is_a_type_error_naming_it(tmp_path, name):
    with pytest.raises(TypeError) as err:
        vitlab.fit(progress=False, **{"out": str(tmp_path / "run"), name: object()})
    message = str(err.value)
    assert message.startswith(f"{name} must be ") and "\n" not in message, message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("settings, expected", [
    (dict(steps="3"), "steps must be an integer, got '3' (a string)"),
    (dict(data=123), "data must be a path or dataset name (str or os.PathLike), or a map-style dataset of (image, "
                      "label) (torchvision ImageFolder, datasets.Dataset, …) or a (train, val) pair of them, or a "
                      "datasets.DatasetDict (its train "
                      "and validation splits), got int"),
    (dict(heads="2"), "heads must be an integer, got '2' (a string)"),
    (dict(resume=1), "resume must be True, False or 'auto', got 1"),
    (dict(model_args=[("depth", 2)]), "model_args must be a mapping of model settings"),
])
def test_the_wrong_type_is_said_in_one_line(settings, expected):
    with pytest.raises(TypeError, match="^" + expected.replace("(", r"\(").replace(")", r"\)")):
        vitlab.fit(progress=False, **settings)


@pytest.mark.parametrize("keyword, expected", [
    ("dept", "vitlab.fit has no keyword 'dept'; did you mean depth?"),
    ("num_heads", "it is a model setting; pass heads=… (the --heads flag) or model_args={'num_heads': …}"),
    ("patch_size", "it is a model setting; pass model_args={'patch_size': …}"),
    ("patchsize", "did you mean the model setting model_args={'patch_size': …}?"),
    ("wd", "the flag --wd is the keyword weight_decay"),
    ("ema_decay", "the flag --ema-decay is the keyword ema"),
    ("colour", "its keywords are vitlab train's settings (help(vitlab.fit)), a model's own settings go in "
               "model_args"),
])
def test_an_unknown_keyword_suggests_the_name_it_meant(keyword, expected):
    with pytest.raises(TypeError) as err:
        vitlab.fit(progress=False, **{keyword: 8})
    message = str(err.value)
    assert expected in message and "\n" not in message and len(message) < 200, message


def test_an_architecture_flag_and_model_args_that_disagree_are_refused():
    with pytest.raises(ValueError, match=r"^depth=2 and model_args depth 3 disagree; pass one$"):
        vitlab.fit(progress=False, depth=2, model_args={"depth": 3})
