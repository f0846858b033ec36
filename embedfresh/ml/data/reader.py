"""Reads and validates relevance examples from the artifact store.

Every problem with the data is a :class:`BadInputError` naming the partition or file
(and the row, for a bad value) and what is wrong with it, found before any training
starts: a missing, empty or misnamed partition, a wrong schema, a NaN, a label that is
not 0 or 1, a row that occurs twice (:data:`ROW_KEY`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.parquet import read_parquet
from embedfresh.core.partitions import partition_days
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.data.schema import EXAMPLE_SCHEMA, FEATURES, product_text

log = logging.getLogger(__name__)

#: What identifies a row of a training partition or of the eval split: one product
#: (``product_id``) shown for one search (``query_id``: one shopper's query, whose
#: candidates share the id). The same pair twice is one observation counted twice:
#: training weighs it double, and evaluation lists the product twice among the query's
#: candidates, which breaks its ranking metrics. Two searches with the same query text
#: have different ids and are not duplicates.
ROW_KEY = ("query_id", "product_id")


@dataclass(frozen=True)
class Examples:
    """Columns of validated examples, features already transformed for the model."""

    query_ids: np.ndarray  # int64 [n]
    product_ids: np.ndarray  # int64 [n]
    queries: list[str]
    products: list[str]
    features: np.ndarray  # float32 [n, F]
    labels: np.ndarray  # float32 [n], 0 or 1
    sources: tuple[str, ...]  # URLs of the files read

    def __len__(self) -> int:
        return len(self.labels)


def days(start: dt.date, end: dt.date) -> list[dt.date]:
    """The days of the half-open interval [start, end)."""
    if end <= start:
        raise BadInputError(f"empty data interval: end {end} is not after start {start}")
    return [start + dt.timedelta(days=i) for i in range((end - start).days)]


def read_train(store: ArtifactStore, dataset: str, start: dt.date, end: dt.date) -> Examples:
    """All training partitions of [start, end); each one must exist and hold rows, the
    partitions' folder must hold no misnamed one (:func:`partition_days`), and no row
    may occur twice in the interval (:data:`ROW_KEY`)."""
    wanted = days(start, end)
    partition_days(store, dataset)
    parts: list[tuple[str, pa.Table]] = []
    for day in wanted:
        directory = layout.dataset_partition(dataset, "train", day)
        parts += _read_directory(store, directory, f"training partition dt={day}")
    return _to_examples(parts, "training")


def read_eval(store: ArtifactStore, dataset: str) -> Examples:
    """The held-out split; validated as the training partitions are (no row twice)."""
    return _to_examples(_read_directory(store, layout.eval_split(dataset), "eval split"), "eval")


def _read_directory(store: ArtifactStore, directory: str, what: str) -> list[tuple[str, pa.Table]]:
    """``(url, table)`` of every ``*.parquet`` file of ``directory``, in name order."""
    names = [n for n in store.listdir(directory) if n.endswith(".parquet")]
    if not names:
        raise BadInputError(
            f"missing {what}: no part-*.parquet under {store.url(directory)} "
            "(generate the data or fix the data interval)"
        )
    parts = [(store.url(f"{directory}/{n}"), _read_part(store, f"{directory}/{n}")) for n in names]
    if sum(t.num_rows for _, t in parts) == 0:
        raise BadInputError(f"empty {what}: {store.url(directory)} has no rows")
    return parts


def _read_part(store: ArtifactStore, rel: str) -> pa.Table:
    return _conform(read_parquet(store, rel), store.url(rel))


def _conform(table: pa.Table, url: str) -> pa.Table:
    """Select and safely cast the schema's columns; name every mismatch at once."""
    missing = [f.name for f in EXAMPLE_SCHEMA if f.name not in table.column_names]
    wrong = []
    columns = []
    for field in EXAMPLE_SCHEMA:
        if field.name in missing:
            continue
        col = table.column(field.name)
        if col.type != field.type:
            try:
                col = col.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                wrong.append(f"{field.name} is {col.type}, expected {field.type}")
                continue
        if col.null_count:
            wrong.append(f"{field.name} has {col.null_count} nulls")
        columns.append(col)
    if missing or wrong:
        problems = []
        if missing:
            problems.append(f"missing columns {missing}")
        problems.extend(wrong)
        raise BadInputError(f"wrong schema in {url}: {'; '.join(problems)}")
    return pa.table(columns, names=[f.name for f in EXAMPLE_SCHEMA])


