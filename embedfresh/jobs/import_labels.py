"""Import labels: ``python -m embedfresh.jobs.import_labels --set source=S --set shape=esci
--set dataset=D --set corpus=C``.

A team's relevance labels, in the shape it has (ESCI-style judgments, a BEIR / MS MARCO
folder, a click log: :mod:`embedfresh.ml.data.convert`), become the judgments of data set
``D`` (``datasets/D/judgments/part-00000.parquet`` and ``judgments.json``, marked
incomplete: docs/DATA.md), which the gate's evaluation and the search check of corpus
``C`` score on; or, with ``--set into=train --set day=YYYY-MM-DD``, that day's training
pairs of ``D`` (graded, or with ``labels=positive`` the positives alone). A ``beir`` import also writes the folder's ``corpus.jsonl`` as corpus
``C`` when the store has none (or finishes one a killed import began).

Everything is read and checked before the first write, by the rules the evaluations
read judgments with (exit 2 naming the file and a row): the source's columns and
labels, one text per query, one grade per pair, document ids of the corpus's type, and
judged documents the corpus does not hold (refused past ``max_missing``). Writes come
in an order a kill between any two leaves re-runnable: the corpus's parts, then
``judgments.json`` (incomplete), then the judgments, then the stale parts of an earlier
import are removed; the same source writes the same bytes. Writes
``runs/{model}/{run_id}/reports/import-{dataset}.json``.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import csv as pa_csv
from pyarrow import json as pa_json

from embedfresh.core import layout
from embedfresh.core.changes import change_set_names, ids_after
from embedfresh.core.cli import main_for
from embedfresh.core.config import ImportLabelsConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.parquet import read_parquet_bytes
from embedfresh.core.shards import list_parts, read_corpus_shard
from embedfresh.core.storage import ArtifactStore, sha256_bytes
from embedfresh.ml.data import convert
from embedfresh.ml.data.generate import parquet_bytes
from embedfresh.ml.data.judgments import SPEC, check_judgments, write_spec

log = logging.getLogger("embedfresh.jobs.import_labels")

#: Columns read as strings from CSV and JSON whatever they look like: ids keep their
#: text (``"007"`` is not 7) until the converter decides their type, and a query or
#: text that looks like a number stays what was typed (``"0042"``, ``"1.50"``).
STRING_COLUMNS = ("query_id", "product_id", "doc_id", "query-id", "corpus-id", "_id",
                  "query", "text", "title", "event", "esci_label", "split", "product_locale")  # fmt: skip


def import_labels(cfg: ImportLabelsConfig) -> dict[str, Any]:
    """Convert, check, then write the judgments (and a BEIR collection's corpus)."""
    store = ArtifactStore(cfg.artifact_root)
    source = _source(cfg)
    corpus_rel = layout.corpus(cfg.corpus)
    existing = list_parts(store, corpus_rel)
    collection = None
    if cfg.shape == "beir":
        collection = convert.beir_corpus(source.table("corpus.jsonl"), source.url("corpus.jsonl"))
        if not _ours(store, corpus_rel, existing, collection, cfg.corpus_shard_rows):
            log.info("corpus %s exists: its own ids are judged, %s is not written",
                     store.url(corpus_rel), source.url("corpus.jsonl"))  # fmt: skip
            collection = None
    _check_one_corpus(store, cfg)
    corpus_ids = _corpus_ids(store, cfg.corpus, existing, collection)
    id_type = None if corpus_ids is None else _id_type(corpus_ids)
    converted = _convert(cfg, source, id_type)
    table, where = converted.table, converted.where
    judged = check_judgments(
        cfg.dataset, table, where, {"corpus": cfg.corpus}, id_type, converted.rows
    )
    missing = _missing(converted, corpus_ids, cfg.max_missing)

    if collection is not None:
        _write_corpus(store, corpus_rel, collection, cfg)
    if cfg.into == "train":
        _declare_corpus(store, cfg)
        written = _write_train(store, cfg, table)
    else:
        _write_judgments(store, cfg, table)
    report = {
        "status": "ok",
        "source": source.url(""),
        "shape": cfg.shape,
        "dataset": cfg.dataset,
        "into": cfg.into,
        **(
            {"day": str(cfg.day), "labels": cfg.labels, "pairs": written}
            if cfg.into == "train"
            else {}
        ),  # fmt: skip
        "corpus": cfg.corpus,
        # What the store holds, not what this attempt wrote: a re-run reports the same.
        "corpus_from_source": collection is not None,
        "corpus_parts": len(list_parts(store, corpus_rel)),
        "rows": table.num_rows,
        "queries": int(len(np.unique(table.column("query_id").to_numpy()))),
        "scorable_queries": len(judged),
        "grades": {
            str(g): int(n)
            for g, n in zip(
                *np.unique(table.column("grade").to_numpy(), return_counts=True), strict=True
            )
        },  # fmt: skip
        "query_ids_hashed": "query_ref" in table.column_names,
        "missing_from_corpus": missing,
    }
    store.write_json(layout.report(cfg.model, cfg.run_id, f"import-{cfg.dataset}"), report)
    return report


class _Source:
    """The source's files, read as Arrow tables by their extension."""

    def __init__(self, root: str, name: str | None) -> None:
        self.store, self.name = ArtifactStore(root), name

    def url(self, rel: str) -> str:
        return self.store.url(rel or (self.name or ""))

    def table(self, rel: str = "") -> pa.Table:
        rel = rel or (self.name or "")
        url = self.url(rel)
        if not self.store.exists(rel):
            raise BadInputError(f"{url} does not exist")
        data = self.store.read_bytes(rel)
        suffix = Path(rel).suffix.lower()
        try:
            if suffix == ".parquet":
                return read_parquet_bytes(data, url)
            if suffix in (".csv", ".tsv"):
                return pa_csv.read_csv(
                    io.BytesIO(data),
                    parse_options=pa_csv.ParseOptions(
                        delimiter="\t" if suffix == ".tsv" else ",",
                        quote_char=False if suffix == ".tsv" else '"',
                    ),
                    convert_options=pa_csv.ConvertOptions(
                        column_types={c: pa.string() for c in STRING_COLUMNS}
                    ),
                )
            if suffix in (".jsonl", ".json"):
                return _json_lines(data)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise BadInputError(f"{url} is not readable as {suffix[1:]}: {e}") from e
        raise BadInputError(f"{url}: expected a .parquet, .csv, .tsv or .jsonl file")


def _json_lines(data: bytes) -> pa.Table:
    """JSON Lines with the string columns as strings (a number is read as its text)."""
    table = pa_json.read_json(io.BytesIO(data))
    for name in STRING_COLUMNS:
        if name in table.column_names and not pa.types.is_string(table.column(name).type):
            index = table.column_names.index(name)
            table = table.set_column(index, name, pc.cast(table.column(name), pa.string()))
    return table


def _source(cfg: ImportLabelsConfig) -> _Source:
    url = cfg.source if "://" in cfg.source else Path(cfg.source).expanduser().resolve().as_uri()
    url = url.rstrip("/")
    if cfg.shape == "beir":
        return _Source(url, None)
    root, _, name = url.rpartition("/")
    return _Source(root, name)


def _convert(cfg: ImportLabelsConfig, source: _Source, id_type: str | None) -> convert.Converted:
    """The judgments of the source, with the source row of each."""
    if cfg.shape == "esci":
        return convert.from_esci(source.table(), source.url(""), id_type, cfg.split, cfg.locale)
    if cfg.shape == "clicks":
        return convert.from_clicks(source.table(), source.url(""), id_type)
    qrels = f"qrels/{cfg.split}.tsv"
    return convert.from_beir(
        source.table("queries.jsonl"), source.table(qrels),
        (source.url("queries.jsonl"), source.url(qrels)), id_type,
    )  # fmt: skip


def _part(collection: pa.Table, index: int, rows: int) -> bytes:
    return parquet_bytes(collection.slice(index * rows, rows))


def _ours(
    store: ArtifactStore, rel: str, existing: dict[int, str], collection: pa.Table, rows: int
) -> bool:
    """Whether the corpus is this import's to write: none yet, or only parts equal to
    this import's (an import killed while writing it)."""
    parts = -(-collection.num_rows // rows)
    return all(
        index < parts
        and sha256_bytes(store.read_bytes(f"{rel}/{name}"))
        == sha256_bytes(_part(collection, index, rows))
        for index, name in existing.items()
    )


def _write_corpus(
    store: ArtifactStore, rel: str, collection: pa.Table, cfg: ImportLabelsConfig
) -> None:
    """The collection's parts the corpus lacks, one at a time (an earlier attempt's are
    kept: :func:`_ours` found them equal)."""
    written = 0
    for index in range(-(-collection.num_rows // cfg.corpus_shard_rows)):
        part = f"{rel}/{layout.part_name(index)}"
        if not store.exists(part):
            store.write_bytes(part, _part(collection, index, cfg.corpus_shard_rows))
            written += 1
    log.info("corpus %s: %d texts, %d parts written now", store.url(rel),
             collection.num_rows, written)  # fmt: skip


def _corpus_ids(
    store: ArtifactStore, corpus: str, existing: dict[int, str], collection: pa.Table | None
) -> np.ndarray | None:
    """The ids of the corpus judged: the collection this import writes, else the
    store's snapshot with its change sets applied; None when there is none (the
    judgments then keep the ids as the source has them)."""
    if collection is not None:
        return collection.column("id").to_numpy(zero_copy_only=False)
    if not existing:
        return None
    rel = layout.corpus(corpus)
    ids = np.concatenate(
        [read_corpus_shard(store, f"{rel}/{name}")[0] for name in existing.values()]
    )
    return ids_after(store, corpus, ids, change_set_names(store, corpus), _id_type(ids))


def _id_type(ids: np.ndarray) -> str:
    return "int64" if np.issubdtype(ids.dtype, np.integer) else "string"


def _missing(converted: convert.Converted, corpus_ids: np.ndarray | None, allowed: int) -> int:
    """Judged documents the corpus does not hold: counted, refused past ``allowed``."""
    if corpus_ids is None:
        log.warning("no corpus to check the judged documents against: an id it lacks is "
                    "left out of the evaluations, counted in their reports")  # fmt: skip
        return 0
    docs = converted.table.column("doc_id").to_numpy(zero_copy_only=False)
    absent = ~np.isin(docs, corpus_ids)
    count = int(absent.sum())
    if count > allowed:
        first = int(np.argmax(absent))
        raise BadInputError(
            f"{converted.where}: {count} judged documents are not in the corpus, the first "
            f"{docs[first]!r} at row {int(converted.rows[first])} (max_missing={allowed}): "
            "such a document can never be found; fix the ids, or raise max_missing to "
            "accept them"
        )
    if count:
        log.warning("%d judged documents are not in the corpus (max_missing %d): they "
                    "are left out of the evaluations", count, allowed)  # fmt: skip
    return count


def _check_one_corpus(store: ArtifactStore, cfg: ImportLabelsConfig) -> None:
    """A data set's judgments and its training pairs name documents of one corpus: an
    import naming another than the data set already has is refused."""
    other = f"{layout.judgments(cfg.dataset)}/{SPEC}" if cfg.into == "train" else None
    if cfg.into == "judgments":
        other = layout.dataset_declaration(cfg.dataset)
    named = store.read_json(other).get("corpus") if store.exists(other) else None
    if named and named != cfg.corpus:
        what = "judged on" if cfg.into == "train" else "trained on pairs of"
        raise BadInputError(
            f"data set {cfg.dataset!r} is {what} corpus {named!r}: its {cfg.into} must name "
            f"that corpus's documents, not {cfg.corpus!r} (--set corpus={named})"
        )


def _declare_corpus(store: ArtifactStore, cfg: ImportLabelsConfig) -> None:
    """The data set's ``dataset.json`` names the corpus its pairs' ``doc_id`` are of (its
    features, if it declares any, kept)."""
    rel = layout.dataset_declaration(cfg.dataset)
    declaration = store.read_json(rel) if store.exists(rel) else {}
    if declaration.get("corpus") != cfg.corpus:
        store.write_json(rel, {**declaration, "corpus": cfg.corpus})


def _write_train(store: ArtifactStore, cfg: ImportLabelsConfig, table: pa.Table) -> int:
    """The labels as the training pairs of ``cfg.day``, one part: the source's own query
    ids (strings stay strings), ``graded`` with their grade, ``positive`` the pairs
    graded above 0 without one. Returns the pairs written."""
    if cfg.labels == "positive":
        table = table.filter(pc.greater(table.column("grade"), 0)).drop_columns(["grade"])
    if "query_ref" in table.column_names:  # the source's string ids, not their keys
        refs = table.column("query_ref")
        table = table.drop_columns(["query_id", "query_ref"]).add_column(0, "query_id", refs)
    url = _replace_parts(store, layout.dataset_partition(cfg.dataset, "train", cfg.day), table)
    log.info("wrote %d %s training pairs of %s (%s)", table.num_rows, cfg.labels,
             cfg.dataset, url)  # fmt: skip
    return table.num_rows


def _write_judgments(store: ArtifactStore, cfg: ImportLabelsConfig, table: pa.Table) -> None:
    """The spec first (these labels are incomplete: an older ``complete`` never covers
    them), then the judgments as one part, then the parts of an earlier import."""
    write_spec(store, cfg.dataset, complete=False, corpus=cfg.corpus)
    url = _replace_parts(store, layout.judgments(cfg.dataset), table)
    log.info("wrote %d judgments of %s (%s)", table.num_rows, cfg.dataset, url)


def _replace_parts(store: ArtifactStore, directory: str, table: pa.Table) -> str:
    """``table`` as the one part of ``directory`` (sorted by query and document: the same
    labels, the same bytes), then the parts of an earlier import removed; its URL."""
    table = table.sort_by([("query_id", "ascending"), ("doc_id", "ascending")])
    name = layout.part_name(0)
    store.write_bytes(f"{directory}/{name}", parquet_bytes(table))
    for stale in store.listdir(directory):
        if stale.endswith(".parquet") and stale != name:
            log.info("removing %s of an earlier import", store.url(f"{directory}/{stale}"))
            store.remove(f"{directory}/{stale}")
    return store.url(f"{directory}/{name}")


if __name__ == "__main__":
    main_for("import_labels", ImportLabelsConfig, import_labels)
