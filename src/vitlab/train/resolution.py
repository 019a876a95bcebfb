"""How a run's settings are decided: one pass, each value remembering where it came from.

1. The start (vitlab.train.start): a recorded run continues with its stored settings, accepting only the flags that
   are safe to change mid-run and refusing the others; otherwise the --config file is read and the recipe named.
2. The initial weights, when the run starts from some, are read once.
3. The layers are gathered and merged, later ones winning:

       defaults < recipe < initial weights < preset < --config file < flags

4. The rules (vitlab.train.rules.apply_rules) fill in what a recipe leaves to the model (a Table 3 row, a
   `pre_logits` as wide as the model, the official fine-tuning dropout) or to the data (BiT-HyperRule), the warm-up,
   the intervals and the `auto` choices.
5. The result is validated (vitlab.train.config.validate).

No step goes back to an earlier one. The result, `Resolved`, is what the start banner prints, what `--print-config`
shows, what config.json records (values and sources) and what the loop runs: nothing after this step changes a
setting.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.constants import canonical_setting
from vitlab.data.objects import is_object_description
from vitlab.errors import by_surface, setting
from vitlab.files.rundir import CONFIG, MANIFEST, checkpoint_settings, list_checkpoints, run_dir_of, special_run_file
from vitlab.models.config import BiTConfig
from vitlab.models.registry import architecture_differences, describe_architecture, model_config
from vitlab.runtime.precision import device_kind
from vitlab.train.config import (
    RUN_RECORD_KEYS,
    TrainConfig,
    check_known,
    check_record,
    check_types,
    config_from_json,
    config_from_record,
    flag_text,
    read_record,
    setting_text,
    validate,
    value_text,
)
from vitlab.train.recipes import FINETUNE_PRESETS, RECIPES
from vitlab.train.rules import apply_rules, check_epochs, steps_on_resume, user_set
from vitlab.train.settings import FLAG_ONLY, spelled
from vitlab.train.start import Start, decide_start
from vitlab.weights.load import read_weights
from vitlab.weights.locate import locate

# --------------------------------------------------------------------------------------------------------------
# The model a run's settings describe, checked at resolution (so `--print-config` refuses what training would):
# `model_args` the named model has, and a `--model` that agrees with the `--init` weights fine-tuning starts from.
#
# Fine-tuning keeps the architecture of its initial weights: a `--model` naming another network would be recorded
# (banner, config.json, weights' name) while the weights' own was trained, so it is refused; one naming the same
# network is kept as the run's label.

# The declared settings that set a model_args field (--width sets embed_dim)
_MODEL_SETTING = {s.model_field: s.name for s in FLAG_ONLY if s.model_field}


def _arg(field: str) -> str:
    """A model field as the caller spells it: its flag (`--width`) or vitlab.fit keyword (`width`)."""
    return spelled(_MODEL_SETTING[field]) if field in _MODEL_SETTING else field
# Fields the run sets itself (from --image-size, the data's classes, --dropout …), never through model_args.
_RUN_FIELDS = ("image_size", "num_classes", "name")


def _named(keys: list[str]) -> str:
    return ", ".join(_arg(k) for k in sorted(keys))


def check_model_args(model: str, model_args: Mapping[str, Any]) -> None:
    """ValueError unless every model_args key is a setting of `model`'s config and the result is a valid model."""
    base = model_config(model)  # an unknown name: its own one-line error
    fields = {f.name for f in dataclasses.fields(base)} - set(_RUN_FIELDS)
    run_set = [k for k in model_args if k in _RUN_FIELDS]
    if run_set:
        raise ValueError(f"model_args {_named(run_set)}: set by the run itself ({setting('image_size')}, the data's "
                         "classes), "
                         "not by model_args; remove it there")
    unknown = [k for k in model_args if k not in fields]
    if unknown:
        kind = ("a BiT ResNetV2, whose settings are layers and width_factor" if isinstance(base, BiTConfig) else
                "a ViT, whose settings include depth, width, num_heads, mlp_dim, patch_size, classifier, pos_embed")
        raise ValueError(f"{_named(unknown)} does not apply to {model} ({kind}); leave it out or choose another "
                         f"{setting('model')}")
    try:
        model_config(model, **model_args)
    except (TypeError, ValueError) as err:
        raise ValueError(f"model_args of {model}: {err}") from None


