"""Top-k classes of image files with trained weights: the library side of `vitlab predict`.

Images are decoded exactly (as `vitlab eval` and timm decode them) and classified in batches. An image named on
the command line that cannot be read is an error; one found inside a folder is skipped with a warning, as `vitlab
eval` skips it, so that one broken file does not stop a folder of thousands. Results can be written as CSV or JSON
(`prediction_files`)."""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import UnidentifiedImageError

from vitlab.data import EvalTransform, normalize
from vitlab.data.folder import IMAGE_EXTENSIONS, walk
from vitlab.data.sources import DECODE_ERRORS, decode_rgb
from vitlab.errors import DataError
from vitlab.files.reading import special_kind
from vitlab.models.timm_compat import eval_resize_of
from vitlab.progress import printable
from vitlab.progress import progress as progress_bar
from vitlab.runtime.compiling import CompileChoice
from vitlab.runtime.precision import Precision
from vitlab.runtime.session import InferenceSession, compile_session, open_session

NOT_AN_IMAGE = f"not an image file name ({', '.join(IMAGE_EXTENSIONS)})"


def expand_images(paths: list[str | Path]) -> tuple[list[str], list[dict[str, str]]]:
    """Image files as given, each folder replaced by the images under it (sorted, any depth), and every other entry
    under a folder with why it is left out (`{"image", "reason"}`): a name without an image extension, a broken
    symbolic link, a FIFO, socket or device (never opened: a FIFO would block), a link to a folder (not followed: a
    loop would never end). Nothing under a folder goes unmentioned."""
    images: list[str] = []
    left_out: list[dict[str, str]] = []
    for path in map(Path, paths):
        if not path.is_dir():
            images.append(str(path))
            continue
        found, skipped = _walk(path)
        if not found:
            raise DataError(f"{printable(str(path))} is a folder without images ({', '.join(IMAGE_EXTENSIONS)})"
                            + (f"; it holds {len(skipped):,} other entries" if skipped else "")
                            + "; pass image files or a folder that holds some")
        images += found
        left_out += skipped
    return images, left_out


def _walk(folder: Path) -> tuple[list[str], list[dict[str, str]]]:
    found, skipped = [], []
    for root, dirs, files in walk(folder):
        dirs.sort()
        for name in list(dirs):
            if os.path.islink(os.path.join(root, name)):
                dirs.remove(name)
                skipped.append({"image": os.path.join(root, name), "reason": "a link to a folder, not followed; "
                                "name it to predict what it holds"})
        for name in sorted(files):
            path = os.path.join(root, name)
            why = _not_an_image(path)
            if why is None:
                found.append(path)
            else:
                skipped.append({"image": path, "reason": why})
    return sorted(found), sorted(skipped, key=lambda entry: entry["image"])  # one order, whatever the file system's


def _not_an_image(path: str) -> str | None:
    """Why a folder entry is not predicted, None for an image file to read."""
    if Path(path).suffix.lower() not in IMAGE_EXTENSIONS:
        return NOT_AN_IMAGE
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        return "a broken symbolic link" if os.path.islink(path) else f"cannot be listed: {err.strerror}"
    return None if stat.S_ISREG(mode) else f"{special_kind(mode)}, not a regular file"


log = logging.getLogger("vitlab")


@dataclass
class Predictions:
    """What `predict_images` did: one result per image read (`image`, `top`: class, index, probability), the
    images skipped with why, and the time from the first decode to the last prediction."""

    results: list[dict[str, Any]]
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"image": path, "reason": "OSError: ..."}
    left_out: int = 0  # the first entries of `skipped`: what a folder holds besides image files
    seconds: float = 0.0
    precision: Precision | None = None
    compiled: CompileChoice | None = None  # whether the model was compiled, and why

    @property
    def images_per_second(self) -> float:
        return len(self.results) / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """'predicted 997 images, skipped 3 unreadable, in 12.3 s: 81.1 img/s'; entries of a folder that are not
        images are counted apart: 'skipped 2 unreadable and 5 not images'."""
        listed = self.left_out
        others = f" and {listed:,} not image{'s' if listed != 1 else ''}" if listed else ""
        return (f"predicted {len(self.results):,} image{'s' if len(self.results) != 1 else ''}, skipped "
                f"{len(self.skipped) - listed:,} unreadable{others}, in {self.seconds:.1f} s: "
                f"{self.images_per_second:.1f} img/s")


def predict(weights: str | Path, images: list[str], top_k: int | None = None, device: str = "auto",
            precision: str = "auto", batch_size: int = 32, compile: bool | str = "auto",
            session: InferenceSession | None = None) -> list[dict[str, Any]]:
    """`vitlab predict`'s results: for each image read (a folder: every image under it), the top-k classes with
    softmax probabilities. See `predict_images` for the rules; this returns its `results`."""
    return predict_images(weights, images, top_k, device, precision, batch_size, compile, session).results


