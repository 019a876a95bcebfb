"""The report's output: the files a verdict rests on are untrusted input.

- Names read from results.json are names, never paths: an experiment from the known set, figures plain file names
  inside the experiment's folder; nothing is read or written outside the folders named.
- Records (`reproduction/records/*.json`, `OUT/_runs/*/result.json`) and results.json: only regular files are
  opened (a FIFO, a device or a link never blocks and is never read), their size is bounded, their types and ranges
  checked, and their checksum verified: an edit by hand is named in one line, never used as measured.
- `experiment report --report PATH` replaces only a report vitlab wrote (its mark), else one line and --force.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from reproduction.cli import main
from reproduction.estimate import CostModel, StepTime
from reproduction.experiment import estimate, write_results
from reproduction.experiments import experiments
from reproduction.records import CHECKSUM, RecordError, checksum
from reproduction.report.report import MARK
from reproduction.runner import Context, Runner
from reproduction.scale import QUICK
from reproduction.spec import RunSpec
from vitlab.files.rundir import WEIGHTS

REPO = Path(__file__).parents[2]
SETTINGS = {"data": "digits", "model": "ViT-Ti/4", "image_size": 8, "batch_size": 4, "steps": 2, "seed": 0}


@pytest.fixture(autouse=True)
def fixed_step_times(monkeypatch):
    """Estimates without timing models."""
    monkeypatch.setattr(CostModel, "step_time", lambda self, spec: StepTime(0.01, 0.001))


class Blocked(Exception):
    """Raised by `within` (no OSError or ValueError: the command line must not turn it into its one line)."""


@contextlib.contextmanager
def within(seconds: int):
    """Bounded time: a read that blocks (a FIFO opened for reading) is interrupted, and the test fails."""
    def stop(signum, frame):
        raise Blocked(f"still blocked after {seconds} s")
    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def hashes(root: Path) -> dict[str, str]:
    """Every entry under `root`: a regular file by its content's hash, anything else by its kind."""
    found = {}
    for path in sorted(root.rglob("*")):
        mode = path.lstat().st_mode
        found[str(path.relative_to(root))] = (hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(mode)
                                              else stat.filemode(mode)[0])
    return found


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


def spec_of(lr: float) -> RunSpec:
    return RunSpec(f"lr{lr:g}", "demo", {**SETTINGS, "lr": lr})


GRID = (1e-3, 3e-3, 1e-2)


def recorded_grid(root: Path, records: Path) -> None:
    """A learning-rate grid trained (by a stand-in trainer) with a records folder: 3e-3 is chosen (top-1 0.6)."""
    def train(spec, run_dir, init):
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / WEIGHTS).touch()
        return {"step": spec.steps, "val": {"top1": 0.6 if spec.settings["lr"] == 3e-3 else 0.4}}
    ctx = Context(Runner(root, QUICK, train=train, records=records), (0,), dry=False)
    assert ctx.best({lr: spec_of(lr) for lr in GRID}) == 3e-3


def choose(root: Path, records: Path) -> float:
    """The grid's choice on a new machine (no run folders), from the records alone: nothing may be trained."""
    def train(spec, run_dir, init):
        raise AssertionError(f"{spec.label} trained although recorded")
    return Context(Runner(root, QUICK, train=train, records=records), (0,), dry=False).best(
        {lr: spec_of(lr) for lr in GRID})


def record_of(records: Path, lr: float) -> Path:
    return next(records.glob(f"{spec_of(lr).key}-*.json"))


def edit(path: Path, change, reseal: bool = False) -> None:
    content = json.loads(path.read_text())
    change(content)
    if reseal:  # a forger who recomputes the checksum: the types and ranges still hold
        content[CHECKSUM] = checksum(content)
    path.write_text(json.dumps(content, indent=1))


