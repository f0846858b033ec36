"""What a release needs from a vector index: :class:`VectorIndex`, the sink interface.

A release's corpus embeddings are loaded into one table per release and corpus
(:func:`table_name`), shard by shard, each shard exactly once (a ledger in the index
itself, written in the same transaction as the shard's rows), then indexed for
approximate nearest-neighbour search. A search service reads the live release from the
store (:func:`embedfresh.core.releases.live_release`), which names the table, and queries
that table with the release's own query encoder; the index also keeps one *live view*
per model and corpus, switched right after the release moves, for readers that only
speak SQL.

Torch-free. The built-in implementation is PostgreSQL with pgvector
(:mod:`embedfresh.core.index.pgvector`); another engine (OpenSearch k-NN, say) is one
module implementing this class: docs/SEARCH.md ("Another index") lists what each method
must guarantee.
"""

from __future__ import annotations

import abc
import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from embedfresh.core.layout import safe_id

IdType = Literal["int64", "string"]

#: PostgreSQL truncates identifiers at 63 bytes; every name here stays below.
_MAX_NAME = 63


def _slug(text: str, width: int) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:width] or "x"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:12]


def table_name(model: str, release: str, corpus: str) -> str:
    """The table of ``corpus``'s vectors in ``release`` of ``model``: readable, unique
    (a digest of all three) and a valid identifier of at most 63 bytes.

    ``emb_<model>_<corpus>_<digest>``, e.g. ``emb_tiny_products_3f2a9c0d1b7e``.
    """
    for value, what in ((model, "model"), (release, "release"), (corpus, "corpus")):
        safe_id(value, what)
    name = f"emb_{_slug(model, 20)}_{_slug(corpus, 20)}_{_digest(model, release, corpus)}"
    assert len(name) <= _MAX_NAME
    return name


#: A live view's state: the table it reads (None: no view) and its generation, which
#: every switch moves (:meth:`VectorIndex.switch_live`).
LiveState = tuple[str | None, int]


def live_view_name(model: str, corpus: str) -> str:
    """The live view of ``model``'s vectors of ``corpus`` (``live_<model>_<corpus>_<digest>``)."""
    safe_id(model, "model")
    safe_id(corpus, "corpus")
    return f"live_{_slug(model, 20)}_{_slug(corpus, 20)}_{_digest(model, corpus)}"


@dataclass(frozen=True)
class TableSpec:
    """What a release's table holds: everything a second load must agree with."""

    name: str
    model: str
    release: str
    corpus: str
    version: str
    dim: int
    id_type: IdType
    manifest_sha256: str
    """sha256 of the embedding set's ``_MANIFEST.json``: the vectors this table holds."""
    rows: int
    """Rows of the embedding set (every corpus id once)."""


@dataclass(frozen=True)
class ShardLoad:
    """A shard the ledger records as loaded."""

    shard: str
    sha256: str
    rows: int


@dataclass(frozen=True)
class AppliedChange:
    """A corpus change set the ledger records as applied to a table: its bytes' sha256,
    and the store's tag of the object read (an S3 ETag: a later sync checks the set is
    unchanged with a HEAD, not a read)."""

    name: str
    sha256: str
    upserts: int
    deletes: int
    etag: str | None = None


@dataclass(frozen=True)
class AnnSettings:
    """How the approximate index is built and searched (HNSW, cosine distance)."""

    m: int = 16
    """Neighbours per node (pgvector's default)."""
    ef_construction: int = 64
    """Candidate list size while building (pgvector's default)."""
    ef_search: int = 40
    """Candidate list size while searching (pgvector's default): recall against speed."""
    maintenance_work_mem: str = "256MB"
    """Memory the build may use; a graph that does not fit builds far slower."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "m": self.m,
            "ef_construction": self.ef_construction,
            "ef_search": self.ef_search,
            "maintenance_work_mem": self.maintenance_work_mem,
        }


@dataclass(frozen=True)
class SearchResult:
    """Top-``k`` ids per query (``ids[i]`` for query ``i``, nearest first), their cosine
    distances, and each query's latency in seconds."""

    ids: list[np.ndarray]
    distances: list[np.ndarray] = field(default_factory=list)
    seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass(frozen=True)
class TableInfo:
    """A table the index's catalogue knows (:meth:`VectorIndex.tables`)."""

    name: str
    model: str
    release: str
    corpus: str
    version: str
    dim: int
    rows_loaded: int
    created_at: Any
    indexed: bool


