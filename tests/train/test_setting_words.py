"""A setting's other spellings: `adamw` is vitlab's `adam` (decoupled weight decay) from every entry (flag, vitlab.fit
keyword, --config file), and a run records the one spelling."""

import json

from vitlab.cli import build_parser
from vitlab.train import resolve
from vitlab.train.config import config_from_json
from vitlab.train.fitting import fit_flags


def test_adamw_is_adam_from_a_flag_a_keyword_and_a_config_file(tmp_path):
    args = build_parser().parse_args(["train", "--optimizer", "adamw"])
    assert args.optimizer == "adamw"  # argparse offers the spelling; the resolution records it as adam
    resolved = resolve(None, {"optimizer": "adamw", "steps": 1})
    assert resolved.config.optimizer == "adam" and resolved.sources["optimizer"] == "flag"
    assert fit_flags({"optimizer": "adamw"}) == {"optimizer": "adamw"}  # accepted as the flag is
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"optimizer": "adamw", "steps": 1}))
    assert resolve(None, {}, config_file=str(settings)).config.optimizer == "adam"


def test_a_run_recorded_with_adam_still_loads(tmp_path):
    record = tmp_path / "config.json"
    record.write_text(json.dumps({"optimizer": "adam", "steps": 3}))
    assert config_from_json(record).optimizer == "adam"
