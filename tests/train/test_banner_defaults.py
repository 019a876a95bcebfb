"""The start banner lists what the recipe, the weights and the flags chose, and counts the settings left at vitlab's
defaults in one line; config.json and --print-config still give every value."""

import json

from tests.conftest import TINY_TRAIN_FLAGS
from vitlab.cli import main


def test_the_banner_counts_the_defaults_and_config_json_keeps_them(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "1", *TINY_TRAIN_FLAGS]) == 0
    banner = (out / "console.log").read_text().split("step 1")[0]
    record = json.loads((out / "config.json").read_text())
    # init is named in the first settings line, not counted
    defaults = [key for key, source in record["sources"].items() if source == "default" and key != "init"]
    assert f"from default: {len(defaults)} other settings (config.json lists every value)\n" in banner
    assert "keep_last" not in banner and "keep_last" in defaults and record["keep_last"] == 2
    capsys.readouterr()
    assert main(["train", "--steps", "1", *TINY_TRAIN_FLAGS, "--print-config"]) == 0
    assert "keep_last 2" in capsys.readouterr().out  # --print-config: every resolved value with its source
