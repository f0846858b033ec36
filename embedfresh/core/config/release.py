"""Configs of the release side: index load, search check, release, rollback, garbage
collection and the search CLI (docs/SEARCH.md)."""

from __future__ import annotations

import getpass
import os
import re
import socket
from typing import Literal

from pydantic import Field, field_validator, model_validator

from embedfresh.core.config.base import JobConfig
from embedfresh.core.config.evaluation import MIN_QUERIES
from embedfresh.core.layout import safe_id
from embedfresh.core.settings import keep_releases

# PostgreSQL's memory units, as ``maintenance_work_mem`` takes them.
_MEMORY = re.compile(r"\d+\s*(kB|MB|GB|TB)")


class AnnConfig(JobConfig):
    """How a release's approximate index is built and searched (HNSW, cosine)."""

    hnsw_m: int = Field(default=16, ge=2, le=100)
    """HNSW neighbours per node (pgvector's default 16): more is better recall, a larger
    index and a slower build."""
    hnsw_ef_construction: int = Field(default=200, ge=4, le=1000)
    """HNSW candidate list while building (pgvector's default 64; at least 2 x hnsw_m)."""
    ef_search: int = Field(default=100, ge=1, le=1000)
    """HNSW candidate list while searching (pgvector's default 40): recall against
    latency. The search check raises it where the table needs more to be faithful
    (``max_ef_search``); the release records what its search service should use."""
    maintenance_work_mem: str = "256MB"
    """Memory the HNSW build may use (PostgreSQL units: kB, MB, GB); a graph that does
    not fit builds far slower (docs/BENCHMARKS.md, "Vector index")."""

    @field_validator("maintenance_work_mem")
    @classmethod
    def _memory(cls, v: str) -> str:
        if not _MEMORY.fullmatch(v.strip()):
            raise ValueError(f"must be a PostgreSQL memory size such as 256MB or 2GB, got {v!r}")
        return v.strip()

    @model_validator(mode="after")
    def _construction(self) -> AnnConfig:
        if self.hnsw_ef_construction < 2 * self.hnsw_m:
            raise ValueError(
                f"hnsw_ef_construction ({self.hnsw_ef_construction}) must be at least "
                f"2 x hnsw_m ({2 * self.hnsw_m}), as pgvector requires"
            )
        return self


class _ReleaseCorpusConfig(JobConfig):
    version: str | None = None
    """The model version whose embeddings go into the release; default: the run id (what
    the run's train job published)."""
    corpus: str = "products"
    """The corpus (``embeddings/{model}/{version}/{corpus}/_MANIFEST.json``, verified)."""

    @field_validator("version", "corpus")
    @classmethod
    def _segment(cls, v: str | None) -> str | None:
        return None if v is None else safe_id(v, "name")

    @property
    def target_version(self) -> str:
        return self.version or self.run_id

    def lease_unit(self, job: str) -> str:
        """Two corpora of one release load and check side by side; one corpus once."""
        return f"{job}-{self.corpus}"


class IndexLoadConfig(_ReleaseCorpusConfig, AnnConfig):
    """Loads a verified embedding set into the release's table of the vector index
    (the release is the run: ``run_id``)."""


