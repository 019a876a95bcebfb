"""How far int8 (and bf16) inference moves a trained model's held-out predictions from float32's (issue 34).

    python benchmarks/precision_agreement.py RUN_OR_WEIGHTS --data DATA [--split val] [--forms int8,bf16]

Every image of the split goes through the pre-processing `vitlab eval` uses (the weights' recorded eval resize),
then through the model in float32 and in each form as `vitlab eval --precision FORM` prepares it
(`vitlab.runtime.session.open_session`, under its autocast). Prints per form: top-1 against the labels, top-1
agreement with float32, and the logits' distance from float32's (relative Frobenius norm over the split). bf16 is
emulated (and very slow) on a CPU without amx_bf16/avx512_bf16; its numbers are the same either way.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from vitlab.data import EvalTransform, ShardSampler, TransformedSplit, load_split, make_loader, normalize
from vitlab.models import eval_resize_of
from vitlab.runtime import open_session

CPU = torch.device("cpu")


def split_batches(model, data: str, split: str, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(normalised images, labels) batches of the split, decoded once and shared by every form."""
    names = getattr(model, "class_names", None)
    images = load_split(data, split, list(names) if names else None)
    transform = EvalTransform(model.config.image_size, eval_resize_of(model))
    loader = make_loader(TransformedSplit(images, transform), ShardSampler(len(images), batch_size), 0, CPU)
    out = []
    for batch in loader:
        valid = batch["valid"]
        x = normalize(batch["images"], model.config.mean, model.config.std)[valid]
        out.append((x, batch["labels"][valid]))
    return out


@torch.no_grad()
def logits_of(model, form: str, batches) -> tuple[torch.Tensor, float]:
    session = open_session(copy.deepcopy(model), device=CPU, precision=form)
    start = time.perf_counter()
    with session.autocast():
        logits = torch.cat([session.model(x).float() for x, _ in batches])
    return logits, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("weights", help="anything vitlab.load reads (a run directory, a weights file)")
    ap.add_argument("--data", required=True, help="the dataset the model was trained for (as vitlab eval --data)")
    ap.add_argument("--split", default="val", choices=["val", "train"])
    ap.add_argument("--forms", default="int8", help="comma-separated: int8, bf16 (default int8)")
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()

    model = open_session(args.weights, device=CPU, precision="fp32").model
    batches = split_batches(model, args.data, args.split, args.batch_size)
    labels = torch.cat([y for _, y in batches])
    reference, seconds = logits_of(model, "fp32", batches)
    reference_top1 = (reference.argmax(-1) == labels).float().mean().item()
    print(f"{args.weights} on {args.data} {args.split}: {len(labels)} held-out images, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"  fp32: top-1 {reference_top1:.2%} ({seconds:.1f} s)")
    for form in [f.strip() for f in args.forms.split(",") if f.strip()]:
        logits, seconds = logits_of(model, form, batches)
        top1 = (logits.argmax(-1) == labels).float().mean().item()
        same = (logits.argmax(-1) == reference.argmax(-1))
        distance = ((logits - reference).norm() / reference.norm()).item()
        print(f"  {form}: top-1 {top1:.2%}; agreement with fp32 {same.float().mean().item():.2%} "
              f"({int(same.sum())} of {len(same)}); logits {distance:.2%} from fp32's ({seconds:.1f} s)")


if __name__ == "__main__":
    main()