def check_against_init(values: Mapping[str, Any], sources: Mapping[str, str], checkpoint: Any) -> None:
    """ValueError when `model` or `model_args`, set by a layer after the initial weights, describe a network
    other than the weights' (which is what fine-tuning builds); naming the same network is fine."""
    config = checkpoint.config
    own = config.name or describe_architecture(config)
    model, model_args = values["model"], dict(values["model_args"])
    model_given = not sources["model"].startswith("weights ")
    args_given = bool(model_args) and not sources["model_args"].startswith("weights ")
    if not (model_given or args_given) or (model == own and not model_args):
        return
    try:  # the weights' own label ("ViT/4 (depth 4, …)") is no variant name: the flags then change the weights'
        named = model_config(model, **model_args) if model != own else config.replace(**model_args)
    except (TypeError, ValueError):
        named = None
    differences = architecture_differences(named, config) if named is not None else ["not a listed variant"]
    if not differences:
        return
    said = ([f"{setting('model', value=model)} ({sources['model']})"] if model_given else []) + (
        [", ".join(f"{_arg(k)} {v}" for k, v in sorted(model_args.items())) + f" ({sources['model_args']})"]
        if args_given else [])
    raise ValueError(f"{' and '.join(said)} contradict{'s' if len(said) == 1 else ''} "
                     f"{setting('init', value=values.get('init'))}: "
                     f"its weights are {own} ({'; '.join(differences[:3])}); fine-tuning keeps the weights' "
                     "architecture, so leave them out")


# Settings a resumed run may change: they decide how long the run goes on and what it reports, not what it
# computes. Everything else must equal the stored run.
SAFE_ON_RESUME = frozenset({"steps", "workers", "log_every", "eval_every", "save_every", "keep_last",
                            "eval_batch_size", "fewshot_every", "device", "compile", "strict", "resume", "out",
                            "tensorboard", "wandb_project", "attention", "async_save"})
# Pre-processing a vitlab run records, which fine-tuning from its weights keeps (the data is usually alike).
PREPROCESSING = ("train_crop", "crop_scale", "crop_ratio", "flip", "eval_resize")


@dataclass(frozen=True)
class InitWeights:
    """`--init` located once (a published name: its cached file; a run: its newest intact checkpoint, whose
    manifest is checked) and read once: the settings, the model and every run of a sweep start from this. A model
    object (`vitlab.fit(init=model)`) is read the same way, without a file."""

    path: Path | None  # the local weights file; None for a model object
    checkpoint: Any  # its vitlab.weights.record.WeightsRecord


def read_init(init: str | Path) -> InitWeights:
    path = locate(init)
    return InitWeights(path, read_weights(path))


@dataclass(frozen=True)
class Resolved:
    config: TrainConfig
    sources: dict[str, str]  # field -> where its value came from ("recipe finetune", "flag", "weights …", …)
    notes: tuple[str, ...] = ()  # decisions worth a line of their own (a rule applied, a resolution change)
    resumed_changes: dict[str, list[Any]] = field(default_factory=dict)  # field -> [stored, now] on resume
    data: Any = None  # the Datasets, when a setting needed them (the loop reuses them)
    init: InitWeights | None = None  # --init, located and read once (the model is built from this read)

    def record(self) -> dict[str, Any]:
        """What config.json stores besides the values: their sources and the notes."""
        return {"sources": dict(self.sources), "notes": list(self.notes)}


def resolve_config(recipe: str = "demo", **overrides: Any) -> TrainConfig:
    """The library shortcut: `resolve_config("finetune", lr=0.01)` = `resolve(recipe, overrides).config`
    (None values are ignored, as CLI flags left unset)."""
    return resolve(recipe, overrides).config


