"""`vitlab bench`: inference and training throughput of a model, or a training data loader's (`--data`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vitlab.cli.types import batch_size, device_name, float_range, force_help, image_size, int_range, new_file, workers
from vitlab.constants import SETTING_CHOICES

WRITER = "vitlab bench"  # the mark of its --json record: the next benchmark may replace it


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure inference and training throughput, or a data loader's",
                       description="Images/s for inference and training (forward + backward + AdamW step), "
                                   "GFLOP/s from the analytic multiply-add count and its share of this "
                                   "machine's measured GEMM peak; --compare timm measures timm's equivalent "
                                   "model interleaved in the same process on the same input. With --data SRC: "
                                   "the training loader's images/s (total and per worker), time to the first "
                                   "batch (opening the source included) and decode failures; --compare timm "
                                   "times timm's loader on the same source, repeats alternating.")
    p.add_argument("--model", default="ViT-S/16", help="a name from `vitlab models` (default ViT-S/16)")
    p.add_argument("--batch-size", type=batch_size, default=32, help="images per step (default 32)")
    p.add_argument("--image-size", type=image_size, default=224, help="input size in pixels (default 224)")
    p.add_argument("--threads", type=int_range(1, 1024), help="intra-op CPU threads (default: torch's current setting)")
    p.add_argument("--repeats", type=int_range(1, 10_000), default=3,
                   help="timed repeats per implementation and mode (default 3)")
    p.add_argument("--warmup", type=int_range(0, 10_000), default=2,
                   help="untimed steps before timing, compilation happens here (default 2)")
    p.add_argument("--min-time", type=float_range(0.0, 3600.0), default=1.0,
                   help="seconds each timed repeat lasts at least (default 1)")
    p.add_argument("--compare", choices=["timm"], help="also measure this library's equivalent model")
    p.add_argument("--compile", action="store_true",
                   help="compile every model with torch.compile: inference with its weights frozen into the graph "
                        "(as eval --compile), training in the plain form (as train --compile); the compile time is "
                        "shown. Off by default: on a CPU the compilation takes longer than it saves in a benchmark's "
                        "repeats; figures in BENCHMARKS.md")
    p.add_argument("--device", type=device_name, default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"], default="auto",
                   help="what both implementations compute in, each in its fastest form (vitlab: as eval "
                        "--precision; timm: bf16 autocast); %% peak is of the same precision's GEMM, measured in the "
                        "same run. int8: inference only (the default --mode both becomes infer). Default auto: as "
                        "every verb resolves it (bf16 on CUDA and on CPUs with native bf16 for wide models)")
    p.add_argument("--attention", choices=SETTING_CHOICES["attention"], default="auto",
                   help="how vitlab's model computes attention in training (as vitlab train --attention; default "
                        "auto: as vitlab train decides it)")
    p.add_argument("--mode", choices=["infer", "train", "both"], default="both",
                   help="what to time: inference, training steps or both (default both)")
    p.add_argument("--no-latency", action="store_true",
                   help="with inference: skip the batch-1 latency (p50, p90) of the fp32, bf16 and int8 forms that is "
                        "otherwise measured after the throughput, the forms called in turn")
    p.add_argument("--onnx", metavar="FILE",
                   help="with inference: also the batch-1 latency of this vitlab-exported ONNX file in ONNX Runtime "
                        "(vitlab export WEIGHTS FILE), beside the PyTorch forms")
    p.add_argument("--no-malloc-tuning", action="store_true",
                   help="keep glibc's default of mapping large tensors afresh (page faults on every step)")
    p.add_argument("--json", metavar="OUT", type=new_file, help="also write the full result as JSON to this file")
    p.add_argument("--force", action="store_true",
                   help=force_help("--json"))
    d = p.add_argument_group("data loading (--data)")
    d.add_argument("--data", metavar="SRC", help="time the training loader on this source instead of a model: an "
                                                 "image folder, WebDataset shards or any other --data of vitlab train")
    d.add_argument("--workers", type=workers,
                   help="loader worker processes (default: as vitlab train, one fewer than the CPUs, at most 8)")
    d.add_argument("--images", type=int_range(1, 1_000_000), default=2048,
                   help="images per repeat, rounded up to whole batches (default 2048)")
    d.add_argument("--val-fraction", type=float_range(0.0, 1.0, low_open=True, high_open=True),
                   help="for a source without a validation split: hold out this share, as vitlab train does")
    p.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from vitlab.files.outputs import JSON, Kind, check_output

    if args.json:  # before the timing: a file of the user's (or the data measured) is never replaced unasked
        check_output(args.json, args.force, kind=Kind(WRITER, JSON), inputs=_inputs(args))
    if args.data is not None:
        return run_data_bench(args)
    from vitlab.bench import BenchSettings, run_benchmark

    modes = ("infer", "train") if args.mode == "both" else (args.mode,)
    if args.precision == "int8" and args.mode == "both":
        modes = ("infer",)  # there is no int8 training; --mode train with int8 is refused by the benchmark
    settings = BenchSettings(
        model=args.model, batch_size=args.batch_size, image_size=args.image_size, threads=args.threads,
        repeats=args.repeats, warmup=args.warmup, min_time=args.min_time, modes=modes, compare=args.compare,
        compile=args.compile, device=args.device, tune_malloc=not args.no_malloc_tuning, precision=args.precision,
        latency=not args.no_latency, onnx=args.onnx, attention=args.attention,
    )
    from vitlab.progress import progress, quiet

    # A bar over the timed repeats on a terminal; each repeat's img/s as a line on stderr unless -q.
    bar = progress(total=len(modes) * args.repeats * (2 if args.compare else 1), desc="bench", unit="repeat")

    def report(line: str) -> None:
        if not quiet():
            bar.write(line, file=sys.stderr)
        bar.update()

    try:
        result = run_benchmark(settings, progress=report)
    finally:
        bar.close()
    return _report(result, args.json, args.force, _inputs(args))


def _report(result: Any, json_path: str | None, force: bool = False, inputs: tuple[str, ...] = ()) -> int:
    """The table on stdout and, with --json, the result as JSON (atomic: never a half-written file), marked as
    vitlab's so that the next run may replace it (outputs.check_output)."""
    from vitlab.files.outputs import WRITTEN_BY, write_json

    print(result.table())
    if json_path:
        write_json(json_path, {WRITTEN_BY: WRITER, **result.to_dict()}, indent=2, user_named=True, force=force,
                   inputs=inputs)
    return 0


def _inputs(args: argparse.Namespace) -> tuple[str, ...]:
    """What a benchmark reads from disk: the data of a data benchmark, an ONNX file to time."""
    return tuple(path for path in (getattr(args, "data", None), getattr(args, "onnx", None)) if path)


def run_data_bench(args: argparse.Namespace) -> int:
    from vitlab.bench.data import DataBenchSettings, run_data_benchmark
    from vitlab.progress import progress, quiet

    settings = DataBenchSettings(
        data=args.data, workers=args.workers, images=args.images, image_size=args.image_size,
        batch_size=args.batch_size, repeats=args.repeats, compare=args.compare, val_fraction=args.val_fraction,
    )
    # A bar over the images served on a terminal; each repeat's img/s as a line on stderr unless -q.
    served = -(-args.images // args.batch_size) * args.batch_size
    bar = progress(total=served * args.repeats * (2 if args.compare else 1), desc="bench --data", unit="img")

    def report(line: str) -> None:
        if not quiet():
            bar.write(line, file=sys.stderr)

    try:
        result = run_data_benchmark(settings, on_repeat=report, on_batch=bar.update)
    finally:
        bar.close()
    return _report(result, args.json, args.force, _inputs(args))
