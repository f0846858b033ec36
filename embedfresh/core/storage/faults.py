"""Fault points: every write the artifact store makes, and every statement a job commits
to the vector index, numbered and named, so the reliability suite can kill a job right
after any one of them.

Off unless one of two environment variables is set (the suite sets them on the job
processes it starts; nothing in the product does):

``EMBEDFRESH_WRITES_LOG=/path/file``
    Append one line per write of this process: ``<n> <op> <path>``, where ``n`` counts
    the process's writes from 1, ``op`` is ``write`` (an object written whole), ``put``
    (a local file uploaded), ``cas`` (a compare-and-swap), ``remove``, or ``db`` (a
    transaction committed to the vector index: a shard's rows with its ledger row, the
    HNSW build, a live view's switch, a table dropped; ``path`` is then
    ``index/<table>/<what>``), and ``path`` is relative to the store's root. A clean run's log is the list of the job's points: a
    write added to a job joins the list by itself.
``EMBEDFRESH_FAULT_POINT="<n> <op> <path>"``
    SIGKILL this process right after its ``n``-th write, which must be the write named
    (a point that drifted, because the job's writes changed, raises instead of killing
    somewhere else).

A point is logged before the kill, so the killed run's log ends with it.

Under torchrun with several ranks (``WORLD_SIZE`` > 1) each rank counts its own writes
and its points are named ``rank<R>: <n> <op> <path>`` (``RANK``): the ranks of one job
share one log, and a point names the rank it kills (a sharded checkpoint's shards are
written by every rank).
"""

from __future__ import annotations

import os
import signal

WRITES_LOG = "EMBEDFRESH_WRITES_LOG"
FAULT_POINT = "EMBEDFRESH_FAULT_POINT"

_count = 0
_pid = 0


def point_name(n: int, op: str, rel: str, rank: int | None = None) -> str:
    """The point's name: what the log records and :data:`FAULT_POINT` takes; ``rank``:
    this process's global rank when it is one of several (:func:`process_rank`)."""
    return f"{_rank_prefix(rank)}{n} {op} {rel.strip('/')}"


def _rank_prefix(rank: int | None) -> str:
    return "" if rank is None else f"rank{rank}: "


def process_rank() -> int | None:
    """This process's global rank under a launch of several ranks, else None."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return None
    return int(os.environ.get("RANK", "0") or 0)


def after_write(op: str, rel: str) -> None:
    """Called by the store right after each write it made."""
    log_path, target = os.environ.get(WRITES_LOG), os.environ.get(FAULT_POINT)
    if not log_path and not target:
        return
    global _count, _pid
    if _pid != os.getpid():  # a forked child counts its own writes
        _count, _pid = 0, os.getpid()
    _count += 1
    rank = process_rank()
    name = point_name(_count, op, rel, rank)
    if log_path:
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(name + "\n")
    if not target:
        return
    mine = _rank_prefix(rank)
    if not target.startswith(mine):  # another rank's point is not this process's business
        return
    n, _, _ = target.removeprefix(mine).partition(" ")
    if int(n) != _count:
        return
    if target != name:
        raise RuntimeError(f"fault point {target!r} drifted: write {_count} is {name!r}")
    os.kill(os.getpid(), signal.SIGKILL)
