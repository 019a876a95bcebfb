"""An unknown name (a model, a vitlab.fit keyword, a setting in a --config file) is one line offering the name it
most likely misspells, found by one rule (vitlab.errors.closest)."""

import json
import re

import pytest

import vitlab
from vitlab.train import resolve


def test_closest_ignores_case_and_offers_nothing_far():
    from vitlab.errors import closest

    assert closest("vit-t/16", ["ViT-Ti/16", "ViT-B/16", "ViT-L/16"]) == "ViT-Ti/16"
    assert closest("zzzz", ["ViT-Ti/16", "ViT-B/16"]) is None


@pytest.mark.parametrize(("name", "meant"), [("ViT-T/16", "ViT-Ti/16"), ("vit_tiny_patch16_22", "vit_tiny_patch16_224"),
                                             ("R50-ViT-B/16", "R50+ViT-B/16")])
def test_an_unknown_model_name_offers_the_closest(name, meant):
    with pytest.raises(ValueError, match=re.escape(f"unknown model '{name}'; did you mean '{meant}'")):
        vitlab.create_model(name)


def test_a_misspelt_setting_offers_the_setting(tmp_path):
    with pytest.raises(TypeError, match="no keyword 'stpes'; did you mean steps"):
        vitlab.fit(stpes=3)
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"stpes": 3}))
    with pytest.raises(ValueError, match="unknown settings in --config .*: stpes; did you mean steps"):
        resolve(None, {}, config_file=str(settings))
