"""`vitlab bench --data`: how fast the training loader serves a data source, and timm's loader on the same one.

One repeat times one loader from nothing: open the source (vitlab: `build_datasets`, which scans a folder's
headers, reads a shard index or opens Arrow files; timm: `create_dataset`), build the training loader (vitlab:
the one `vitlab train` builds, `train.setup.make_loaders`; timm: `create_loader`), and draw batches until
`images` images came out. Each batch is the training transform's output: the inception crop (area 5-100 %,
aspect 3/4-4/3) resized to the image size, and the flip, as uint8 (N, 3, H, W). Normalising is left out on both
sides (vitlab normalises on the device; timm's prefetcher does, and its inner loader is the one iterated).

- time to first batch: from opening the source to the first batch out of the loader, worker start-up included;
- images/s: images after the first `max(workers, 1)` batches over the time after them (each worker's first
  batch overlaps the start-up of the others; skipping one batch per worker times the steady state);
- decode failures: images the vitlab loader could not decode and replaced (timm skips them with a warning
  logged in the worker, which the bench cannot count: "-").

vitlab and timm repeats alternate (v, t, v, t, ...), so slow spells of a shared machine hit both; medians and
the per-pair ratios are reported as `vitlab bench --compare timm` reports models.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from vitlab.bench.data_timm import timm_reader
from vitlab.bench.machine import environment
from vitlab.bench.result import BenchSettings, verdict
from vitlab.data import build_datasets
from vitlab.data.shards import ShardSplit
from vitlab.train.config import TrainConfig
from vitlab.train.distributed import Dist
from vitlab.train.trainer import default_workers, make_loaders


@dataclass
class DataBenchSettings:
    data: str
    workers: int | None = None  # None: training's default (one CPU for the training process, the rest up to 8)
    images: int = 2048  # per repeat
    image_size: int = 224
    batch_size: int = 32
    repeats: int = 3
    compare: str | None = None  # "timm"
    val_fraction: float | None = None  # for a source without a validation split, as `vitlab train` takes it
    seed: int = 0


@dataclass
class LoaderRun:
    """One repeat of one loader."""

    images: int  # served in all
    first_batch_s: float
    timed_images: int  # served after the first max(workers, 1) batches
    timed_s: float
    failures: int | None  # None: not observable (timm)

    @property
    def images_per_s(self) -> float:
        return self.timed_images / self.timed_s


@dataclass
class LoaderMeasurement:
    impl: str  # "vitlab" or "timm"
    reader: str  # what read the source, in words
    workers: int
    runs: list[LoaderRun] = field(default_factory=list)

    @property
    def images_per_s(self) -> float:
        return statistics.median(r.images_per_s for r in self.runs)

    @property
    def per_worker(self) -> float:
        return self.images_per_s / max(self.workers, 1)

    @property
    def first_batch_s(self) -> float:
        return statistics.median(r.first_batch_s for r in self.runs)

    @property
    def failures(self) -> int | None:
        return None if any(r.failures is None for r in self.runs) else sum(r.failures for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {"impl": self.impl, "reader": self.reader, "workers": self.workers,
                "runs": [{**asdict(r), "images_per_s": r.images_per_s} for r in self.runs],
                "images_per_s": self.images_per_s, "per_worker": self.per_worker,
                "first_batch_s": self.first_batch_s, "failures": self.failures}


@dataclass
class DataBenchResult:
    settings: DataBenchSettings
    source: dict[str, Any]  # kind, training images, shards
    environment: dict[str, Any]
    measurements: list[LoaderMeasurement] = field(default_factory=list)

    def get(self, impl: str) -> LoaderMeasurement | None:
        return next((m for m in self.measurements if m.impl == impl), None)

    def ratios(self) -> dict[str, dict[str, Any]]:
        """Per pair of repeats: vitlab/other images/s and other/vitlab seconds to the first batch (both > 1
        when vitlab is ahead)."""
        ours, theirs = self.get("vitlab"), self.get(self.settings.compare or "")
        if ours is None or theirs is None:
            return {}
        pairs = {"images/s": [a.images_per_s / b.images_per_s for a, b in zip(ours.runs, theirs.runs, strict=True)],
                 "first batch": [b.first_batch_s / a.first_batch_s for a, b in zip(ours.runs, theirs.runs,
                                                                                    strict=True)]}
        medians = {"images/s": ours.images_per_s / theirs.images_per_s,
                   "first batch": theirs.first_batch_s / ours.first_batch_s}
        return {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "per_repeat": v,
                    "of_medians": medians[k], "vitlab_ahead_in": sum(p > 1 for p in v), "repeats": len(v)}
                for k, v in pairs.items()}

    def ratio_lines(self) -> list[str]:
        other, lines = self.settings.compare, []
        words = {"images/s": ("faster", "slower", f"vitlab/{other} images/s"),
                 "first batch": ("sooner", "later", f"{other}/vitlab seconds to the first batch")}
        for key, r in self.ratios().items():
            better, worse, what = words[key]
            pairs = ", ".join(f"{v:.3f}" for v in r["per_repeat"])
            lines.append(f"{what}: per repeat {pairs}; median {r['median']:.3f}, ratio of the medians above "
                         f"{r['of_medians']:.3f}; {verdict(r['vitlab_ahead_in'], r['repeats'], better, worse)}")
        if lines:
            lines.append("(repeats timed back to back, vitlab first in odd pairs and second in even ones, so slow "
                         "drift of the machine cancels within a pair. Mixed directions mean the difference is within "
                         "this machine's noise: raise --repeats and --images.)")
        return lines

    def table(self) -> str:
        s, src = self.settings, self.source
        shards = f", {src['shards']} shards" if src.get("shards") else ""
        lines = [
            f"{s.data} ({src['kind']}, {src['train_images']} training images{shards}); {s.images} images per repeat, "
            f"batch {s.batch_size}, {s.image_size}x{s.image_size} inception crop + flip, "
            f"{self.measurements[0].workers} worker(s), {self.environment['cpu_count']} CPUs",
            "",
            "| impl | reader | img/s median | img/s min-max | img/s per worker | first batch s median | "
            "first batch s min-max | decode failures |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for m in self.measurements:
            ips = [r.images_per_s for r in m.runs]
            first = [r.first_batch_s for r in m.runs]
            failures = "-" if m.failures is None else str(m.failures)
            lines.append(f"| {m.impl} | {m.reader} | {m.images_per_s:.1f} | {min(ips):.1f}-{max(ips):.1f} | "
                         f"{m.per_worker:.1f} | {m.first_batch_s:.2f} | {min(first):.2f}-{max(first):.2f} | "
                         f"{failures} |")
        for note in src.get("notes", []):
            lines += ["", note]
        lines += ["", *self.ratio_lines()]
        return "\n".join(lines).rstrip()

    def to_dict(self) -> dict[str, Any]:
        return {"settings": asdict(self.settings), "source": self.source, "environment": self.environment,
                "measurements": [m.to_dict() for m in self.measurements], "ratios": self.ratios()}


# ---- timing one loader --------------------------------------------------------------------------------------

Batches = Callable[[], Iterator[Any]]  # opens the source, builds the loader, yields batches


def _drain(open_batches: Batches, steps: int, warm: int, count: Callable[[Any], tuple[int, int | None]],
           on_batch: Callable[[int], None] | None) -> LoaderRun:
    """Time `steps` batches from `open_batches()` (which opens the source: it is inside the timing). Every repeat
    starts after a full garbage collection: the first one would otherwise also pay for collecting the imports'
    objects (0.1-0.2 s), wherever the collector happened to fall due, and the sources compared would differ by
    that chance rather than by what they do."""
    gc.collect()
    t0 = time.perf_counter()
    batches = open_batches()
    times, sizes, failures = [], [], 0
    for _ in range(steps):
        n, bad = count(next(batches))
        times.append(time.perf_counter())
        sizes.append(n)
        failures = None if bad is None or failures is None else failures + bad
        if on_batch:
            on_batch(n)
    del batches
    gc.collect()  # the loader and its workers go before the next repeat starts its own
    return LoaderRun(sum(sizes), times[0] - t0, sum(sizes[warm:]), times[-1] - times[warm - 1], failures)


def _vitlab_batches(s: DataBenchSettings, workers: int, steps: int) -> Iterator[Any]:
    data = build_datasets(s.data, s.val_fraction)
    cfg = TrainConfig(data=s.data, workers=workers, image_size=s.image_size, batch_size=s.batch_size, steps=steps,
                      seed=s.seed, val_fraction=s.val_fraction)
    loader, _, _ = make_loaders(cfg, data, 0, _one_cpu_process())
    yield from loader


def _one_cpu_process() -> Any:
    return Dist(rank=0, world=1, local_rank=0, local_world=1, device=torch.device("cpu"), owns_group=False)


def _vitlab_count(batch: dict[str, Any]) -> tuple[int, int]:
    return len(batch["images"]), len(batch["bad"])


def _timm_count(batch: Any) -> tuple[int, None]:
    return len(batch[0]), None  # timm skips an unreadable image with a logged warning, in the worker: not counted


def resolve_workers(workers: int | None) -> int:
    return default_workers(_one_cpu_process()) if workers is None else workers


def describe_source(s: DataBenchSettings) -> dict[str, Any]:
    """Open the source once, untimed: its kind and size (and a bad source fails here, in one line)."""
    train = build_datasets(s.data, s.val_fraction).train
    if isinstance(train, ShardSplit):
        kind = "shards"
    elif train.paths is not None:
        kind = "folder"
    elif train.arrays is not None:
        kind = "embedded"
    else:
        kind = {"HFSplit": "Hugging Face dataset"}.get(type(train).__name__, type(train).__name__)
    info: dict[str, Any] = {"kind": kind, "train_images": len(train), "notes": []}
    if isinstance(train, ShardSplit):
        info["shards"] = len(train.shards)
        info["shard_files"] = list(train.shards)
    return info


def run_data_benchmark(s: DataBenchSettings, on_repeat: Callable[[str], None] | None = None,
                       on_batch: Callable[[int], None] | None = None) -> DataBenchResult:
    """Measure vitlab's training loader (and timm's) on `s.data`; see the module docstring for the protocol."""
    _check(s)
    workers = resolve_workers(s.workers)
    steps = math.ceil(s.images / s.batch_size)
    warm = max(workers, 1)
    if steps <= warm:
        raise ValueError(f"--images {s.images} makes {steps} batch(es) of {s.batch_size}; the rate is timed after "
                         f"the first {warm} (one per worker): use --images {(warm + 1) * s.batch_size} or more")
    source = describe_source(s)
    env = environment(BenchSettings(compare=s.compare))
    env.pop("precision", None)
    result = DataBenchResult(s, source, env)
    loaders: list[tuple[LoaderMeasurement, Batches, Callable[[Any], tuple[int, int | None]]]] = [
        (LoaderMeasurement("vitlab", "build_datasets + training loader", workers),
         lambda: _vitlab_batches(s, workers, steps), _vitlab_count)]
    if s.compare == "timm":
        reader, make = timm_reader(s, source, workers)
        loaders.append((LoaderMeasurement("timm", reader, workers), make, _timm_count))
    threads = torch.get_num_threads()
    try:
        for r in range(s.repeats):
            for m, make_batches, count in loaders if r % 2 == 0 else loaders[::-1]:
                run = _drain(make_batches, steps, warm, count, on_batch)
                m.runs.append(run)
                if on_repeat:
                    on_repeat(f"{m.impl} repeat {r + 1}/{s.repeats}: {run.images_per_s:.1f} img/s, first batch "
                              f"{run.first_batch_s:.2f} s")
    finally:
        torch.set_num_threads(threads)  # make_loaders sets the main process's threads as training would
    result.measurements = [m for m, _, _ in loaders]
    source.pop("shard_files", None)
    return result


def _check(s: DataBenchSettings) -> None:
    if min(s.images, s.batch_size, s.repeats, s.image_size) < 1:
        raise ValueError("--images, --batch-size, --repeats and --image-size must be positive")
    if s.workers is not None and s.workers < 0:
        raise ValueError(f"--workers must be 0 or more, not {s.workers}")
    if s.compare not in (None, "timm"):
        raise ValueError(f"--compare supports 'timm' only, not {s.compare!r}")


__all__ = ["DataBenchResult", "DataBenchSettings", "LoaderMeasurement", "LoaderRun", "run_data_benchmark"]
