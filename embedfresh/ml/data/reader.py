"""Reads and validates relevance examples from the artifact store.

Every problem with the data is a :class:`BadInputError` naming the partition or file
and what is wrong with it, found before any training starts.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.parquet import read_parquet
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.data.schema import EXAMPLE_SCHEMA, FEATURES, product_text

log = logging.getLogger(__name__)


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
    """All training partitions of [start, end); each one must exist and hold rows."""
    tables, sources = [], []
    for day in days(start, end):
        directory = layout.dataset_partition(dataset, "train", day)
        t, s = _read_directory(store, directory, f"training partition dt={day}")
        tables.append(t)
        sources.extend(s)
    return _to_examples(pa.concat_tables(tables), tuple(sources))


def read_eval(store: ArtifactStore, dataset: str) -> Examples:
    t, sources = _read_directory(store, layout.eval_split(dataset), "eval split")
    return _to_examples(t, tuple(sources))


def _read_directory(store: ArtifactStore, directory: str, what: str) -> tuple[pa.Table, list[str]]:
    parts = [n for n in store.listdir(directory) if n.endswith(".parquet")]
    if not parts:
        raise BadInputError(
            f"missing {what}: no part-*.parquet under {store.url(directory)} "
            "(generate the data or fix the data interval)"
        )
    tables, sources = [], []
    for name in parts:
        rel = f"{directory}/{name}"
        tables.append(_read_part(store, rel))
        sources.append(store.url(rel))
    table = pa.concat_tables(tables)
    if table.num_rows == 0:
        raise BadInputError(f"empty {what}: {store.url(directory)} has no rows")
    return table, sources


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


def _transform(name: str, kind: str, values: np.ndarray) -> np.ndarray:
    if kind == "log1p":
        if (values < 0).any():
            raise BadInputError(f"feature {name} has negative values; expected >= 0")
        return np.log1p(values)
    if kind == "div5":
        return values / 5.0
    return values


def _to_examples(table: pa.Table, sources: tuple[str, ...]) -> Examples:
    where = sources[0] if len(sources) == 1 else f"{len(sources)} files ({sources[0]}, ...)"
    features = []
    for name, kind in FEATURES:
        values = table.column(name).to_numpy().astype(np.float64)
        bad = ~np.isfinite(values)
        if bad.any():
            raise BadInputError(
                f"feature {name} has {int(bad.sum())} NaN/inf values in {where} "
                f"(first at row {int(np.argmax(bad))})"
            )
        features.append(_transform(name, kind, values))
    labels = table.column("label").to_numpy().astype(np.float32)
    if not np.isin(labels, (0.0, 1.0)).all():
        raise BadInputError(f"label must be 0 or 1 in {where}")
    titles = table.column("product_title").to_pylist()
    descriptions = table.column("product_description").to_pylist()
    return Examples(
        query_ids=table.column("query_id").to_numpy(),
        product_ids=table.column("product_id").to_numpy(),
        queries=table.column("query").to_pylist(),
        products=[product_text(t, d) for t, d in zip(titles, descriptions, strict=True)],
        features=np.stack(features, axis=1).astype(np.float32),
        labels=labels,
        sources=sources,
    )