def resolve(recipe: str | None = None, flags: Mapping[str, Any] | None = None, *, config_file: str | None = None,
            verb: str = "train", data: Any = None, init_weights: InitWeights | None = None,
            start: Start | None = None) -> Resolved:
    """Resolve a run's settings in one pass (module doc); `flags` are the TrainConfig fields given explicitly (None =
    not given). `data`: the Datasets, if already built (otherwise built here when a rule needs them);
    `init_weights`: the initial weights already read (a model object: `flags["init"]` is then its description);
    `start`: how the run starts, when the caller has decided it already (vitlab.train.start.decide_start of these
    flags, this config file, recipe and verb)."""
    flags = {k: canonical_setting(k, v) for k, v in (flags or {}).items() if v is not None}
    epochs = check_epochs(flags)  # --epochs N: the steps once the data and batch are known (train/rules.py)
    check_known(flags, "training settings")
    start = start or decide_start(flags, config_file=config_file, recipe=recipe, verb=verb)
    if start.case == "continue":  # 1. the stored run, with the flags a resume may change
        return _resume(Path(flags["out"]), flags, recipe, epochs)
    if flags.get("resume"):
        flags["resume"] = start.case == "sweep"  # resume auto with nothing there: a new run
    if start.init and init_weights is None:  # 3. the initial weights, read once
        init_weights = read_init(start.init)
    checkpoint = init_weights.checkpoint if init_weights else None
    layers = _merge(_gather(start, flags, recipe, init_weights))  # 2.-4.
    _check_model(layers, checkpoint)
    data = apply_rules(layers, start.recipe, epochs, data, checkpoint)
    config = validate(TrainConfig(**layers.values), sources=layers.sources)
    return Resolved(config, dict(layers.sources), tuple(layers.notes), data=data, init=init_weights)


@dataclass(frozen=True)
class _Layer:
    """One layer's values, with their source; `kind` says which merge rules it follows (`_merge`)."""

    kind: str  # "recipe", "weights", "preset", "file" or "flags"
    values: Mapping[str, Any]
    source: str


def _gather(start: Start, flags: Mapping[str, Any], recipe: str | None,
            init_weights: InitWeights | None) -> list[_Layer]:
    """The layers over the defaults, in the order they win: recipe < initial weights < preset < config file <
    flags (an interrupted sweep's `resume` among the flags: its runs resume one by one, train/sweep.py)."""
    name, file_values = start.recipe, start.file_values
    layers = [_Layer("recipe", {k: v for k, v in RECIPES[name].items() if k != "auto"}, f"recipe {name}"),
              _Layer("recipe", {"recipe": name}, "flag" if recipe else f"recipe {name}")]
    if init_weights is not None:
        layers.append(_Layer("weights", _weights_values(init_weights), f"weights {start.init}"))
    preset = flags.get("preset", file_values.get("preset"))
    if preset is not None:
        if preset not in FINETUNE_PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(FINETUNE_PRESETS)}")
        layers.append(_Layer("preset", {**FINETUNE_PRESETS[preset].settings(), "preset": preset}, f"preset {preset}"))
    if file_values:
        layers.append(_Layer("file", file_values, f"config {start.config_file}"))
    layers.append(_Layer("flags", {k: v for k, v in flags.items() if k != "resume"}, "flag"))
    if flags.get("resume"):
        layers.append(_Layer("flags", {"resume": True}, "flag"))
    return layers


def _merge(layers: list[_Layer]) -> _Layers:
    """The defaults with each layer applied in turn, remembering each value's source. A `model` given without
    `model_args` (config file, flag) is that model as named: the model arguments before it shaped another model;
    flags' model arguments without `model` change the model so far; `--lr` without `--lr-sweep` is one run."""
    merged = _Layers()
    for layer in layers:
        values = dict(layer.values)
        if layer.kind in ("file", "flags") and "model" in values and "model_args" not in values and \
                merged.values["model_args"]:
            what = f"model {values['model']} ({layer.source})" if layer.kind == "file" else f"--model {values['model']}"
            merged.notes.append(f"{what}: recipe {merged.values['recipe']}'s model arguments "
                                f"({', '.join(sorted(merged.values['model_args']))}) not applied")
            if layer.kind == "file":
                values["model_args"] = {}
            else:
                merged.apply({"model_args": {}}, "flag --model")
        if layer.kind == "flags" and "model_args" in values and "model" not in values:
            values["model_args"] = {**merged.values["model_args"], **values["model_args"]}
        merged.apply(values, layer.source)
        if layer.kind == "flags" and "lr" in values and "lr_sweep" not in values and merged.values["lr_sweep"]:
            merged.apply({"lr_sweep": ()}, "flag --lr (one run, no sweep)")
    return merged


