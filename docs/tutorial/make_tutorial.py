"""Run the tutorial page (docs/tutorial.md) as written and refresh what it shows: each step's output
(docs/tutorial/<name>.txt, included by the page) and its pictures (docs/tutorial/*.png).

    python docs/tutorial/make_tutorial.py            # from the repository root; a few minutes on 2 CPU cores
    python docs/tutorial/make_tutorial.py DIR        # the same, leaving the run's files in DIR (new or empty)

The page's steps are its ```bash and ```python blocks, in order; a ```text block after a step whose only line is
`--8<-- "docs/tutorial/NAME.txt"` is that step's output. tests/test_docs_tutorial.py runs the same steps, read by
`steps()` below, at smaller sizes, so the page, this script and the test cannot drift apart.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAGE = HERE.parent / "tutorial.md"
PICTURES = {  # what the run writes -> the picture the page shows
    "runs/photos/curves.png": "curves.png",
    "runs/photos-eval/confusion-photos-val.png": "confusion.png",
    "runs/photos/analysis/attention_rollout.png": "attention_rollout.png",
}
MAX_PICTURE_BYTES = 100_000
_FENCE = re.compile(r"^```(\w+)\n(.*?)^```", flags=re.S | re.M)
_OUTPUT = re.compile(r'^--8<-- "docs/tutorial/([\w-]+)\.txt"$')


@dataclass
class Step:
    language: str  # "bash" or "python"
    code: str
    output: str | None  # the name of its output file (docs/tutorial/<output>.txt), if the page shows one

    def commands(self) -> list[list[str]]:
        """A bash step's `vitlab ...` commands as argument lists (comments and blank lines dropped)."""
        lines = [line.split("  #")[0].strip() for line in self.code.splitlines()]
        return [shlex.split(line) for line in lines if line and not line.startswith("#")]


def steps(page: str | None = None) -> list[Step]:
    """The page's steps in order, each with the name of the output block that follows it."""
    text = PAGE.read_text(encoding="utf-8") if page is None else page
    found: list[Step] = []
    for language, body in _FENCE.findall(text):
        if language in ("bash", "python"):
            found.append(Step(language, body, None))
        elif language == "text" and found and (match := _OUTPUT.match(body.strip())):
            found[-1].output = match.group(1)
    return found


def trim(output: str) -> str:
    """A command's console output as the page shows it: the banner's per-setting lines (indented) left out, and of
    the step lines the first two and the last one."""
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith("  ")]
    progress = [i for i, line in enumerate(lines) if re.match(r"step \d+/\d+ ", line)]
    if len(progress) > 3:
        lines[progress[2]:progress[-1]] = ["…"]
    return "\n".join(lines) + "\n"


def run_step(step: Step, cwd: Path) -> str:
    """Run one step in `cwd` as a reader would (a fresh process per command); its console output."""
    out = []
    if step.language == "python":
        commands = [[sys.executable, "-c", step.code]]
    else:
        commands = [[sys.executable, "-m", "vitlab", *argv[1:]] for argv in step.commands()]
    for argv in commands:
        proc = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"failed: {shlex.join(argv)}\n{proc.stdout[-4000:]}")
        out.append(proc.stdout)  # both streams, in the order a terminal shows them
    return "".join(out)


def shrink(src: Path, dst: Path) -> None:
    """A figure as a PNG under MAX_PICTURE_BYTES: 256-colour palette, scaled down until it fits."""
    from PIL import Image

    image = Image.open(src).convert("RGB")
    while True:
        image.quantize(256).save(dst, optimize=True)
        if dst.stat().st_size <= MAX_PICTURE_BYTES:
            return
        image = image.resize((image.width * 9 // 10, image.height * 9 // 10), Image.LANCZOS)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp)
        cwd.mkdir(parents=True, exist_ok=True)
        if any(cwd.iterdir()):
            raise SystemExit(f"{cwd} is not empty: the tutorial starts from an empty folder")
        for step in steps():
            try:
                output = run_step(step, cwd)
            except SystemExit as failed:
                if step.output is not None:
                    raise
                print(f"skipped (no output on the page): {failed}", file=sys.stderr)
                continue
            if step.output is not None:
                (HERE / f"{step.output}.txt").write_text(trim(output), encoding="utf-8")
                print(f"wrote docs/tutorial/{step.output}.txt")
        for made, name in PICTURES.items():
            shrink(cwd / made, HERE / name)
            print(f"wrote docs/tutorial/{name} ({(HERE / name).stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
