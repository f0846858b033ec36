"""OpenLineage datasets of a job task: what it read and wrote, in the store and the index.

:func:`job_datasets` is pure (a job's name, its settings, what it returned ->
:class:`JobLineage`), named by the OpenLineage naming spec: an ``s3://bucket/key``
object is namespace ``s3://bucket``, name ``key``; a ``file:///path`` one is namespace
``file``, name ``/path``; an index table is namespace ``postgres://host:port``, name
``database.schema.table``. :func:`operator_lineage` wraps it in the OpenLineage
provider's ``OperatorLineage`` when that provider is installed (``None`` otherwise), for
:meth:`EmbedfreshJobOperator.get_openlineage_facets_on_complete`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from embedfresh.core import layout

#: The index's schema (:mod:`embedfresh.core.index.pgvector`; the control plane does not
#: import the index's client).
INDEX_SCHEMA = "embedfresh"

#: Summary keys whose value is the URL of something the job wrote.
OUTPUT_URL_KEYS = ("report", "manifest", "release_url")


@dataclass(frozen=True, order=True)
class DatasetRef:
    """One OpenLineage dataset: ``namespace`` (the data source) and ``name`` in it."""

    namespace: str
    name: str


@dataclass(frozen=True)
class JobLineage:
    """The datasets one job execution read and wrote, each once, in a stable order."""

    inputs: tuple[DatasetRef, ...] = field(default_factory=tuple)
    outputs: tuple[DatasetRef, ...] = field(default_factory=tuple)


def store_dataset(url: str) -> DatasetRef:
    """The dataset of a store URL (``s3://bucket/key``, ``file:///path``, a plain path)."""
    parsed = urlparse(url)
    scheme = parsed.scheme or "file"
    if scheme == "file":
        return DatasetRef("file", parsed.path.rstrip("/") or "/")
    return DatasetRef(f"{scheme}://{parsed.netloc}", parsed.path.strip("/"))


def table_dataset(location: str, table: str) -> DatasetRef | None:
    """The dataset of index table ``table`` at ``location`` (a redacted
    ``postgresql://user@host:port/db``, or ``embedded:<dir>``, the embedded server's
    ``postgres`` database on this host); ``None`` for a location of another kind."""
    if location.startswith("embedded:"):
        return DatasetRef("postgres://localhost:5432", f"postgres.{INDEX_SCHEMA}.{table}")
    parsed = urlparse(location)
    if parsed.scheme not in ("postgres", "postgresql") or not parsed.hostname:
        return None
    database = parsed.path.strip("/") or "postgres"
    return DatasetRef(
        f"postgres://{parsed.hostname}:{parsed.port or 5432}",
        f"{database}.{INDEX_SCHEMA}.{table}",
    )


def job_datasets(
    job: str, settings: Mapping[str, Any], summary: Mapping[str, Any] | None = None
) -> JobLineage:
    """What ``job``, started with ``settings`` (its config's defaults filled in), read and
    wrote; ``summary`` (what it returned) adds what only the job knew: its report, its
    manifest, its release record, the index tables it loaded or searched.

    Jobs without data of their own (health, compile, garbage collection) read and write
    nothing here beyond their report.
    """
    summary = summary or {}
    root = str(settings.get("artifact_root") or "")
    model, run_id = str(settings.get("model", "")), str(settings.get("run_id", ""))
    version = str(settings.get("version") or run_id)
    dataset, corpus = settings.get("dataset"), settings.get("corpus")
    inputs: list[DatasetRef] = []
    outputs: list[DatasetRef] = []

    def at(rel: str) -> DatasetRef:
        return store_dataset(f"{root.rstrip('/')}/{rel}")

    def tables(where: Any, table: Any) -> list[DatasetRef]:
        location = where.get("location") if isinstance(where, Mapping) else None
        found = table_dataset(str(location), str(table)) if location and table else None
        return [found] if found else []

    index = summary.get("index") if isinstance(summary.get("index"), Mapping) else {}
    table = summary.get("table") or index.get("table")
    if job in ("train", "parity") and dataset:
        inputs.append(at(f"datasets/{dataset}/train"))
        if job == "train":
            outputs.append(at(layout.model_version(model, version)))
    elif job == "evaluate":
        inputs.append(at(layout.model_version(model, version)))
        if dataset:
            inputs.append(at(layout.eval_split(str(dataset))))
    elif job == "gate":
        inputs.append(at(layout.model_version(model, version)))
    elif job == "embed" and corpus:
        inputs += [at(layout.model_version(model, version)), at(layout.corpus(str(corpus)))]
        outputs.append(at(f"{layout.embeddings_root(model)}/{version}/{corpus}"))
    elif job == "embed_verify" and corpus:
        inputs.append(at(layout.corpus(str(corpus))))
        outputs.append(at(f"{layout.embeddings_root(model)}/{version}/{corpus}"))
    elif job == "index_load" and corpus:
        inputs.append(at(f"{layout.embeddings_root(model)}/{version}/{corpus}"))
        outputs += tables(index, table)
    elif job == "search_check":
        inputs += tables(index, table)
    elif job == "release":
        for entry in (summary.get("corpora") or {}).values():
            if isinstance(entry, Mapping) and entry.get("manifest"):
                inputs.append(store_dataset(str(entry["manifest"]).rsplit("/", 1)[0]))
        outputs.append(at(layout.registry(model)))
    elif job == "rollback":
        outputs.append(at(layout.registry(model)))
    for key in OUTPUT_URL_KEYS:
        value = summary.get(key)
        if isinstance(value, str) and "://" in value:
            outputs.append(store_dataset(value))
    return JobLineage(tuple(_unique(inputs)), tuple(_unique(outputs)))


def _unique(refs: Iterable[DatasetRef]) -> list[DatasetRef]:
    return list(dict.fromkeys(refs))


def operator_lineage(lineage: JobLineage) -> Any:
    """``lineage`` as the OpenLineage provider's ``OperatorLineage``; ``None`` when the
    provider (apache-airflow-providers-openlineage) is not installed."""
    try:
        from airflow.providers.common.compat.openlineage.facet import Dataset
        from airflow.providers.openlineage.extractors import OperatorLineage
    except ImportError:
        return None
    return OperatorLineage(
        inputs=[Dataset(namespace=d.namespace, name=d.name) for d in lineage.inputs],
        outputs=[Dataset(namespace=d.namespace, name=d.name) for d in lineage.outputs],
    )
