"""How the package reads to a newcomer, measured: the vitlab files on the call stack when `vitlab train` first
calls `optimizer.step()` (the files a reader follows from the command line to the step), the vitlab files whose
code runs before that step, the import closure of the train verb, and the package's shape.

    python benchmarks/layout.py            # prints one line per figure (recorded in BENCHMARKS.md, 'Layout')
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "vitlab"
TOP_LEVELS = 3  # below the train verb: its calls (resolve, prepare, run), theirs, and what those call


def rel(path: str) -> str | None:
    """A path inside src/vitlab as `vitlab/…`, else None."""
    try:
        return str(Path(path).resolve().relative_to(SRC.parent))
    except ValueError:
        return None


def trace_train() -> tuple[list[str], list[str], list[str], list[str], int]:
    """For a 1-step demo run through the command line: (files on the stack at the first optimizer.step(), those
    files with the files of every function they called on the way, the files of the calls in the top TOP_LEVELS
    levels of the train verb's call tree before it (the outline a reader follows: resolving the settings, building
    the run, the loop), files with code run before it, vitlab modules imported by then)."""

    from vitlab.cli import main

    ran: set[str] = set()
    top_levels: set[str] = set()  # files of the vitlab calls at most TOP_LEVELS vitlab frames below the verb
    stack_files: list[str] = []
    followed: list[str] = []
    callees: dict[int, tuple[object, set[str]]] = {}  # id(caller frame) -> (the frame, kept alive; callee files)
    imported: list[int] = []

    def profile(frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if event == "call" and (r := rel(frame.f_code.co_filename)):
            ran.add(r)
            depth, up = 1, frame.f_back  # vitlab frames between this call and the train verb's function
            while up is not None and depth <= TOP_LEVELS and not (
                    up.f_code.co_name == "_train" and rel(up.f_code.co_filename) == "vitlab/cli/train.py"):
                depth += rel(up.f_code.co_filename) is not None
                up = up.f_back
            if up is not None and depth <= TOP_LEVELS and not r.endswith("__init__.py"):
                top_levels.add(r)  # a package's __init__ runs for its lazy names: not a file a reader opens
            caller = frame.f_back
            if caller is not None and rel(caller.f_code.co_filename):
                callees.setdefault(id(caller), (caller, set()))[1].add(r)

    def on_step(optimizer, *args, **kwargs):  # noqa: ANN001
        if not stack_files:
            frame = sys._getframe(1)
            while frame is not None:
                if r := rel(frame.f_code.co_filename):
                    stack_files.append(r) if r not in stack_files else None
                    followed.extend(sorted(callees.get(id(frame), (None, set()))[1]))
                frame = frame.f_back
            sys.setprofile(None)
            imported.append(sum(1 for n in sys.modules if n.startswith("vitlab")))

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    handle = register_optimizer_step_pre_hook(on_step)
    with tempfile.TemporaryDirectory() as out:
        sys.setprofile(profile)
        try:
            main(["-q", "train", "--steps", "1", "--workers", "0", "--eval-every", "0", "--out", out])
        finally:
            sys.setprofile(None)
            handle.remove()
    callees.clear()
    return (list(reversed(stack_files)), sorted(set(stack_files) | set(followed)), sorted(top_levels), sorted(ran),
            imported[0])


def import_closure(module: str) -> tuple[int, int]:
    """(vitlab modules, their lines) imported by `import module` in a fresh interpreter."""
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            "print('\\n'.join(m.__file__ for n, m in sys.modules.items() "
            "if n.startswith('vitlab') and getattr(m, '__file__', None)))")
    files = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return len(files), sum(len(Path(f).read_text().splitlines()) for f in files)


def shape() -> dict[str, int]:
    modules = [p for p in SRC.rglob("*.py")]
    train = [p for p in (SRC / "train").glob("*.py") if p.name != "__init__.py"]
    loose = [p for p in SRC.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    return {"modules": len(modules), "lines": sum(len(p.read_text().splitlines()) for p in modules),
            "train modules": len(train), "loose top-level modules": len(loose)}


def public_definitions() -> int:
    count = 0
    for p in SRC.rglob("*.py"):
        for node in ast.parse(p.read_text()).body:
            defines = isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
            if defines and not node.name.startswith("_"):
                count += 1
    return count


def main() -> None:
    stack, followed, outline, ran, imported = trace_train()
    print(f"files on the stack at the first optimizer.step(): {len(stack)}: {', '.join(stack)}")
    print(f"files a reader opens following those calls (the stack and what each of its frames called): "
          f"{len(followed)}: {', '.join(followed)}")
    print(f"files of the calls in the top {TOP_LEVELS} levels below the train verb before it: {len(outline)}: "
          f"{', '.join(outline)}")
    print(f"vitlab files whose code runs before it: {len(ran)}; vitlab modules imported by then: {imported}")
    for module in ("vitlab.cli.train", "vitlab.cli"):
        n, lines = import_closure(module)
        print(f"import closure of {module}: {n} modules, {lines} lines")
    for name, value in shape().items():
        print(f"{name}: {value}")
    print(f"public top-level functions and classes: {public_definitions()}")


if __name__ == "__main__":
    main()
