"""The paper's fine-tuning protocol (Appendix B.1.1): one run per learning rate on train minus a dev split, the lr
chosen on dev, the test accuracy of that run reported; sweep.json, sweep.png and the printed table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from PIL import Image

import vitlab
from vitlab.cli import main
from vitlab.errors import DataError
from vitlab.train import resolve_config
from vitlab.train import sweep as sweep_module
from vitlab.train.sweep import SweepRow, choose, format_table, run_sweep

# Dev and test accuracies made up so that the dev split and the test data prefer different learning rates.
MADE_UP = {0.001: (0.70, 0.91), 0.003: (0.80, 0.85), 0.01: (0.85, 0.80), 0.03: (0.60, 0.95)}


def test_choice_is_the_dev_best_not_the_test_best():
    rows = [SweepRow(lr, dev, test, f"lr_{lr}") for lr, (dev, test) in MADE_UP.items()]
    assert max(rows, key=lambda r: r.test_top1).lr == 0.03
    assert choose(rows).lr == 0.01
    tie = [SweepRow(0.03, 0.9, 0.1, "a"), SweepRow(0.01, 0.9, 0.2, "b")]
    assert choose(tie).lr == 0.01  # equal dev accuracy: the smaller learning rate


def test_sweep_runs_each_lr_on_the_dev_split_and_reports_the_chosen_test(tmp_path, monkeypatch):
    seen = []

    def fake_fine_tune(resolved):
        cfg = resolved.config
        assert resolved.sources["lr"] == "sweep (--lr-sweep)" and resolved.sources["val_fraction"].startswith("sweep")
        seen.append(cfg)
        return MADE_UP[cfg.lr]

    monkeypatch.setattr(sweep_module, "_fine_tune", fake_fine_tune)
    cfg = resolve_config("finetune", data="digits", out=str(tmp_path / "s"), lr_sweep=(0.03, 0.001, 0.01, 0.003),
                         dev_fraction=0.02)
    result = run_sweep(cfg)
    assert [c.lr for c in seen] == [0.001, 0.003, 0.01, 0.03]
    assert all(c.val_fraction == 0.02 and c.lr_sweep == () and c.out == str(tmp_path / "s" / f"lr_{c.lr:g}")
               for c in seen)
    assert result.chosen.lr == 0.01 and result.test_top1 == 0.80  # not 0.95: the test data never chooses
    record = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert (record["chosen_lr"], record["dev_top1"], record["test_top1"]) == (0.01, 0.85, 0.80)
    assert [r["lr"] for r in record["rows"]] == [0.001, 0.003, 0.01, 0.03]
    assert (tmp_path / "s" / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = format_table(result).splitlines()
    assert table[3].split() == ["0.01", "85.00%", "80.00%", "<-", "chosen"]
    assert table[5].startswith("chosen lr 0.01 (best on the 2% dev split): test top-1 80.00%")


def test_refit_trains_the_chosen_lr_on_all_of_train(tmp_path, monkeypatch):
    seen = []

    def fake_fine_tune(resolved):
        cfg = resolved.config
        seen.append(cfg)
        return MADE_UP[cfg.lr] if cfg.val_fraction else (0.0, 0.87)

    monkeypatch.setattr(sweep_module, "_fine_tune", fake_fine_tune)
    cfg = resolve_config("finetune", data="digits", out=str(tmp_path / "s"), lr_sweep=(0.003, 0.01),
                         dev_fraction=0.1, refit=True)
    result = run_sweep(cfg)
    final = seen[-1]
    assert (final.lr, final.val_fraction, final.out) == (0.01, None, str(tmp_path / "s" / "final"))
    assert result.test_top1 == 0.87 and result.chosen.test_top1 == 0.80


@pytest.mark.parametrize("overrides, message", [
    (dict(dev_fraction=None), r"--lr-sweep needs --dev-fraction in \(0, 1\)"),
    (dict(val_fraction=0.1), "--val-fraction with --lr-sweep"),
    (dict(lr_sweep=(0.01, 0.01)), "lists a learning rate twice"),
])
def test_bad_sweeps_are_refused_before_any_run(tmp_path, overrides, message):
    base = dict(data="digits", out=str(tmp_path / "s"), lr_sweep=(0.01, 0.03), dev_fraction=0.02)
    with pytest.raises(ValueError, match=message):
        run_sweep(resolve_config("finetune", **{**base, **overrides}))
    assert not (tmp_path / "s").exists()


def test_a_folder_without_test_data_is_refused(tmp_path):
    (tmp_path / "d" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match="has no val/ folder, so a sweep cannot report test accuracy"):
        run_sweep(resolve_config("finetune", data=str(tmp_path / "d"), lr_sweep=(0.01,), dev_fraction=0.1))


def folder(root, per_class=10):
    for split in ("train", "val"):
        for c, name in enumerate(["ant", "bee", "cow"]):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                Image.new("RGB", (12, 12), (90 * c, 20 * i, 30)).save(root / split / name / f"{i}.png")
    return root


def test_finetune_lr_sweep_end_to_end(tmp_path, capsys):
    """Two real runs through the training loop: each one's dev accuracy is its own run's last validation."""
    init = tmp_path / "init.safetensors"
    vitlab.save(vitlab.create_model("ViT-Ti/4", image_size=8, num_classes=5, depth=1, width=32, num_heads=2,
                                    mlp_dim=64), init)
    out = tmp_path / "sweep"
    assert main(["finetune", "--init", str(init), "--data", str(folder(tmp_path / "data")), "--out", str(out),
                 "--lr-sweep", "0.3,0.01", "--dev-fraction", "0.2", "--steps", "3", "--warmup", "1",
                 "--image-size", "8", "--batch-size", "8", "--workers", "0", "--eval-batch-size", "64"]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "sweep.json").read_text())
    for row in record["rows"]:
        run_dir = out / f"lr_{row['lr']:g}"
        last_val = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
                    if '"val"' in x][-1]
        assert row["dev_top1"] == last_val["top1"] and row["run_dir"] == str(run_dir)
        recorded = json.loads((run_dir / "config.json").read_text())
        # 2 of each class's 10 training images held out: 24 to train on, 6 to choose with
        assert (recorded["lr"], recorded["train_images"], recorded["val_images"]) == (row["lr"], 24, 6)
    best_dev = max(r["dev_top1"] for r in record["rows"])
    assert record["dev_top1"] == best_dev
    assert record["chosen_lr"] == min(r["lr"] for r in record["rows"] if r["dev_top1"] == best_dev)
    assert f"chosen lr {record['chosen_lr']:g} (best on the 20% dev split)" in printed


def test_an_interrupted_sweep_resumes_each_run_held_to_its_settings(tmp_path, capsys):
    """--resume on a sweep: a run it finished is evaluated again, a run it never started trains, so the table is the
    uninterrupted sweep's; each run resumes as any run does (--steps extends its schedule, a setting that changes what
    it computes is refused in one line naming the run, before anything trains)."""
    import shutil

    init = tmp_path / "init.safetensors"
    vitlab.save(vitlab.create_model("ViT-Ti/4", image_size=8, num_classes=5, depth=1, width=32, num_heads=2,
                                    mlp_dim=64), init)
    out = tmp_path / "sweep"
    argv = ["finetune", "--init", str(init), "--data", str(folder(tmp_path / "data")), "--out", str(out),
            "--lr-sweep", "0.3,0.01", "--dev-fraction", "0.2", "--warmup", "1", "--image-size", "8",
            "--batch-size", "8", "--workers", "0", "--eval-batch-size", "64"]
    assert main([*argv, "--steps", "3"]) == 0
    whole = json.loads((out / "sweep.json").read_text())["rows"]
    shutil.rmtree(out / "lr_0.3")  # stopped after its first run
    (out / "sweep.json").unlink()
    assert main([*argv, "--steps", "3", "--resume"]) == 0
    assert json.loads((out / "sweep.json").read_text())["rows"] == whole

    capsys.readouterr()
    logged = (out / "lr_0.01" / "metrics.jsonl").read_text()
    assert main([*argv, "--steps", "4", "--batch-size", "16", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"vitlab finetune: error: --batch-size 16 contradicts the run in {out / 'lr_0.01'} (stored: 8); "
                   "resume without it, or start a new run with another --out DIR"]
    assert (out / "lr_0.01" / "metrics.jsonl").read_text() == logged  # nothing trained

    assert main([*argv, "--steps", "4", "--resume"]) == 0
    for run_dir in (out / "lr_0.01", out / "lr_0.3"):
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert any(r.get("split") == "resume" and r.get("changed") == {"steps": [3, 4]} for r in rows)
        assert max(r["step"] for r in rows if r.get("split") == "train") == 4
        assert json.loads((run_dir / "config.json").read_text())["steps"] == 4


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_a_sweep_exits_with_the_stop_code_and_says_how_to_continue(tmp_path, signum, code):
    """As a scheduler stops it: exit code 128 + the signal (a preempted sweep is not a finished one), one line on
    stderr and no traceback, the resume command named, the stopped run's checkpoint kept and no sweep record or
    figure (nor a temporary of one) written for the unfinished sweep."""
    init = tmp_path / "init.safetensors"
    vitlab.save(vitlab.create_model("ViT-Ti/4", image_size=8, num_classes=5, depth=1, width=32, num_heads=2,
                                    mlp_dim=64), init)
    out = tmp_path / "sweep"
    args = [sys.executable, "-m", "vitlab", "finetune", "--init", str(init), "--data", str(folder(tmp_path / "data")),
            "--out", str(out), "--lr-sweep", "0.3,0.01", "--dev-fraction", "0.2", "--steps", "100000", "--warmup",
            "1", "--image-size", "8", "--batch-size", "8", "--workers", "0", "--eval-every", "0", "--log-every", "1"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        first = _first_run_training(out, proc, deadline=time.monotonic() + 180)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()  # never left running (100,000 steps) when an assertion above fails
    assert proc.returncode == code, stderr[-2000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert "the sweep was preempted in" in last and "--resume" in last and str(out) in last, stderr[-2000:]
    assert list((out / first / "checkpoints").glob("step_*"))
    assert sorted(p.name for p in out.iterdir()) == [first]  # the other run not started; no sweep.json, sweep.png
    # nor a temporary of them


def _first_run_training(out, proc, deadline: float) -> str:
    """The name of the sweep's run folder whose metrics.jsonl holds a training step (the sweep's first run)."""
    while True:
        for log in out.glob("lr_*/metrics.jsonl"):
            if '"split": "train"' in log.read_text():
                return log.parent.name
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.05)