# --- Item 3: records are evidence: an edit is named, never used ----------------------------------------------------
def test_the_record_of_an_unchosen_learning_rate_edited_is_named_not_used(tmp_path):
    records = tmp_path / "records"
    recorded_grid(tmp_path / "first", records)
    assert choose(tmp_path / "second", records) == 3e-3  # the records alone choose as the runs did
    unchosen = record_of(records, 1e-2)
    edit(unchosen, lambda r: r["train"]["val"].update(top1=0.99))  # now it would be chosen
    with pytest.raises(RecordError) as err:
        choose(tmp_path / "third", records)
    assert str(err.value).startswith(f"{unchosen} was edited after vitlab wrote it")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value,reseal,says", [
    (0.99, False, "was edited after vitlab wrote it"),
    (57.0, False, "was edited after vitlab wrote it"),
    (57.0, True, "train.val.top1 is 57.0, not a fraction in [0, 1]"),
    (-0.1, True, "train.val.top1 is -0.1, not a fraction in [0, 1]"),
    ("high", True, "train.val.top1 is \"high\", not a finite number"),
    (None, True, "train.val.top1 is null, not a finite number"),
    ([0.6], True, "train.val.top1 is [0.6], not a finite number"),
])
def test_edited_values_are_one_line_naming_the_record(tmp_path, value, reseal, says):
    records = tmp_path / "records"
    recorded_grid(tmp_path / "first", records)
    chosen = record_of(records, 3e-3)
    edit(chosen, lambda r: r["train"]["val"].update(top1=value), reseal)
    with pytest.raises(RecordError) as err:
        choose(tmp_path / "second", records)
    assert str(err.value).startswith(f"{chosen}") and says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text,says", [
    ("NaN", "is not valid JSON (NaN is not a measured value)"),
    ("Infinity", "is not valid JSON (Infinity is not a measured value)"),
    ("1e999", "was edited after vitlab wrote it"),  # parses as infinity
])
def test_non_finite_values_are_refused(tmp_path, text, says):
    records = tmp_path / "records"
    recorded_grid(tmp_path / "first", records)
    chosen = record_of(records, 3e-3)
    chosen.write_text(chosen.read_text().replace('"top1": 0.6', f'"top1": {text}'))
    with pytest.raises(RecordError, match="^" + str(chosen).replace(".", r"\.")) as err:
        choose(tmp_path / "second", records)
    assert says in str(err.value)


@pytest.mark.parametrize("change,says", [
    (lambda r: r.pop(CHECKSUM), "has no checksum"),
    (lambda r: r["spec"]["settings"].update(steps=3), "its spec does not hash to its key"),
    (lambda r: r["spec"].update(key="0" * 12), "is the record of run 000000000000"),
    (lambda r: r.update(train=[]), "train is [], not a JSON object"),
    (lambda r: r.update(wall_seconds={"train": -5}), "wall_seconds.train is -5, not a number of at least 0"),
    (lambda r: r["evals"].update({"upstream/x": {"top1": 5700.0}}), "evals.upstream/x.top1 is 5700.0, not a frac"),
])
def test_records_are_tied_to_their_run_and_typed(tmp_path, change, says):
    records = tmp_path / "records"
    recorded_grid(tmp_path / "first", records)
    path = record_of(records, 1e-3)
    edit(path, change, reseal=says != "has no checksum")
    with pytest.raises(RecordError) as err:
        choose(tmp_path / "second", records)
    assert str(err.value).startswith(str(path)) and says in str(err.value) and "\n" not in str(err.value)


def test_a_run_folders_result_json_edited_is_named_too(tmp_path):
    recorded_grid(tmp_path / "first", tmp_path / "records")
    result = next((tmp_path / "first" / "_runs").glob(f"{spec_of(1e-2).key}-*")) / "result.json"
    edit(result, lambda r: r["train"]["val"].update(top1=0.99))
    with pytest.raises(RecordError, match="was edited after vitlab wrote it"):
        choose(tmp_path / "first", tmp_path / "records")


