"""The process's memory allocator: one tuning of glibc's malloc for every verb that computes, and which allocator
the process runs with.

glibc maps every allocation above 32 MB afresh with mmap and returns freed heap to the OS, so the large
activations of every layer are page-faulted in again on every step, a cost that varies from run to run. Serving
all allocations from a heap that is never trimmed removes that cost and its noise (BENCHMARKS.md "Protocol" and
"The allocator"). `vitlab train`, `finetune`, `eval`, `predict`, `fewshot`, `analyze`, `experiment`, `bench` and
`vitlab.fit` tune it at their start; `VITLAB_MALLOC_TUNING=0` in the environment keeps glibc's defaults. A
preloaded allocator (tcmalloc or jemalloc through LD_PRELOAD) is left as it is.
"""

from __future__ import annotations

import ctypes
import os

TUNING_ENV = "VITLAB_MALLOC_TUNING"
PRELOADABLE = ("tcmalloc", "jemalloc")  # allocators that replace glibc's malloc when preloaded
GLIBC_TUNED = "glibc tuned (no mmap, no trim)"

_tuned = False


def tune_malloc() -> bool:
    """Process-wide and irreversible: glibc serves every allocation from its heap (no mmap of large blocks) and never
    trims it. False where the C library is not glibc."""
    global _tuned
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    ok = bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))
    _tuned = _tuned or ok
    return ok


def tuning_wanted() -> bool:
    """False when the environment opts out (`VITLAB_MALLOC_TUNING` set to 0, false, no or off)."""
    return os.environ.get(TUNING_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def tune_for_compute() -> bool:
    """The tuning every computing verb starts with: glibc's malloc tuned unless the environment opts out or another
    allocator is preloaded (it has settings of its own). Returns whether glibc is tuned now."""
    if tuning_wanted() and preloaded_allocator() is None:
        tune_malloc()
    return _tuned


def preloaded_allocator(maps_text: str | None = None) -> str | None:
    """tcmalloc or jemalloc when one is mapped into this process (the text of /proc/self/maps, or `maps_text` for
    tests); None otherwise, and where /proc is absent."""
    if maps_text is None:
        try:
            with open("/proc/self/maps") as f:
                maps_text = f.read()
        except OSError:
            return None
    for line in maps_text.splitlines():
        library = os.path.basename(line.split()[-1]) if line.split() else ""
        for name in PRELOADABLE:
            if library.startswith(f"lib{name}"):
                return name
    return None


def allocator_name(maps_text: str | None = None) -> str:
    """The allocator this process runs with, in words: a preloaded one, glibc tuned, or glibc's defaults."""
    preloaded = preloaded_allocator(maps_text)
    if preloaded:
        return f"{preloaded} (preloaded)"
    return GLIBC_TUNED if _tuned else "glibc default"
