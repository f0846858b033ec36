"""The training partitions of a data set: ``datasets/{dataset}/train/dt=YYYY-MM-DD/``.

One naming rule for every reader: the train and compile jobs (through
:mod:`embedfresh.ml.data.reader`) and the control plane's wait for a partition
(:mod:`embedfresh.operators.partition`).
"""

from __future__ import annotations

import datetime as dt
import re

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore

#: A training partition's folder name: ``dt=`` and a zero-padded ISO date.
_PARTITION = re.compile(r"dt=(\d{4}-\d{2}-\d{2})")


def partition_days(store: ArtifactStore, dataset: str) -> list[dt.date]:
    """The days of ``dataset``'s training partitions, oldest first.

    Every entry of the partitions' folder must be named ``dt=YYYY-MM-DD`` with a real,
    zero-padded date: a folder the jobs would never read (``dt=2026-1-3``,
    ``dt=yesterday``, ``2026-01-03``) is a mistake, not something to skip. Names that
    start with ``.`` or ``_`` (``_SUCCESS``, ``.DS_Store``) are skipped, as Hive and
    Spark skip them.

    :raises BadInputError: naming the malformed entries.
    """
    parent = layout.train_partitions(dataset)
    found, malformed = [], []
    for name in store.listdir(parent):
        if name.startswith((".", "_")):
            continue
        day = partition_day(name)
        if day is None:
            malformed.append(name)
        else:
            found.append(day)
    if malformed:
        others = f" (and {len(malformed) - 1} more: {_named(malformed[1:])})"
        raise BadInputError(
            f"malformed training partition folder {store.url(f'{parent}/{malformed[0]}')}"
            f"{others if len(malformed) > 1 else ''}: a partition is named dt=YYYY-MM-DD, "
            "a real date zero-padded (e.g. dt=2026-01-03); rename or remove it (no job "
            "would ever read it)"
        )
    return sorted(found)


def partition_day(name: str) -> dt.date | None:
    """The day of a ``dt=YYYY-MM-DD`` folder name; None for any other name."""
    match = _PARTITION.fullmatch(name)
    if match is None:
        return None
    try:
        return dt.date.fromisoformat(match[1])
    except ValueError:  # dt=2026-02-30
        return None


def _named(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