@pytest.mark.parametrize("where", ["records", "_runs"])
@pytest.mark.parametrize("kind", ["fifo", "link to a record", "folder"])
def test_special_files_named_like_records_never_block(tmp_path, where, kind):
    records = tmp_path / "records"
    recorded_grid(tmp_path / "first", records)
    if where == "records":
        path = record_of(records, 1e-3)
    else:  # the run folders of a machine, with the records folder of another
        shutil.copytree(tmp_path / "first" / "_runs", tmp_path / "second" / "_runs")
        path = next((tmp_path / "second" / "_runs").glob(f"{spec_of(1e-3).key}-*")) / "result.json"
    genuine = path.read_bytes()
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        (tmp_path / "elsewhere.json").write_bytes(genuine)
        path.symlink_to(tmp_path / "elsewhere.json")
    with within(20), pytest.raises(RecordError) as err:
        choose(tmp_path / "second", records)
    named = {"fifo": "is a FIFO", "link to a record": "is a symbolic link", "folder": "is a directory"}[kind]
    assert str(err.value).startswith(f"{path} {named}, not a file vitlab wrote")
    assert stat.S_ISFIFO(path.lstat().st_mode) if kind == "fifo" else True  # left as it was


def test_a_record_too_large_is_refused_unread(tmp_path):
    records = tmp_path / "records"
    recorded_grid(tmp_path / "first", records)
    path = record_of(records, 1e-3)
    path.write_text(" " * (2 << 20) + path.read_text())  # valid JSON, 2 MiB
    with pytest.raises(RecordError, match="is larger than 1024 KiB"):
        choose(tmp_path / "second", records)


def test_estimate_with_a_fifo_record_is_one_line_in_bounded_time(tmp_path, capsys):
    """`vitlab experiment NAME --estimate` with a FIFO named like one of its records: blocked forever before."""
    experiment = experiments()["pos-embed"]
    todo = estimate(experiment, Runner(tmp_path / "probe", experiment.scales[1]), (0,)).todo
    spec = next(iter(todo.values())).spec
    records = tmp_path / "records"
    records.mkdir()
    os.mkfifo(records / f"{spec.dirname}.json")
    with within(60):
        code = main(["experiment", "pos-embed", "--quick", "--estimate", "--out", str(tmp_path / "out"),
                     "--records", str(records)])
    assert code == 2
    assert one_line(capsys) == (f"vitlab experiment: error: {records / spec.dirname}.json is a FIFO, not a file vitlab "
                                "wrote; remove it (vitlab reads only regular files there)")


BOUNDED = """
import resource, sys
import torch  # noqa: F401  (the library the command loads, mapped before the cap)
import reproduction.cli
mapped = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), resource.RLIM_INFINITY))  # 1 GiB more, no further
sys.exit(reproduction.cli.main(sys.argv[1:]))
"""