class VectorIndex(abc.ABC):
    """One index engine reached by one connection. Methods raise
    :class:`~embedfresh.core.exit_codes.TransientError` when the engine is unreachable or
    goes away (a retry resumes) and :class:`~embedfresh.core.exit_codes.BadInputError`
    for a table that exists with other contents, or one the index did not make: nothing
    is dropped or overwritten then."""

    #: ``pgvector``, ``opensearch``, ...: recorded in the release.
    kind: str

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the index is, without credentials: recorded in the release."""

    @abc.abstractmethod
    def prepare_table(self, spec: TableSpec) -> None:
        """Create ``spec``'s table if it does not exist; accept it if it holds the same
        vectors (the same manifest, dimension and id type); refuse anything else."""

    @abc.abstractmethod
    def loaded_shards(self, table: str) -> dict[str, ShardLoad]:
        """The shards the ledger records as loaded into ``table``."""

    @abc.abstractmethod
    def load_shard(
        self, table: str, shard: str, sha256: str, ids: np.ndarray, vectors: np.ndarray
    ) -> None:
        """Load one shard's rows and record it in the ledger, in one transaction: after
        a kill the shard is either wholly loaded and recorded, or neither."""

    @abc.abstractmethod
    def applied_changes(self, table: str) -> dict[str, AppliedChange]:
        """The change sets the ledger records as applied to ``table``."""

    @abc.abstractmethod
    def apply_changes(
        self,
        table: str,
        change: AppliedChange,
        upsert_ids: np.ndarray,
        vectors: np.ndarray,
        delete_ids: np.ndarray,
    ) -> bool:
        """Upsert ``upsert_ids`` with ``vectors``, delete ``delete_ids`` (those present)
        and record ``change`` in the ledger, in one transaction; False, and nothing done,
        when the ledger holds it already."""

    @abc.abstractmethod
    def build_ann(self, table: str, settings: AnnSettings) -> bool:
        """Build the table's approximate index if it has none; True when it was built now."""

    @abc.abstractmethod
    def count(self, table: str) -> int:
        """Rows in ``table``."""

    @abc.abstractmethod
    def scan(self, table: str, rows: int = 50_000) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every row of ``table`` as ``(ids, vectors)`` batches of at most ``rows``, in id
        order: what an exact search over the table reads."""

    @abc.abstractmethod
    def vectors(self, table: str, ids: np.ndarray) -> np.ndarray:
        """The vectors of ``ids`` in ``table``, in their order.

        :raises BadInputError: an id the table does not hold."""

    @abc.abstractmethod
    def missing_ids(self, table: str, ids: np.ndarray) -> np.ndarray:
        """Those of ``ids`` that ``table`` does not hold."""

    @abc.abstractmethod
    def search(
        self, table: str, queries: np.ndarray, k: int, ef_search: int | None = None
    ) -> SearchResult:
        """Approximate top-``k`` ids by cosine distance for each row of ``queries``."""

    @abc.abstractmethod
    def switch_live(
        self, model: str, corpus: str, table: str, only_from: LiveState | None = None
    ) -> bool:
        """Point the live view of ``model`` and ``corpus`` at ``table``; True when it moved.
        Every call, even one that changes nothing, moves the view's generation.
        ``only_from``: move it only if :meth:`live_state` still reads that (a
        compare-and-swap for a repair that must never undo a newer switch)."""

    @abc.abstractmethod
    def drop_live(self, model: str, corpus: str, only_from: LiveState | None = None) -> bool:
        """Drop the live view of ``model`` and ``corpus`` (its table stays); True when
        there was one. ``only_from`` as :meth:`switch_live`'s."""

    @abc.abstractmethod
    def live_state(self, model: str, corpus: str) -> LiveState:
        """The table the live view reads (None: no view) and its generation."""

    @abc.abstractmethod
    def live_table(self, model: str, corpus: str) -> str | None:
        """The table the live view of ``model`` and ``corpus`` reads, if there is one."""

    @abc.abstractmethod
    def tables(self, model: str) -> list[TableInfo]:
        """The tables of ``model`` the index made."""

    @abc.abstractmethod
    def drop_table(self, table: str) -> bool:
        """Drop a table the index made (never a live one); True when it existed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection (and anything started for it)."""

    def __enter__(self) -> VectorIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_vectors(ids: np.ndarray, vectors: np.ndarray, dim: int) -> None:
    """Shapes a shard must have before it reaches an index (a bug otherwise)."""
    if vectors.ndim != 2 or vectors.shape[1] != dim or len(ids) != len(vectors):
        raise ValueError(
            f"a shard of {len(ids)} ids and vectors of shape {vectors.shape} for a table "
            f"of dimension {dim}"
        )


def id_type_of(ids: Sequence[Any] | np.ndarray) -> IdType:
    """``int64`` for integer ids, ``string`` for the rest (the corpus's two id types)."""
    return "int64" if np.asarray(ids).dtype.kind in "iu" else "string"
