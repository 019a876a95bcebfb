"""Untrusted weights files (vitlab, timm, HF, official .npz, sharded folders) cannot make vitlab allocate for them or
crash: declared sizes are bounded before anything is built, nesting and wrong JSON types are one line, metadata
that contradicts the tensors is refused, a shard index cannot leave its folder; names too long and full or
read-only storage are one line when converting. The settings side is tests/train/test_untrusted_settings.py, whose
helpers are these.

Every CLI case asserts exit code 2, a single `vitlab <verb>: error: ...` line naming the problem, and that the
user's files are unchanged (sha256). Cases whose failure was unbounded memory run in a subprocess under
RLIMIT_AS (1 GiB above what the interpreter already maps). Full-disk and read-only cases mount a small tmpfs
(root only; skipped elsewhere) and also assert that nothing half-written is left behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import vitlab
import vitlab.cli
from tests.conftest import TINY_VIT_ARGS
from vitlab.cli import main
from vitlab.errors import WeightsError
from vitlab.models import BiTConfig, ViTConfig, build_model
from vitlab.weights.tensors import read_weights_folder

TINY = ViTConfig(image_size=16, patch_size=8, **TINY_VIT_ARGS, num_classes=3)
TINY_BIT = BiTConfig(layers=(1,), width_factor=1, image_size=16, num_classes=3)
SMALL_RUN = ["--steps", "1", "--depth", "1", "--width", "32", "--heads", "2", "--mlp-dim", "32", "--batch-size",
             "8", "--workers", "0"]
LONG = "n" * 300  # longer than the 255 bytes most file systems allow for one name


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` with its sha256: what "the user's files are unchanged" compares."""
    return {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line_error(capsys, argv: list[str], *needles: str) -> str:
    """Run the CLI in-process: exit code 2 and exactly one stderr line `vitlab <verb>: error: …` with `needles`."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"vitlab {argv[0]}: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def tiny_file(tmp_path: Path, name: str = "tiny.safetensors", config: ViTConfig | BiTConfig = TINY) -> Path:
    torch.manual_seed(0)
    path = tmp_path / name
    vitlab.save(build_model(config), path)
    return path


def crafted(tmp_path: Path, config: dict | str, meta: str | None = None, name: str = "crafted.safetensors") -> Path:
    """A small vitlab file: TINY's tensors, with `config` (and `meta`) written into the metadata as given."""
    tensors = {k: v.contiguous() for k, v in build_model(TINY).state_dict().items()}
    metadata = {"format": "vitlab", "config": config if isinstance(config, str) else json.dumps(config)}
    if meta is not None:
        metadata["meta"] = meta
    path = tmp_path / name
    save_file(tensors, str(path), metadata=metadata)
    return path


def raw_safetensors(tmp_path: Path, header: bytes) -> Path:
    path = tmp_path / "raw.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return path


def hf_folder(tmp_path: Path, edit) -> Path:
    """A transformers-layout folder of TINY whose config.json is replaced by `edit(config)`."""
    from vitlab.weights.hf import write_hf

    folder = tmp_path / "hf"
    write_hf(build_model(TINY), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(edit(config))
    return folder


def timm_folder(tmp_path: Path, edit, name: str = "config.json") -> Path:
    """A timm hub folder of TINY whose file `name` is replaced by `edit(its JSON)`."""
    from vitlab.weights.timm import write_timm

    folder = tmp_path / "timm"
    write_timm(build_model(TINY), folder)
    target = folder / name
    target.write_text(edit(json.loads(target.read_text()) if target.exists() else {}))
    return folder


def sharded_folder(tmp_path: Path, index: str) -> Path:
    """A timm folder whose weights are one shard behind `model.safetensors.index.json` holding `index`."""
    folder = timm_folder(tmp_path, json.dumps)
    (folder / "model.safetensors").rename(folder / "part-1.safetensors")
    (folder / "model.safetensors.index.json").write_text(index)
    return folder


DEEP_JSON = "[" * 100_000 + "]" * 100_000


# --- Bounds: sizes read from untrusted weights, checked before anything is built (memory-limited subprocess) --

BOUNDED = """
import resource, sys
import torch
torch.set_num_threads(1)
import vitlab.cli
mapped = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), resource.RLIM_INFINITY))  # 1 GiB more, no further
sys.exit(vitlab.cli.main(sys.argv[1:]))
"""


def run_bounded(argv: list[str], cwd: Path) -> tuple[int, str]:
    """The CLI in a subprocess allowed 1 GiB more address space than the imported interpreter, and 120 s."""
    proc = subprocess.run([sys.executable, "-c", BOUNDED, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return proc.returncode, proc.stderr.strip()


def _declared(tmp_path: Path, case: str) -> Path:
    vit = TINY.to_dict()
    if case == "depth 10^6":  # 6 KB of file, a million blocks declared
        return crafted(tmp_path, {**vit, "depth": 10**6})
    if case == "depth 1000, few tensors":  # within the block limit, but 8,000 tensors for a file of 20
        return crafted(tmp_path, {**vit, "depth": 1000})
    if case == "hybrid stem of 10^6 units":
        return crafted(tmp_path, {**vit, "patch_size": 2, "resnet": {"layers": [10**6], "width_factor": 1}})
    if case == "BiT of 10^6 stages":
        return crafted(tmp_path, {**TINY_BIT.to_dict(), "layers": [1] * 10**6})
    if case == "HF config.json num_hidden_layers 10^6":
        return hf_folder(tmp_path, lambda c: json.dumps({**c, "num_hidden_layers": 10**6}))
    if case == "npz member declaring 400 GB":  # numpy allocates the declared shape before it reads
        return npz_bomb(tmp_path)
    raise AssertionError(case)


def npz_bomb(tmp_path: Path) -> Path:
    """A 700-byte .npz whose two .npy headers each declare 10^11 float32 values over 64 bytes of data."""
    import io
    import zipfile

    from numpy.lib import format as npy

    member = io.BytesIO()
    npy.write_array_header_1_0(member, {"descr": "<f4", "fortran_order": False, "shape": (10**11,)})
    member.write(bytes(64))
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w") as archive:
        for name in ("Transformer/encoder_norm/scale.npy", "embedding/kernel.npy"):
            archive.writestr(name, member.getvalue())
    return path


@pytest.mark.parametrize("case, says", [
    ("depth 10^6", "declares depth 1000000: beyond vitlab's limit of 1,024 blocks"),
    ("depth 1000, few tensors", "declares depth 1000 (at least 8,000 tensors) but holds 20 tensors"),
    ("hybrid stem of 10^6 units", "1000000 ResNet units in 1 stages: beyond vitlab's limit"),
    ("BiT of 10^6 stages", "1000000 ResNet units in 1000000 stages: beyond vitlab's limit"),
    ("HF config.json num_hidden_layers 10^6", "config.json: declares depth 1000000: beyond vitlab's limit"),
    ("npz member declaring 400 GB", "declares shape (100000000000,) (400,000,000,000 bytes) but holds 192 bytes"),
])
def test_declared_sizes_are_bounded_before_anything_is_built(tmp_path, case, says):
    path = _declared(tmp_path, case)
    before = tree(tmp_path)
    rc, err = run_bounded(["info", str(path)], tmp_path)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("vitlab info: error: ") and says in err, err
    assert tree(tmp_path) == before


def test_billion_laughs_config_is_refused_in_bounded_memory(tmp_path):
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level, prev in zip("bcdefghi", "abcdefgh", strict=True):  # 9^9 = 387 million strings once expanded
        lines.append(f"{level}: &{level} [{', '.join(['*' + prev] * 9)}]")
    config = tmp_path / "lol.yaml"
    config.write_text("\n".join(lines) + "\nlr_sweep: *i\n")
    before = sha256(config)
    rc, err = run_bounded(["train", "--config", str(config), "--print-config"], tmp_path)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "lol.yaml: uses YAML aliases" in err
    assert sha256(config) == before


def test_an_oversized_config_file_is_refused(tmp_path, capsys):
    config = tmp_path / "big.json"
    config.write_text(json.dumps({"lr": 0.1, "notes": ["x" * 1000] * 2000}))
    one_line_error(capsys, ["train", "--config", str(config), "--print-config"], "big.json", "limit 1,048,576")


# --- Nesting deeper than the parsers recurse: one line, not RecursionError ---------------------------------


def _deep(tmp_path: Path, case: str) -> list[str]:
    if case == "safetensors header":
        return ["info", str(raw_safetensors(tmp_path, DEEP_JSON.encode()))]
    if case == "vitlab config metadata":
        return ["info", str(crafted(tmp_path, DEEP_JSON))]
    if case == "vitlab meta metadata":
        return ["info", str(crafted(tmp_path, TINY.to_dict(), meta=DEEP_JSON))]
    if case == "HF config.json":
        return ["info", str(hf_folder(tmp_path, lambda c: DEEP_JSON))]
    if case == "--config JSON":
        (tmp_path / "deep.json").write_text('{"lr": ' + DEEP_JSON + "}")
        return ["train", "--config", str(tmp_path / "deep.json"), "--print-config"]
    if case == "--config YAML":
        (tmp_path / "deep.yaml").write_text("lr: " + DEEP_JSON)
        return ["train", "--config", str(tmp_path / "deep.yaml"), "--print-config"]
    if case == "run config.json behind --init":
        run = _fake_run(tmp_path)
        (run / "config.json").write_text(DEEP_JSON)
        return ["finetune", "--init", str(run), "--data", "digits", "--print-config"]
    raise AssertionError(case)


@pytest.mark.parametrize("case, says", [
    ("safetensors header", "corrupt safetensors header"),
    ("vitlab config metadata", "invalid vitlab config in metadata (nested too deeply)"),
    ("vitlab meta metadata", "corrupt vitlab metadata ('meta' is not JSON)"),
    ("HF config.json", "not valid JSON (nested too deeply)"),
    ("--config JSON", "deep.json: nested too deeply to be a settings file"),
    ("--config YAML", "deep.yaml: nested too deeply to be a settings file"),
    ("run config.json behind --init", "nested too deeply to be a run's settings"),
])
def test_deeply_nested_json_is_one_line(tmp_path, capsys, case, says):
    argv = _deep(tmp_path, case)
    before = tree(tmp_path)
    one_line_error(capsys, argv, says)
    assert tree(tmp_path) == before


# --- A list (or other JSON) where an object belongs ----------------------------------------------------------


def _fake_run(tmp_path: Path) -> Path:
    """A run directory as vitlab.load reads it (final weights, metrics.jsonl, config.json), without training."""
    run = tmp_path / "run"
    run.mkdir()
    tiny_file(run, "model.safetensors")
    (run / "metrics.jsonl").write_text("")
    from vitlab.train.resolution import resolve

    (run / "config.json").write_text(json.dumps(resolve("demo", {"out": str(run)}).config.to_dict()))
    return run


@pytest.mark.parametrize("case, argv_of, says", [
    ("safetensors header", lambda t: ["info", str(raw_safetensors(t, b"[1, 2]"))], "not an object"),
    ("safetensors entry", lambda t: ["info", str(raw_safetensors(t, b'{"w": [1]}'))], "entry 'w' is malformed"),
    ("vitlab config metadata", lambda t: ["info", str(crafted(t, "[1, 2]"))], "invalid vitlab config"),
    ("vitlab image_size", lambda t: ["info", str(crafted(t, {**TINY.to_dict(), "image_size": {"h": 16}}))],
     "image_size must be an integer or two integers"),
    ("HF config.json", lambda t: ["info", str(hf_folder(t, lambda c: "[1, 2]"))], "holds a JSON list"),
    ("HF preprocessor_config.json", lambda t: ["info", str(_hf_preprocessor_list(t))], "holds a JSON list"),
    ("timm config.json", lambda t: ["info", str(timm_folder(t, lambda c: "[1]"))], "holds a JSON list"),
    ("timm pretrained_cfg", lambda t: ["info", str(timm_folder(t, lambda c: json.dumps({**c, "pretrained_cfg": [1]})))],
     "'pretrained_cfg' is a JSON list, not an object"),
    ("timm model_args", lambda t: ["info", str(timm_folder(t, lambda c: json.dumps({**c, "model_args": [1]})))],
     "'model_args' is a JSON list, not an object"),
    ("shard index", lambda t: ["info", str(sharded_folder(t, "[1]"))], "holds a JSON list"),
    ("shard index weight_map", lambda t: ["info", str(sharded_folder(t, '{"weight_map": [1]}'))], "no 'weight_map'"),
    ("run config.json behind --init", lambda t: ["finetune", "--init", str(_listed_run(t)), "--data", "digits",
                                                 "--print-config"], "holds a JSON list"),
    ("run config.json as --config", lambda t: ["train", "--config", str(_listed_run(t) / "config.json"),
                                               "--print-config"], "expected a mapping of settings, got list"),
])
def test_a_list_where_an_object_belongs_is_one_line(tmp_path, capsys, case, argv_of, says):
    argv = argv_of(tmp_path)
    before = tree(tmp_path)
    one_line_error(capsys, argv, says)
    assert tree(tmp_path) == before


def _hf_preprocessor_list(tmp_path: Path) -> Path:
    folder = hf_folder(tmp_path, json.dumps)
    (folder / "preprocessor_config.json").write_text("[1]")
    return folder


def _listed_run(tmp_path: Path) -> Path:
    run = _fake_run(tmp_path)
    (run / "config.json").write_text("[1, 2]")
    return run


# --- Names too long for the file system --------------------------------------------------------------------


@pytest.mark.parametrize("case", ["convert file", "convert hf folder", "convert into a long folder", "info",
                                  "eval --weights", "train --out"])
def test_a_name_too_long_is_one_line(tmp_path, capsys, case):
    src = tiny_file(tmp_path)
    argv = {"convert file": ["convert", str(src), str(tmp_path / f"{LONG}.safetensors")],
            "convert hf folder": ["convert", str(src), str(tmp_path / LONG), "--to", "hf"],
            "convert into a long folder": ["convert", str(src), str(tmp_path / LONG / "out.safetensors")],
            "info": ["info", str(tmp_path / f"{LONG}.safetensors")],
            "eval --weights": ["eval", "--weights", str(tmp_path / LONG), "--data", "digits"],
            "train --out": ["train", "--out", str(tmp_path / LONG), *SMALL_RUN]}[case]
    before = tree(tmp_path)
    one_line_error(capsys, argv, "File name too long", LONG)
    assert tree(tmp_path) == before


def test_a_long_name_the_file_system_allows_is_written(tmp_path, capsys):
    """240 bytes fit the limit; the temporary beside it (a longer name) must not make the write fail."""
    src = tiny_file(tmp_path)
    dst = tmp_path / ("m" * 228 + ".safetensors")
    assert main(["convert", str(src), str(dst)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([src.name, dst.name])
    assert torch.equal(vitlab.load(dst).pos_embed, vitlab.load(src).pos_embed)


# --- Full disk and read-only targets (small_mount: a small tmpfs; root only) -----------------------------------


FORMATS = {  # name: (destination, extra flags, source architecture)
    "vitlab": ("out.safetensors", [], TINY),
    "jax-npz": ("out.npz", [], TINY),
    "bit-npz": ("out.npz", ["--to", "bit-npz"], TINY_BIT),
    "timm safetensors": ("out.safetensors", ["--to", "timm"], TINY),
    "timm pickle": ("out.pth", ["--to", "timm"], TINY),
    "timm folder": ("out", ["--to", "timm"], TINY),
    "hf": ("out", ["--to", "hf"], TINY),
    "hf bit": ("out", ["--to", "hf"], TINY_BIT),
}


@pytest.mark.parametrize("read_only", [False, True], ids=["full disk", "read-only"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_convert_onto_full_or_read_only_storage_is_one_line(tmp_path, capsys, small_mount, fmt, read_only):
    name, flags, arch = FORMATS[fmt]
    src = tiny_file(tmp_path, config=arch)
    before = sha256(src)
    target = small_mount(read_only)
    says = "Read-only file system" if read_only else "No space left on device"
    one_line_error(capsys, ["convert", str(src), str(target / name), *flags], says, str(target / name))
    assert list(target.iterdir()) == []  # nothing half-written, no temporaries
    assert sha256(src) == before


def test_wrapped_storage_errors_name_the_destination(tmp_path, monkeypatch):
    """Libraries that wrap the OS error (safetensors' text, torch.save's RuntimeError without an errno) still give
    an OSError naming the destination; other failures pass through unchanged."""
    import errno
    import shutil

    from vitlab.files.outputs import atomic_write

    dest = tmp_path / "m.safetensors"

    def fail(message: Exception):
        def write(tmp: str) -> None:
            Path(tmp).write_bytes(b"partial")
            raise message
        return write

    with pytest.raises(OSError) as got:
        atomic_write(dest, fail(RuntimeError("Error while serializing: I/O error: No space (os error 28)")))
    assert got.value.errno == errno.ENOSPC and got.value.filename == str(dest)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100, 100, 0))
    with pytest.raises(OSError) as got:
        atomic_write(dest, fail(RuntimeError("unexpected pos 64 vs 0")))
    assert got.value.errno == errno.ENOSPC
    with pytest.raises(ValueError, match="a bug"):  # not the storage's fault: as it was
        atomic_write(dest, fail(ValueError("a bug")))
    assert list(tmp_path.iterdir()) == []


# --- metadata that contradicts the tensors, shard indexes that leave their folder ----------------------------
CRAFTED_FROM = ViTConfig(image_size=16, patch_size=8, width=16, depth=1, mlp_dim=32, num_heads=2, num_classes=3)


def crafted_file(tmp_path, **config_changes):
    """A small vitlab file whose metadata declares a different architecture than its tensors hold."""
    model = build_model(CRAFTED_FROM)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    config = {**CRAFTED_FROM.to_dict(), **config_changes}
    path = tmp_path / "crafted.safetensors"
    save_file(tensors, str(path), metadata={"format": "vitlab", "config": json.dumps(config)})
    return path


def test_crafted_image_size_is_refused_before_building(tmp_path, capsys):
    path = crafted_file(tmp_path, image_size=[40000, 40000])  # a (1, 25M + 1, 16) position embedding: 1.6 GB
    # refused by the config's bounds, before any tensor shape is even compared
    with pytest.raises(WeightsError, match=r"image_size 40000x40000 is beyond vitlab's limit of 16,384 pixels"):
        vitlab.load(path)
    assert vitlab.cli.main(["info", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "image_size 40000x40000" in err


def test_crafted_depth_is_refused(tmp_path):
    with pytest.raises(WeightsError, match="missing tensors blocks.1"):
        vitlab.load(crafted_file(tmp_path, depth=2))


def test_shard_index_cannot_leave_its_folder(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    outside = tmp_path / "secret.safetensors"
    save_file({"w": torch.zeros(1)}, str(outside))
    for name in ("../secret.safetensors", str(outside)):
        index = {"weight_map": {"w": name}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        with pytest.raises(WeightsError, match="names a shard outside its folder"):
            read_weights_folder(folder, ("model.safetensors",))


def test_shard_index_symlink_out_of_folder_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    save_file({"w": torch.zeros(1)}, str(tmp_path / "elsewhere.safetensors"))
    (folder / "shard.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "shard.safetensors"}}))
    with pytest.raises(WeightsError, match="outside its folder"):
        read_weights_folder(folder, ("model.safetensors",))