def test_records_and_results_linked_to_dev_zero_are_not_read(tmp_path):
    """A record or results.json symlinked to /dev/zero was read without bound: under 1 GiB of address space
    more than the interpreter maps, the command ends with one line."""
    out = tmp_path / "out"
    (out / "pos-embed").mkdir(parents=True)
    (out / "pos-embed" / "results.json").symlink_to("/dev/zero")
    proc = subprocess.run([sys.executable, "-c", BOUNDED, "experiment", "report", "--out", str(out), "--report",
                           str(tmp_path / "R.md")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"vitlab experiment: error: {out / 'pos-embed' / 'results.json'} is a symbolic link, not a file vitlab "
        "wrote; remove it (vitlab reads only regular files there)")
    assert not (tmp_path / "R.md").exists()
    records = tmp_path / "records"
    recorded_grid(tmp_path / "first", records)
    path = record_of(records, 1e-2)
    path.unlink()
    path.symlink_to("/dev/zero")
    with within(20), pytest.raises(RecordError, match="is a symbolic link"):
        choose(tmp_path / "second", records)


# --- Item 1: names from results.json are names, never paths ------------------------------------------------------
def full_results(**changes) -> dict:
    """Full pos-embed results of today's design, as a finished run leaves them."""
    results = {"experiment": "pos-embed", "title": "Position embeddings", "paper": "Appendix D.4", "finding": "f",
               "setup": "A setup.", "mode": "full", "seeds": [0],
               "design": {"version": experiments()["pos-embed"].design.version},
               "command": "vitlab experiment pos-embed", "tables": [],
               "figures": [{"file": "pos_embed.png", "caption": "Bars."}], "measured": ["m"],
               "check": {"holds": True, "rule": "r", "details": []}, "choices": {"pretrain_lr": 0.003},
               "wall_seconds": 60.0, "finished": "2026-12-01", "versions": {"vitlab": "0", "torch": "2"}}
    return {**results, **changes}


def attack(tmp_path: Path, results: dict, sealed: bool = True) -> tuple[Path, Path]:
    """(OUT, report) with `results` as OUT/pos-embed/results.json (sealed as vitlab seals, or as written by hand)
    and a secret two folders up."""
    root = tmp_path / "work"
    out = root / "fake"
    (out / "pos-embed").mkdir(parents=True)
    (out / "pos-embed" / "pos_embed.png").write_bytes(b"\x89PNG fake")
    (root / "SECRET.txt").write_text("the user's secret")
    path = out / "pos-embed" / "results.json"
    write_results(path, results) if sealed else path.write_text(json.dumps(results))
    return out, root / "rep" / "R.md"


@pytest.mark.parametrize("sealed", [True, False])
@pytest.mark.parametrize("case,says", [
    ({"experiment": "../../X"}, "says it holds the results of experiment '../../X', not of 'pos-embed'"),
    ({"experiment": "mpp"}, "says it holds the results of experiment 'mpp', not of 'pos-embed'"),
    ({"figures": [{"file": "../../SECRET.txt", "caption": "c"}]}, "figure '../../SECRET.txt' is not a plain file"),
    ({"figures": [{"file": "ABSOLUTE", "caption": "c"}]}, "is not a plain file name of a figure"),  # the secret's
    ({"figures": [{"file": "..", "caption": "c"}]}, "figure '..' is not a plain file name"),
    ({"figures": [{"file": "results.json", "caption": "c"}]}, "figure 'results.json' is not a plain file name"),
    ({"figures": "x"}, "figures is \"x\", not a JSON list"),
])
def test_report_takes_names_from_results_json_as_names(tmp_path, capsys, case, says, sealed):
    secret = str(tmp_path / "work" / "SECRET.txt")  # an absolute path (inside the test's folder: an old vitlab
    case = json.loads(json.dumps(case).replace("ABSOLUTE", secret))  # wrote there)
    out, report = attack(tmp_path, full_results(**case), sealed)
    before = hashes(tmp_path)
    code = main(["experiment", "report", "--out", str(out), "--report", str(report)])
    assert code == 2
    line = one_line(capsys)
    assert (says if sealed else "has no checksum") in line and str(out / "pos-embed" / "results.json") in line
    assert hashes(tmp_path) == before  # nothing written, nothing copied, anywhere


def test_report_copies_no_figure_through_a_link(tmp_path, capsys):
    out, report = attack(tmp_path, full_results())
    figure = out / "pos-embed" / "pos_embed.png"
    figure.unlink()
    figure.symlink_to(tmp_path / "work" / "SECRET.txt")
    before = hashes(tmp_path)
    assert main(["experiment", "report", "--out", str(out), "--report", str(report)]) == 2
    assert one_line(capsys).endswith(f"{figure} is a symbolic link, not a file vitlab wrote; remove it (vitlab reads "
                                     "only regular files there)")
    assert hashes(tmp_path) == before


@pytest.mark.parametrize("linked", ["reproduction", "reproduction/pos-embed"])
def test_report_writes_into_no_linked_archive_folder(tmp_path, capsys, linked):
    """A pull request can commit a symbolic link where the report's archive folder goes."""
    out, report = attack(tmp_path, full_results())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (report.parent / linked).parent.mkdir(parents=True, exist_ok=True)
    (report.parent / linked).symlink_to(elsewhere)
    before = hashes(tmp_path)
    assert main(["experiment", "report", "--out", str(out), "--report", str(report)]) == 2
    assert f"{report.parent / linked} is not a folder (a link or a file)" in one_line(capsys)
    assert hashes(tmp_path) == before and not list(elsewhere.iterdir())


def test_report_archives_only_the_named_figures(tmp_path):
    out, report = attack(tmp_path, full_results())
    assert main(["experiment", "report", "--out", str(out), "--report", str(report)]) == 0
    archive = report.parent / "reproduction" / "pos-embed"
    assert sorted(p.name for p in archive.iterdir()) == ["pos_embed.png", "results.json"]
    assert report.read_text().startswith(MARK + "\n# Reproducing")


# --- Item 3 in the report: results.json and the records it lists ---------------------------------------------------
def committed_copy(tmp_path: Path) -> tuple[Path, Path]:
    """(reproduction/, report) copied from the repository: the committed results, records and report."""
    shutil.copytree(REPO / "reproduction", tmp_path / "reproduction")
    shutil.copyfile(REPO / "REPRODUCTION.md", tmp_path / "REPRODUCTION.md")
    return tmp_path / "reproduction", tmp_path / "REPRODUCTION.md"


def test_the_committed_records_rebuild_the_committed_report(tmp_path, capsys):
    """Every committed record and results.json is sealed and within its ranges: the report rebuilt from them is
    the committed one, byte for byte."""
    folder, report = committed_copy(tmp_path)
    assert main(["experiment", "report", "--out", str(folder), "--report", str(report)]) == 0
    assert report.read_bytes() == (REPO / "REPRODUCTION.md").read_bytes()
    assert report.read_text().startswith(MARK + "\n")


def unchosen_run(folder: Path) -> tuple[Path, dict]:
    """The record of a run data-scaling's results list whose learning rate was not the one chosen."""
    results = json.loads((folder / "data-scaling" / "results.json").read_text())
    chosen = results["choices"]["pretrain_lr"]["ViT"]
    run = next(r for r in results["runs"] if r["label"].startswith("pre-ViT-M") and r["lr"] != chosen)
    return next((folder / "records").glob(f"{run['key']}-*.json")), run


def test_report_names_an_edited_record_of_an_unchosen_learning_rate(tmp_path, capsys):
    folder, report = committed_copy(tmp_path)
    record, _ = unchosen_run(folder)
    edit(record, lambda r: r["train"]["val"].update(top1=0.99))
    before = report.read_bytes()
    assert main(["experiment", "report", "--out", str(folder), "--report", str(report)]) == 2
    assert one_line(capsys).startswith(f"vitlab experiment: error: {record} was edited after vitlab wrote it")
    assert report.read_bytes() == before


def test_report_ties_results_json_to_its_records(tmp_path, capsys):
    """Both files sealed again by a forger, each valid alone: the record and results.json disagree, and both are
    named."""
    folder, report = committed_copy(tmp_path)
    record, run = unchosen_run(folder)
    edit(record, lambda r: r["train"]["val"].update(top1=0.99), reseal=True)
    assert main(["experiment", "report", "--out", str(folder), "--report", str(report)]) == 2
    line = one_line(capsys)
    assert f"{record} gives run {run['key']} a final top-1 of 0.99" in line
    assert str(folder / "data-scaling" / "results.json") in line


@pytest.mark.parametrize("change,says", [
    (lambda r: r["verdict"].update(state="holds"), "was edited after vitlab wrote it"),
    (lambda r: r.pop(CHECKSUM), "has no checksum"),
])
def test_report_names_an_edited_results_json(tmp_path, capsys, change, says):
    folder, report = committed_copy(tmp_path)
    path = folder / "data-scaling" / "results.json"
    edit(path, change)
    assert main(["experiment", "report", "--out", str(folder), "--report", str(report)]) == 2
    assert one_line(capsys).startswith(f"vitlab experiment: error: {path} {says}")


def test_report_refuses_wrong_types_in_one_line(tmp_path, capsys):
    out, report = attack(tmp_path, full_results(check={"holds": "yes", "rule": 3, "details": []}))
    assert main(["experiment", "report", "--out", str(out), "--report", str(report)]) == 2
    assert "check.rule is 3, not a JSON string" in one_line(capsys)


# --- Item 4: the report replaces only a report vitlab wrote ---------------------------------------------------------
def test_report_does_not_replace_a_users_file(tmp_path, capsys):
    out, _ = attack(tmp_path, full_results())
    notes = tmp_path / "NOTES.md"
    notes.write_text("precious\n")
    before = hashes(tmp_path)
    assert main(["experiment", "report", "--out", str(out), "--report", str(notes)]) == 2
    assert one_line(capsys) == (f"vitlab experiment: error: {notes}: exists and is not a report vitlab wrote (its "
                                f"first line is not `{MARK}`); pass --force to replace it, or choose another --report")
    assert hashes(tmp_path) == before
    assert main(["experiment", "report", "--out", str(out), "--report", str(notes), "--force"]) == 0
    assert notes.read_text().startswith(MARK + "\n")
    assert main(["experiment", "report", "--out", str(out), "--report", str(notes)]) == 0  # now it is vitlab's


def test_the_default_report_in_the_current_folder_is_not_replaced(tmp_path, capsys, monkeypatch):
    """`REPRODUCTION.md` in whatever folder the command runs from: a user's file there is refused before any run
    starts (not after hours of training)."""
    import reproduction.experiment as package

    out, _ = attack(tmp_path, full_results())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "REPRODUCTION.md").write_text("my own reproduction notes\n")
    before = hashes(tmp_path)
    started = []
    monkeypatch.setattr(package, "run_experiment", lambda *a, **k: started.append(a))
    assert main(["experiment", "pos-embed", "--out", str(out)]) == 2
    assert "REPRODUCTION.md: exists and is not a report vitlab wrote" in one_line(capsys) and started == []
    assert main(["experiment", "report", "--out", str(out)]) == 2
    assert "pass --force" in one_line(capsys)
    assert hashes(tmp_path) == before


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_report_is_never_written_over_a_special_file(tmp_path, capsys, kind):
    out, report = attack(tmp_path, full_results())
    report.parent.mkdir(parents=True)
    target = tmp_path / "target.md"
    target.write_text(MARK + "\nvitlab's, but reached through a link\n")
    os.mkfifo(report) if kind == "fifo" else report.symlink_to(target)
    before = hashes(tmp_path)
    with within(20):
        assert main(["experiment", "report", "--out", str(out), "--report", str(report), "--force"]) == 2
    named = "a FIFO" if kind == "fifo" else "a symbolic link"
    assert one_line(capsys).startswith(f"vitlab experiment: error: {report}: exists and is {named}")
    assert hashes(tmp_path) == before