class _Rows:
    """Where row ``i`` of the concatenated files is: its file and its row there."""

    def __init__(self, parts: Sequence[tuple[str, pa.Table]]) -> None:
        self.urls = [url for url, _ in parts]
        self.starts = np.cumsum([0] + [t.num_rows for _, t in parts])

    def at(self, i: int) -> str:
        """``row R of URL``, R counted from 0 within the file."""
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return f"row {int(i - self.starts[k])} of {self.urls[k]}"


def _transform(name: str, kind: str, values: np.ndarray, rows: _Rows) -> np.ndarray:
    if kind == "log1p":
        negative = values < 0
        if negative.any():
            raise BadInputError(
                f"feature {name} has {int(negative.sum())} negative values, the first at "
                f"{rows.at(int(np.argmax(negative)))}; expected >= 0"
            )
        return np.log1p(values)
    if kind == "div5":
        return values / 5.0
    return values


def _check_unique(table: pa.Table, rows: _Rows, split: str) -> None:
    """No :data:`ROW_KEY` twice across the files read; else name the first repeat (in
    read order: day, file, row) and the row it repeats."""
    query_ids = table.column("query_id").to_numpy()
    product_ids = table.column("product_id").to_numpy()
    order = np.lexsort((product_ids, query_ids))  # stable: a key's rows stay in read order
    q, p = query_ids[order], product_ids[order]
    repeats = (q[1:] == q[:-1]) & (p[1:] == p[:-1])
    if not repeats.any():
        return
    later, earlier = order[1:][repeats], order[:-1][repeats]
    k = int(np.argmin(later))
    i, j = int(later[k]), int(earlier[k])
    labels = table.column("label")
    conflict = labels[i].as_py() != labels[j].as_py()
    raise BadInputError(
        f"duplicate {split} row: (query_id={int(query_ids[i])}, product_id="
        f"{int(product_ids[i])}) at {rows.at(i)} repeats {rows.at(j)}"
        f"{' with another label' if conflict else ''} ({int(repeats.sum())} duplicate rows "
        "in all); a row is one product shown for one search, identified by (query_id, "
        "product_id), so a pair must occur once: twice, it is "
        + ("trained on twice" if split == "training" else "counted twice by the metrics")
    )


def _to_examples(parts: Sequence[tuple[str, pa.Table]], split: str) -> Examples:
    table = pa.concat_tables([t for _, t in parts])
    rows = _Rows(parts)
    features = []
    for name, kind in FEATURES:
        values = table.column(name).to_numpy().astype(np.float64)
        bad = ~np.isfinite(values)
        if bad.any():
            raise BadInputError(
                f"feature {name} has {int(bad.sum())} NaN/inf values, the first at "
                f"{rows.at(int(np.argmax(bad)))}"
            )
        features.append(_transform(name, kind, values, rows))
    labels = table.column("label").to_numpy().astype(np.float32)
    not_binary = ~np.isin(labels, (0.0, 1.0))
    if not_binary.any():
        first = int(np.argmax(not_binary))
        raise BadInputError(
            f"label must be 0 or 1, got {labels[first]:g} at {rows.at(first)} "
            f"({int(not_binary.sum())} such rows)"
        )
    _check_unique(table, rows, split)
    titles = table.column("product_title").to_pylist()
    descriptions = table.column("product_description").to_pylist()
    return Examples(
        query_ids=table.column("query_id").to_numpy(),
        product_ids=table.column("product_id").to_numpy(),
        queries=table.column("query").to_pylist(),
        products=[product_text(t, d) for t, d in zip(titles, descriptions, strict=True)],
        features=np.stack(features, axis=1).astype(np.float32),
        labels=labels,
        sources=tuple(rows.urls),
    )