class _Layers:
    """Values with their sources, built up layer by layer."""

    def __init__(self) -> None:
        defaults = TrainConfig()
        self.values: dict[str, Any] = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(TrainConfig)}
        self.sources: dict[str, str] = dict.fromkeys(self.values, "default")
        self.notes: list[str] = []

    def apply(self, values: Mapping[str, Any], source: str) -> None:
        for key, value in values.items():
            self.values[key] = _lists_to_tuples(value)
            self.sources[key] = source

    def given_after(self, key: str, recipe: str) -> bool:
        """Whether a layer after the recipe chose `key` (then the recipe's rules must not replace it). The
        initial weights' values are defaults, not choices: a rule the recipe applies to the data (BiT-HyperRule's
        resolution) still replaces them."""
        source = self.sources[key]
        return source not in ("default", f"recipe {recipe}") and not source.startswith("weights ")


def _same_file(given: Any, recorded: Any, out: Path) -> bool:
    """Whether two spellings of `--init` name one existing file or folder (by inode; a published name is only
    ever equal to itself). A relative recorded path is tried from the working folder and from the run's parent."""
    for base in (Path.cwd(), out.parent):
        try:
            if os.path.samefile(given, base / recorded):
                return True
        except (OSError, TypeError, ValueError):
            continue
    return False


def _lists_to_tuples(value: Any) -> Any:
    """Lists (from JSON, YAML, argparse) as tuples, as TrainConfig holds them."""
    return tuple(value) if isinstance(value, list) else value


def _weights_values(init_weights: InitWeights) -> dict[str, Any]:
    """What fine-tuning takes from its initial weights: their resolution, architecture name and, for weights a vitlab
    run wrote, that run's pre-processing (for other weights, the evaluation resize they carry: timm's for the
    weights of a timm name)."""
    config = init_weights.checkpoint.config
    values: dict[str, Any] = {"model": config.name or describe_architecture(config), "model_args": {}}
    h, w = config.image_size
    if h == w:
        values["image_size"] = h
    values.update(_recorded_preprocessing(init_weights.path, init_weights.checkpoint.meta))
    return values