def test_a_report_vitlab_wrote_before_the_mark_is_replaced(tmp_path, capsys):
    """The committed REPRODUCTION.md of earlier versions has no mark: its title says whose it is."""
    out, report = attack(tmp_path, full_results())
    report.parent.mkdir(parents=True)
    report.write_text("# Reproducing the paper's findings at small scale\n\nolder text\n")
    assert main(["experiment", "report", "--out", str(out), "--report", str(report)]) == 0
    assert report.read_text().startswith(MARK + "\n# Reproducing")


# --- The one-off migration: records from before checksums, sealed once ----------------------------------------------
def test_seal_gives_a_trusted_legacy_record_its_checksum_and_refuses_the_rest(tmp_path, capsys):
    from reproduction.seal import main as seal

    records = tmp_path / "records"
    recorded_grid(tmp_path / "first", records)
    legacy = record_of(records, 1e-3)
    sealed_text = legacy.read_text()
    edit(legacy, lambda r: r.pop(CHECKSUM))  # as a vitlab before checksums wrote it
    assert seal([str(legacy)]) == 0 and legacy.read_text() == sealed_text  # the same bytes as written sealed
    assert choose(tmp_path / "second", records) == 3e-3
    edit(legacy, lambda r: r["train"]["val"].update(top1=0.99))  # an edited record is not sealed over
    assert seal([str(legacy)]) == 2
    assert "was edited after vitlab wrote it" in one_line(capsys)
    edit(legacy, lambda r: (r.pop(CHECKSUM), r["train"]["val"].update(top1=99.0)))  # nor a legacy one out of range
    assert seal([str(legacy)]) == 2
    assert "train.val.top1 is 99.0, not a fraction in [0, 1]" in one_line(capsys)
