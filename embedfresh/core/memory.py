"""How much memory this process holds: what jobs report as ``peak_rss_mib``. Torch-free."""

from __future__ import annotations

import ctypes
import resource
import sys


def rss_mib() -> tuple[float, float]:
    """This process's resident memory now and its peak so far (MiB).

    The peak is what a memory request (a Batch job definition's, a pod's) must cover. The
    memory now, read after a unit of work is done, is what a leak moves: the peak hides
    one until it outgrows the work's transient memory (measured 2026-11-27 in the embed
    job: ~1 KiB a row kept for 20 shards of 1,000 rows raised the peak by 0.3 MiB and the
    memory after a commit by ~30).

    On Linux these are ``VmRSS`` and ``VmHWM`` of ``/proc/self/status``, this process's
    own address space. ``ru_maxrss`` is not: exec carries the parent's high-water mark
    into it, so a job started by an 800 MiB process (a test runner, an Airflow worker)
    reads at least 800 MiB whatever it uses (measured 2026-11-27: 813 against 13 MiB for
    the same child). A job forked from the fork server starts with the server's pages
    mapped and counts them either way. Elsewhere both are ``ru_maxrss``."""
    found: dict[str, float] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                key = line.split(":", 1)[0]
                if key in ("VmRSS", "VmHWM"):
                    found[key] = int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    if len(found) == 2:
        return found["VmRSS"], found["VmHWM"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = peak / 1024 / 1024 if sys.platform == "darwin" else peak / 1024  # bytes / KiB
    return peak, peak


MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024
"""Blocks of this size and more are mapped on their own (see :func:`return_freed_tensors`)."""
_M_MMAP_THRESHOLD = -3  # <malloc.h>


def return_freed_tensors() -> bool:
    """Keep glibc's malloc mapping every block of 4 MiB or more on its own, so that a
    freed activation's memory goes back to the system at once. True when set.

    glibc starts at a 128 KiB threshold but raises it (up to 32 MiB) each time such a block
    is freed; from then on activations come from the heap, and a step whose tensors have
    other lengths than the last one's cannot reuse the holes they left. Training
    all-mpnet-base-v2's shape with batches of varying length peaked at 10.4 GiB RSS with
    the moving threshold, 6.1 GiB with it fixed at 128 KiB, 5.9 at 1 MiB and 6.75 at 4 MiB
    (1.39x weights, gradients, AdamW and one batch's activations). A low threshold costs
    small models: the tiny config trained at 225-250 samples/s with 128 KiB, 291-347 with
    1 MiB, 335-348 with 4 MiB and 332-415 unchanged (2 runs each, 2026-11-29,
    docs/BENCHMARKS.md "Training memory"). ``mallopt`` is glibc's public interface;
    elsewhere (musl, macOS) nothing is changed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False