def _recorded_preprocessing(weights: Path | None, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The pre-processing the run that wrote `weights` used: its config.json (the weights are the run's own or
    one of its checkpoints'), else the evaluation resize recorded in the weights (or the model object)."""
    run_dir = run_dir_of(weights) if weights is not None else None
    recorded = run_dir / CONFIG if run_dir is not None else None
    if recorded is None or not recorded.exists():
        return {"eval_resize": meta["eval_resize"]} if meta.get("eval_resize") else {}
    try:
        stored = config_from_json(recorded)
    except (OSError, ValueError, TypeError) as err:  # TypeError: a list where a value belongs
        raise ValueError(f"{setting('init', value=str(weights))}: cannot read the settings of the run that wrote it "
                         f"({str(err).splitlines()[0]})") from None
    values = {k: getattr(stored, k) for k in PREPROCESSING}
    check_types(values, f"--init {weights}: {recorded}")
    return values


def _check_model(layers: _Layers, checkpoint: Any) -> None:
    """The model settings against the model (model_args it has) or the initial weights (the same network), and
    --dev-fraction against the sweep it splits for: refused here, so that --print-config refuses them too."""
    if checkpoint is not None:
        check_against_init(layers.values, layers.sources, checkpoint)
    else:
        check_model_args(layers.values["model"], layers.values["model_args"])
    if layers.sources["dev_fraction"] == "flag" and not layers.values["lr_sweep"]:
        raise ValueError(f"{setting('dev_fraction')} holds out the dev split of a learning-rate sweep, and this run "
                         f"has none: add {setting('lr_sweep', value='LR,LR,…')} (or a {setting('preset')} with one), "
                         "or "
                         f"leave {setting('dev_fraction')} out")


def _resume(out: Path, flags: Mapping[str, Any], recipe: str | None, epochs: float | None) -> Resolved:
    """The stored run, with the flags that are safe to change; any other flag must equal the stored value."""
    path = out / CONFIG
    if (special := special_run_file(out)) is not None:
        raise ValueError(f"cannot resume the run in {out}: {special}; a run's files are regular files (move it aside)")
    try:
        record = read_record(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot read the stored run ({err}); it is damaged") from None
    check_record(path, record, RUN_RECORD_KEYS)
    record, checkpoint, filled = recorded_settings(out, record)
    try:
        stored = config_from_record(record)
    except TypeError as err:  # a list where a value belongs
        raise ValueError(f"{path}: cannot read the stored run ({err}); it is damaged") from None
    validate(stored, recorded_in=path)
    sources = {**dict.fromkeys(stored.to_dict(), f"run {out}"), **record.get("sources", {}),
               **dict.fromkeys(filled, f"checkpoint {checkpoint} ({CONFIG} lacks it)")}
    if "precision" not in record:  # recorded before --precision existed: bf16 autocast on CUDA, float32 on CPU
        stored = stored.replace(precision="bf16" if device_kind(stored.device).type == "cuda" else "fp32")
        sources["precision"] = f"run {out}: recorded before --precision (bf16 on CUDA, float32 on CPU)"
    if "attention" not in record:  # recorded before --attention existed: torch's fused kernel
        stored = stored.replace(attention="flash")
        sources["attention"] = f"run {out}: recorded before --attention (flash)"
    if epochs is not None:
        flags = {**flags, "steps": steps_on_resume(record, epochs, path)}
    if recipe is not None and recipe != stored.recipe:
        raise ValueError(f"{setting('recipe', value=recipe)} contradicts the run in {out} (recipe {stored.recipe}); "
                         f"resume without it, or start a new run with another {setting('out', value='DIR')}")
    changes: dict[str, list[Any]] = {}
    for key, value in flags.get("model_args", {}).items():  # --depth/--width/--heads/--mlp-dim, one by one
        if stored.model_args.get(key) != value:
            raise ValueError(f"{_arg(key)} {value} contradicts the run in {out} (stored: "
                             f"{stored.model_args.get(key)}); resume without it, or start a new run with another "
                             f"{setting('out', value='DIR')}")
    for key, value in flags.items():
        if key == "model_args":
            continue
        now, before = _lists_to_tuples(value), getattr(stored, key)
        if now == before or key in ("resume", "out") or (key in ("precision", "attention") and now == "auto"):
            continue  # --precision / --attention auto: the choice the run made when it started
        if key == "init" and _same_file(now, before, Path(out)):
            continue  # the run's own --init by another spelling (relative to another folder, absolute)
        if key in ("data", "init") and (is_object_description(now) or is_object_description(str(before))):
            raise ValueError(f"{key} {str(now)[:300]} is not what the run in {out} was started with "
                             f"({str(before)[:300]}); pass the same {'dataset' if key == 'data' else 'model'} to "
                             f"resume it, or start a new run with another {setting('out', value='DIR')}")
        if key not in SAFE_ON_RESUME:
            raise ValueError(f"{flag_text(key, now)} contradicts the run in {out} (stored: "
                             f"{value_text(key, before)}); resume without it, or start a new run with another "
                             f"{setting('out', value='DIR')}")
        if key == "steps" and now < before:
            asked = (f"{setting('epochs', value=setting_text(epochs))} ({now} steps)" if epochs is not None
                     else setting("steps", value=now))
            raise ValueError(f"{asked} is below the run's {before} steps: a resumed run continues to its end or "
                             "further; evaluate a checkpoint with "
                             + by_surface("`vitlab eval`", "vitlab.load and your own loop") + " instead")
        changes[key] = [before, now]
        sources[key] = "flag (on resume)"
    # The folder the user names is the run: a copied or moved run continues where it is now, never at the path
    # recorded in its config.json (which would rewrite the original's weights and checkpoints).
    sources["out"] = "flag (on resume)" if str(stored.out) != str(flags["out"]) else sources.get("out", "flag")
    config = validate(stored.replace(resume=True, out=str(flags["out"]), **{k: v[1] for k, v in changes.items()}))
    notes = tuple(f"resumed with {flag_text(k, v[1])} (was {setting_text(v[0])})"
                  + _extension(k, v, stored) for k, v in changes.items())
    return Resolved(config, sources, tuple(record.get("notes", ())) + notes, resumed_changes=changes)


# The settings a sweep gives each of its runs itself (train/sweep.py: sub_config), never compared with a run's record.
SWEEP_OWN = frozenset({"lr", "lr_sweep", "refit", "val_fraction", "resume", "out"})


def resume_sweep_run(sweep: Resolved, out: Path, lr: float) -> Resolved:
    """One run of an interrupted sweep (`out`: its folder, which holds a config.json), resumed as any run is: its
    recorded settings, held to the values the user set for the sweep (a contradiction refused in one line naming
    the run, a change a resume may make applied), so no run continues with settings it was not trained with."""
    cfg = sweep.config
    given = {k: getattr(cfg, k) for k, source in sweep.sources.items() if user_set(source) and k not in SWEEP_OWN}
    resumed = _resume(out, {**given, "lr": lr, "resume": True, "out": str(out)}, cfg.recipe, None)
    return dataclasses.replace(resumed, init=sweep.init)  # a run without a checkpoint starts from the sweep's read


# --------------------------------------------------------------------------------------------------------------
# A resumed run's settings are the ones it recorded: its config.json, held to the settings its newest checkpoint
# was trained with (each checkpoint's manifest records them all, vitlab.train.checkpoint.write_checkpoint).
#
# - a setting config.json lacks is the checkpoint's, with a warning: a deleted line never becomes a default (a bf16
#   run resumed in float32, a 4-step run extended to the default 1,000 steps);
# - a setting that changes what the run computes (lr, model, data, precision, …) must be the checkpoint's, or the
#   edit is refused, naming config.json, before it is trained with and credited in the banner to the source of the
#   value it replaced;
# - a setting a resume may change (steps, workers, …) may differ, with a warning unless a resume flag changed it.
#
# The manifests are read, not verified (resuming verifies the checkpoint it continues from): a checkpoint whose files
# were damaged since still records the run's settings, and the check costs no hashing of gigabytes.

log = logging.getLogger("vitlab.train")


def recorded_settings(out: Path, record: dict[str, Any]) -> tuple[dict[str, Any], Path | None, list[str]]:
    """(config.json's `record` with the settings it lacks taken from the newest checkpoint that records settings,
    that checkpoint, the keys taken); ValueError naming config.json for an edit that changes what the run computes."""
    checkpoint, trained = None, None
    for checkpoint in list_checkpoints(out):
        trained = checkpoint_settings(checkpoint)
        if trained is not None:
            break
    if trained is None:  # no checkpoint, or written before checkpoints recorded settings: config.json is the record
        return record, None, []
    path = out / CONFIG
    sources = record.get("sources") if isinstance(record.get("sources"), dict) else {}
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    lacking = {}
    for key, before in trained.items():
        if key in ("out", "resume") or key not in fields:  # a moved run continues where it now is
            continue
        if key not in record:
            lacking[key] = before
            continue
        now = record[key]
        if json.dumps(now, sort_keys=True) == json.dumps(before, sort_keys=True):
            continue
        if key in SAFE_ON_RESUME:  # how long the run goes and what it reports, not what it computes: said, kept
            if sources.get(key) != "flag (on resume)":
                log.warning("%s says %s %s, checkpoint %s was trained with %s (edited, or changed by a resume that "
                            "did not record it): continuing with %s; a resume flag (--%s) is the way to change it",
                            path, key, json_excerpt(now), checkpoint, json_excerpt(before), json_excerpt(now),
                            key.replace("_", "-"))
            continue
        was = json_excerpt(before)
        raise ValueError(f"{path} says {key} {json_excerpt(now)} but checkpoint {checkpoint} was trained with {key} "
                         f"{was}: config.json was edited after the run started; put {was} back, or start a new run "
                         f"with another {setting('out', value='DIR')}")
    if lacking:
        check_types(lacking, f"checkpoint {checkpoint} ({MANIFEST})")
        log.warning("%s lacks %s: continuing with what checkpoint %s recorded (%s)", path, ", ".join(lacking),
                    checkpoint, ", ".join(f"{k} {json_excerpt(v)}" for k, v in lacking.items()))
    return {**record, **lacking}, checkpoint, list(lacking)


def json_excerpt(value: Any) -> str:
    """A recorded value in a message: its JSON, cut at 80 characters."""
    return json.dumps(value)[:80]


def _extension(key: str, change: list[Any], stored: TrainConfig) -> str:
    """How a resumed run with more steps continues its learning-rate schedule (the banner says it)."""
    if key != "steps":
        return ""
    return (f": the {stored.decay} learning-rate schedule re-planned for {change[1]} steps (warm-up kept), so each "
            f"step from the checkpoint on takes the lr of the {change[1]}-step schedule")