@torch.no_grad()
def predict_images(weights: str | Path, images: list[str], top_k: int | None = None, device: str = "auto",
                   precision: str = "auto", batch_size: int = 32, compile: bool | str = "auto",
                   session: InferenceSession | None = None) -> Predictions:
    """For each image (a folder: every image under it), the top-k classes with softmax probabilities, computed
    `batch_size` images at a time. `top_k` None: 5, or all classes of a model with fewer; a given `top_k` above
    the class count shows all of them, with a warning. `precision`: auto, fp32, bf16 or int8
    (vitlab.runtime.precision; the choice is logged). `compile`: auto, on or off (True / False): the model compiled
    with frozen weights, auto deciding from the number of images (`compile_session`; the choice is logged and in
    the result). A named file that cannot be read is a DataError; an unreadable file under a folder is skipped with
    a warning (DataError if nothing could be read). `session`: one already open on `weights` (an ONNX file's,
    `deploy.onnx_serve`), used instead of opening one."""
    session = session or open_session(weights, device=device, precision=precision, compile=compile)
    model, dev, chosen, names = session.model, session.device, session.precision, list(session.class_names)
    log.info("precision %s (%s)", chosen.name, chosen.reason)
    named = {str(p) for p in images if not Path(p).is_dir()}
    paths, left_out = expand_images(images)
    session = compile_session(session, compile, len(paths))
    model = session.model
    log.info("compile %s (%s)", session.compiled.name, session.compiled.reason)
    if top_k is None:
        top_k = min(5, len(names))
    elif top_k > len(names):
        log.warning("top-k %d is more than the model's %d classes: showing all %d", top_k, len(names), len(names))
    transform = EvalTransform(model.config.image_size, eval_resize_of(model))
    out = Predictions([], precision=chosen, compiled=session.compiled)
    _report_left_out(left_out)
    out.skipped, out.left_out = list(left_out), len(left_out)
    start = time.perf_counter()
    batches = [paths[lo : lo + batch_size] for lo in range(0, len(paths), batch_size)]
    for batch in progress_bar(batches, desc="predict", unit="batch"):
        arrays, kept = _decode_batch(batch, transform, named, out.skipped)
        if not kept:
            continue
        x = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).to(dev)  # (N, 3, H, W) uint8
        with session.autocast():
            logits = model(normalize(x, model.config.mean, model.config.std))
        probs = logits.float().softmax(-1)
        finite = torch.isfinite(probs).all(-1)
        if not finite.all():
            path = kept[int((~finite).nonzero()[0])]
            raise ValueError(f"the model's output for {printable(path)} is not finite (NaN or inf); check the "
                             "weights")
        top = probs.topk(min(top_k, probs.shape[-1]))
        for path, values, indices in zip(kept, top.values.tolist(), top.indices.tolist(), strict=True):
            out.results.append({"image": path, "top": [{"class": names[j], "index": int(j), "probability": float(p)}
                                                       for p, j in zip(values, indices, strict=True)]})
    out.seconds = time.perf_counter() - start
    if not out.results:
        first = out.skipped[out.left_out]
        raise DataError(f"none of the {len(paths)} images could be read (first: {printable(first['image'])}: "
                        f"{printable(first['reason'])}); check the files")
    return out


def _decode_batch(batch: list[str], transform: EvalTransform, named: set[str], skipped: list[dict[str, str]]
                  ) -> tuple[list[np.ndarray], list[str]]:
    """The batch's images through the evaluation transform, and their paths; unreadable ones appended to `skipped`
    with a warning, or a DataError for a file the user named."""
    arrays, kept = [], []
    for path in batch:
        try:
            arrays.append(transform(decode_rgb(path)))
        except (FileNotFoundError, *DECODE_ERRORS) as err:
            reason = _reason(err)
            if path in named:
                raise DataError(f"cannot read image {printable(path)}: {printable(reason)}") from None
            log.warning("skipping unreadable image %s (%s)", printable(path), printable(reason))
            skipped.append({"image": path, "reason": reason})
            continue
        kept.append(path)
    return arrays, kept


def _report_left_out(left_out: list[dict[str, str]]) -> None:
    """A warning for each entry that is not a regular image file (few, and each a surprise), one line for the
    files whose names are not images (often many: notes, sidecar files)."""
    names = [e["image"] for e in left_out if e["reason"] == NOT_AN_IMAGE]
    for entry in left_out:
        if entry["reason"] != NOT_AN_IMAGE:
            log.warning("skipping %s (%s)", printable(entry["image"]), entry["reason"])
    if names:
        shown = ", ".join(printable(Path(n).name) for n in names[:3]) + (", …" if len(names) > 3 else "")
        log.warning("left out %d file%s whose names are %s: %s", len(names), "s" if len(names) != 1 else "",
                    NOT_AN_IMAGE, shown)


def _reason(err: BaseException) -> str:
    """Why a file could not be read, in one line: Pillow names an unidentified file by its descriptor."""
    if isinstance(err, UnidentifiedImageError):
        return "UnidentifiedImageError: not an image format Pillow can decode"
    return f"{type(err).__name__}: {err}"