class SearchCheckConfig(_ReleaseCorpusConfig):
    """Checks search on the release's table before it goes live (docs/SEARCH.md)."""

    dataset: str = "products"
    """Data set whose judgments (docs/DATA.md) give the queries and their graded
    documents; they must judge this corpus (``judgments.json``)."""
    min_ann_recall: float = Field(default=0.95, gt=0, le=1)
    """The index is faithful when its top 10 holds at least this share of the exact top 10
    over the same vectors, averaged over the queries (searched with the ``ef_search``
    the table was loaded with, raised up to ``max_ef_search`` where needed)."""
    max_ndcg_loss: float = Field(default=0.0005, ge=0, lt=1)
    """The most nDCG@10 the index may lose against the exact search over the same
    vectors, relative, on the judged queries (complete judgments): 0.0005 is half the
    0.1% SLA, so that what the index costs does not decide the comparison. ``ef_search``
    is raised (up to ``max_ef_search``) until it loses no more."""
    max_ef_search: int = Field(default=1000, ge=1, le=1000)
    """When the table is not faithful at the ``ef_search`` it was loaded with, the check
    doubles ``ef_search`` up to this (pgvector's most: 1000) and the release records the
    smallest that was; set it to the load's ``ef_search`` to forbid raising it."""
    regression: Literal["enforce", "report"] = "enforce"
    """``enforce``: search must be no worse than the live release's (the gate's paired
    bootstrap and 0.1% non-inferiority rule; exit 3 otherwise); ``report``: the
    comparison is reported only (a person's "promote anyway")."""
    tolerance: float = Field(default=0.001, ge=0, lt=1)
    """Relative tolerance of the comparison: 0.001 is the 0.1% quality SLA."""
    min_queries: int = Field(default=MIN_QUERIES, ge=1)
    """The fewest judged queries a PASS rests on; on fewer, INCONCLUSIVE (as the gate's
    ``min_queries``, which says why)."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    """Confidence level of the paired bootstrap interval."""
    resamples: int = Field(default=1000, ge=100)
    """Bootstrap resamples."""
    seed: int = 0
    """Seed of the bootstrap."""
    queries: int = Field(default=4000, ge=1)
    """Judged queries of the first look when this run's gate says nothing of it
    (otherwise the first look takes as many as the gate's decision did); while the
    comparison is open and the pool has more, the check looks again at twice as many,
    as the gate does (docs/GATE.md, "Looks")."""
    max_queries: int | None = Field(default=None, ge=1)
    """The most judged queries the comparison grows to; None: the whole pool."""
    min_judged_at_10: float = Field(default=0.1, ge=0, le=1)
    """With incomplete judgments, the least share of the top 10 that must be judged for
    the condensed comparison to decide; under it the check is INCONCLUSIVE (what users
    see is mostly unjudged)."""
    gate_report: str = "gate"
    """This run's quality gate decision (``reports/{gate_report}.json``): its number of
    judged queries is the first look's."""
    inconclusive_exits: bool = True
    """Whether an INCONCLUSIVE check exits with code 3 (no release). False: it writes its
    report and exits 0 with the verdict in its summary, for a run where a person decides
    (the refresh DAG's approval, docs/GATE.md); FAIL always exits 3."""

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:
        return safe_id(v, "dataset")

    @field_validator("gate_report")
    @classmethod
    def _report(cls, v: str) -> str:
        return safe_id(v, "report name")


def current_operator() -> str:
    """``user@host`` of this process: who a person's move is recorded as by default."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (a bare container)
        user = f"uid-{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


class PersonsMoveConfig(JobConfig):
    """What a person's move of the production pointer records: who and why."""

    reason: str = Field(min_length=1)
    """Why; recorded in the registry's history (required, not blank)."""
    who: str = Field(default_factory=current_operator, min_length=1)
    """Who, recorded in the registry's history; default: this process's ``user@host``
    (the Airflow DAGs pass the user who triggered the run)."""

    @field_validator("reason", "who")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v.strip()


class ReleaseConfig(JobConfig):
    """Makes the run's release live: its model version with every corpus's verified
    embedding set, index table and search check."""

    version: str | None = None
    """The model version released; default: the run id (what the run's train job
    published)."""
    corpora: list[str] = Field(default_factory=lambda: ["products"])
    """The corpora released with the model; each needs its verified embeddings, its
    loaded table and a passed search check from this run. Empty: a release without
    document vectors (said in the log, shown on the page). Every corpus of the live
    release must be here or in ``drop_corpora``."""
    drop_corpora: list[str] = Field(default_factory=list)
    """Corpora of the live release this release does not carry: their live views are
    dropped when it goes live (a reader finds no view, never the previous model's
    vectors under the new model). A live corpus in neither list is refused (exit 2)."""
    action: Literal["promote", "promote_anyway"] = "promote"
    """``promote``: only after this run's gate said PASS; ``promote_anyway``: a person's
    override of the gate (needs ``reason``; recorded with ``who``)."""
    reason: str | None = None
    """Why (``promote_anyway`` only, where it is required): recorded in the history."""
    who: str = Field(default_factory=current_operator, min_length=1)
    """Who (``promote_anyway``), recorded in the history; default this process's
    ``user@host`` (the Airflow DAG passes the user who triggered the run)."""
    gate_report: str = "gate"
    """The gate decision the release follows, ``reports/{gate_report}.json`` of this
    run: the ``report_name`` of the gate job (a run may hold several gates)."""

    @field_validator("gate_report")
    @classmethod
    def _report(cls, v: str) -> str:
        return safe_id(v, "report name")

    @field_validator("version")
    @classmethod
    def _segment(cls, v: str | None) -> str | None:
        return None if v is None else safe_id(v, "version")

    @field_validator("corpora", "drop_corpora")
    @classmethod
    def _corpora(cls, v: list[str]) -> list[str]:
        for name in v:
            safe_id(name, "corpus")
        if len(set(v)) != len(v):
            raise ValueError("corpora must not repeat a corpus")
        return v

    @field_validator("reason")
    @classmethod
    def _reason(cls, v: str | None) -> str | None:
        return (v.strip() or None) if v is not None else None  # blank: none given

    @field_validator("who")
    @classmethod
    def _who(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v.strip()

    @model_validator(mode="after")
    def _override_has_a_reason(self) -> ReleaseConfig:
        both = sorted(set(self.corpora) & set(self.drop_corpora))
        if both:
            raise ValueError(f"corpora {both} are both released and dropped")
        if self.action == "promote_anyway" and not (self.reason or "").strip():
            raise ValueError("action=promote_anyway needs a reason (recorded in the history)")
        if self.action == "promote" and self.reason:
            raise ValueError(
                "reason is for action=promote_anyway; a promotion's reason is its gate"
            )
        return self

    @property
    def target_version(self) -> str:
        return self.version or self.run_id


class RollbackConfig(PersonsMoveConfig):
    """Makes an earlier release of ``model`` live again: its model version, embedding
    sets and index tables."""

    to_release: str
    """The release to make live again: one of the releases retention keeps (listed in
    the registry's history and on the Model quality page)."""
    keep_releases: int = Field(default_factory=keep_releases, ge=1)
    """Releases retention keeps, the live one included (``$EMBEDFRESH_KEEP_RELEASES``,
    default 3): a rollback past them is refused, naming those that are kept."""

    @field_validator("to_release")
    @classmethod
    def _segment(cls, v: str) -> str:
        return safe_id(v, "to_release")


class GarbageCollectConfig(JobConfig):
    """Deletes what no kept release references: embedding sets, index tables and the
    model versions of releases past retention."""

    keep_releases: int = Field(default_factory=keep_releases, ge=1)
    """Releases kept, the live one included (``$EMBEDFRESH_KEEP_RELEASES``, default 3)."""
    grace_hours: float = Field(default=24.0, ge=0)
    """Nothing written more recently than this is deleted (a refresh may be writing it),
    nor anything under a live lease."""
    dry_run: bool = False
    """List what would be deleted; delete nothing."""


class CorpusSyncConfig(JobConfig):
    """Applies a corpus's change sets to a release's table, embedded with that release's
    own encoder (docs/SEARCH.md "Corpus changes")."""

    corpus: str = "products"
    """The corpus whose change sets (``corpora/{corpus}/changes/``) are applied."""
    release: str | None = None
    """The release whose table is brought up to date; default: the live one. A kept
    release (a rollback's target) is synced by naming it."""

    @field_validator("corpus", "release")
    @classmethod
    def _segment(cls, v: str | None) -> str | None:
        return None if v is None else safe_id(v, "name")

    def lease_unit(self, job: str) -> str:
        return f"{job}-{self.corpus}"


class IndexAttachConfig(JobConfig):
    """Attaches a release's tables at this deployment's vector index: re-attached where
    they are already (a moved store, a new DSN to the same data), else loaded there from
    the store (another PostgreSQL)."""

    release: str | None = None
    """The release; default: the live one (whose live views are switched here too)."""

    @field_validator("release")
    @classmethod
    def _segment(cls, v: str | None) -> str | None:
        return None if v is None else safe_id(v, "release")


class CorpusDiffConfig(JobConfig):
    """Turns a full snapshot of a corpus into the change set that takes the corpus (its
    snapshot and change sets so far) to it (docs/SEARCH.md "Corpus changes")."""

    corpus: str = "products"
    """The corpus (``corpora/{corpus}/``)."""
    snapshot: str
    """The new snapshot, ``corpora/{corpus}/snapshots/{snapshot}/part-NNNNN.parquet``;
    its change set is landed under the same name, so name snapshots to sort in landing
    order (a UTC time)."""

    @field_validator("corpus", "snapshot")
    @classmethod
    def _segment(cls, v: str) -> str:
        return safe_id(v, "name")


class SearchConfig(JobConfig):
    """Searches a release's table for a query string (the live release by default)."""

    query: str = Field(min_length=1)
    """The query text (the model's query prompt is put before it)."""
    corpus: str | None = None
    """The corpus searched; default: the release's only corpus (a release of several
    needs it named)."""
    release: str | None = None
    """A release id; default: the live one."""
    k: int = Field(default=10, ge=1, le=1000)
    """Results shown."""

    @field_validator("corpus", "release")
    @classmethod
    def _segment(cls, v: str | None) -> str | None:
        return None if v is None else safe_id(v, "name")
