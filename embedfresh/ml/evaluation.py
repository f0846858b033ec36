"""Evaluation of a model version on the held-out split (the evaluate job, the gate's
reference and its later looks, and the training curve all use it).

- **Search**, what the SLA is on: the data set's judged queries (docs/DATA.md) ranked
  against the corpus by the encoder that embeds the corpus and the release's queries
  (:class:`embedfresh.ml.embedding.query.TextEncoder`: the same tokenizer, truncation
  length, buckets, fast mode), exact search over the corpus's vectors, scored per query
  by :mod:`embedfresh.ml.ranking` (nDCG@10, recall@10/@100, MRR@10). Complete judgments
  rank the whole corpus; incomplete ones score condensed lists, so only the judged
  documents are embedded.
- **The relevance head**: accuracy, ROC AUC and log-loss over the eval split's
  (query, product) pairs (:func:`embedfresh.ml.inference.score`).

A look evaluates the first ``n`` queries of the pool; :class:`Searcher` keeps the
corpus's vectors so that a later look embeds only the queries it adds.

Writes ``reports/{name}.json`` and, for the paired bootstrap of the quality gate, the
per-example outcomes next to it (``{name}.examples.parquet``: label and probability per
pair; ``{name}.queries.parquet``: the ranking metrics per query).
"""

from __future__ import annotations

import io
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedfresh.core import layout
from embedfresh.core.config import EvaluateConfig
from embedfresh.core.embedding_sets import read_embedding_set
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.progress import Progress
from embedfresh.core.shards import (
    commit_name,
    corpus_shards,
    read_corpus_shard,
    reuse_key,
    stale_reason,
)
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.backends import Backend, get_backend
from embedfresh.ml.data.judgments import Judgments, corpus_of, pairs_corpus, read_judgments
from embedfresh.ml.data.reader import Examples, has_eval, read_eval
from embedfresh.ml.embedding.query import (
    ReleaseEncoder,
    TextEncoder,
    calibration_digest,
    calibration_texts,
    vector_settings,
)
from embedfresh.ml.gate.stats import metric_value
from embedfresh.ml.inference import score
from embedfresh.ml.model import versions
from embedfresh.ml.model.relevance import RelevanceModel
from embedfresh.ml.model.tokenizer import TextTokenizer, Tokenized
from embedfresh.ml.ranking import DEPTH, score_rankings
from embedfresh.ml.ranking import METRICS as RANKING_METRICS
from embedfresh.ml.search import vectors_of

log = logging.getLogger("embedfresh.ml.evaluation")

HEAD_METRICS = ("accuracy", "auc", "log_loss")
"""The relevance head's metrics: meaningless for a version whose head never trained."""
METRICS = HEAD_METRICS + RANKING_METRICS
# Queries ranked at once: bounds the similarity matrix to this many x the corpus.
_QUERY_CHUNK = 512


@dataclass(frozen=True)
class Pairs:
    """The eval split's pairs, tokenised once for the relevance head; empty when the data
    set has none (a team's judgments alone: the head's metrics are not measured)."""

    examples: Examples | None
    queries: Tokenized | None
    products: Tokenized | None

    @classmethod
    def load(
        cls,
        store: ArtifactStore,
        dataset: str,
        tokenizer: TextTokenizer,
        features: tuple[tuple[str, str], ...],
    ) -> Pairs:
        if not has_eval(store, dataset):
            log.info("data set %s has no eval split: the relevance head is not measured", dataset)
            return cls(None, None, None)
        examples = read_eval(store, dataset, features, pairs_corpus(store, dataset))
        return cls(
            examples, tokenizer.query(examples.queries), tokenizer.document(examples.products)
        )

    def __len__(self) -> int:
        return 0 if self.examples is None else len(self.examples)


class Searcher:
    """The judged queries of a data set and the corpus documents they are ranked
    against: all of them for complete judgments, the judged ones otherwise.

    Judged documents the corpus does not hold are dropped from the judgments (they
    cannot be found), and queries left without a relevant document with them; both are
    counted. One searcher serves every model evaluated on the same data.
    """

    def __init__(self, store: ArtifactStore, judgments: Judgments, corpus: str) -> None:
        self.corpus = corpus
        ids, texts = _read_corpus(store, corpus, judgments)
        order = np.argsort(ids, kind="stable")
        self.ids, self.texts = ids[order], [texts[i] for i in order]
        self.judgments, self.missing_documents = judgments.restricted(self.ids)

    @classmethod
    def load(cls, store: ArtifactStore, dataset: str, corpus: str | None) -> Searcher:
        """The searcher of ``dataset``'s judgments over ``corpus`` (:func:`corpus_of`)."""
        corpus = corpus_of(store, dataset, corpus)
        return cls(store, read_judgments(store, dataset, _id_kind(store, corpus)), corpus)

    def evaluate(
        self,
        encoder: TextEncoder,
        docs: np.ndarray,
        start: int,
        stop: int,
        progress: Progress | None = None,
    ) -> dict[str, np.ndarray]:
        """Queries ``start`` to ``stop`` of the pool, embedded by ``encoder``, ranked
        against ``docs`` (this searcher's documents by the same encoder) and scored:
        their ids and one array per ranking metric."""
        part = self.judgments.slice(start, min(stop, len(self.judgments)))
        q = encoder.queries(part.texts)
        ranked, judged_scores = [], []
        for a in range(0, len(part), _QUERY_CHUNK):
            sims = q[a : a + _QUERY_CHUNK] @ docs.T
            if part.complete:
                ranked += _top(sims, self.ids)
            else:
                for row in range(len(sims)):
                    at = np.searchsorted(self.ids, part.of(a + row)[0])
                    judged_scores.append(sims[row, at])
            if progress is not None:
                progress.advance(len(sims))
        scored = score_rankings(
            part, ranked if part.complete else None, None if part.complete else judged_scores
        )
        return {"query_id": part.query_ids, **scored}


def _read_corpus(
    store: ArtifactStore, corpus: str, judgments: Judgments
) -> tuple[np.ndarray, list[str]]:
    wanted = None if judgments.complete else judgments.documents()
    ids, texts = [], []
    for name in corpus_shards(store, corpus).values():
        shard_ids, shard_texts = read_corpus_shard(store, f"{layout.corpus(corpus)}/{name}")
        keep = np.ones(len(shard_ids), bool) if wanted is None else np.isin(shard_ids, wanted)
        ids.append(shard_ids[keep])
        texts += [t for t, k in zip(shard_texts, keep, strict=True) if k]
    return np.concatenate(ids), texts


def _top(sims: np.ndarray, ids: np.ndarray) -> list[np.ndarray]:
    """Per row, the ids of its :data:`DEPTH` largest scores, best first (ties by id)."""
    k = min(DEPTH, sims.shape[1])
    top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    top.sort(axis=1)  # position order (= id order): ties break by id, as a sort would
    order = np.argsort(-np.take_along_axis(sims, top, axis=1), axis=1, kind="stable")
    return list(ids[np.take_along_axis(top, order, axis=1)])


def head_outcomes(
    model: RelevanceModel,
    backend: Backend,
    pairs: Pairs,
    batch_size: int,
    progress: Progress | None = None,
) -> dict[str, np.ndarray]:
    """The relevance head's probability of every eval pair, with its label (relevant:
    label 1 or grade 2-3) and ids; no rows without an eval split."""
    ex = pairs.examples
    if ex is None:
        empty = np.empty(0, np.int64)
        return {"query_id": empty, "product_id": empty, "label": empty, "prob": np.empty(0)}
    probs = score(model, backend, pairs.queries, pairs.products, ex.features, batch_size, progress)
    return {
        "query_id": ex.query_ids,
        "product_id": ex.product_ids,
        "label": (ex.labels >= 0.5).astype(np.int64),
        "prob": probs,
    }


def metrics_of(examples: dict[str, np.ndarray], queries: dict[str, np.ndarray]) -> dict[str, float]:
    """Every metric of :data:`METRICS` (and ``judged_at_10`` where measured) on the
    outcome tables."""
    # No eval split, or one of a single class (positive pairs): the head is not measured.
    measured = len(np.unique(examples["label"])) == 2
    out = {name: round(metric_value(name, examples), 6) if measured else None
           for name in HEAD_METRICS}  # fmt: skip
    out.update({name: round(metric_value(name, queries), 6) for name in RANKING_METRICS})
    if "judged_at_10" in queries:
        out["judged_at_10"] = round(float(np.mean(queries["judged_at_10"])), 6)
    return out


def evaluate_model(
    model: RelevanceModel,
    backend: Backend,
    pairs: Pairs,
    searcher: Searcher,
    encoder: TextEncoder,
    batch_size: int,
    queries: int | None,
    progress: str | None = None,
    docs: np.ndarray | None = None,
) -> tuple[dict[str, float], dict[str, dict[str, np.ndarray]], np.ndarray]:
    """Metrics and per-example outcome tables of a model on the eval pairs and the first
    ``queries`` judged queries (None: all of them), and the documents' vectors.

    Leaves the model in eval mode and draws no random numbers (no dropout in eval mode),
    so the training loop can call it between steps. Returns ``(metrics, {"examples":
    {...}, "queries": {...}}, document vectors)``, the tables as :func:`write_outcomes`
    stores them.
    ``progress``: what the log calls this evaluation in its progress lines; None: no
    lines (the training loop's evaluation points). ``docs``: the searcher's documents'
    vectors by this encoder when they are at hand (:func:`served_vectors`).
    """
    n = len(searcher.judgments) if queries is None else min(queries, len(searcher.judgments))
    counter = None
    if progress is not None:
        total = len(pairs) + len(searcher.texts) + n
        counter = Progress(progress, total, unit="texts", log=log)
    examples = head_outcomes(model, backend, pairs, batch_size, counter)
    if docs is None:
        docs = encoder.documents(searcher.texts)
    if counter is not None:
        counter.advance(len(searcher.texts))
    ranked = searcher.evaluate(encoder, docs, 0, n, counter)
    if counter is not None:
        counter.finish()
    return metrics_of(examples, ranked), {"examples": examples, "queries": ranked}, docs


def write_outcomes(
    store: ArtifactStore,
    model: str,
    run_id: str,
    report_name: str,
    tables: dict[str, dict[str, np.ndarray]],
) -> dict[str, str]:
    """Write the outcome tables next to ``reports/{report_name}.json``; returns their URLs
    (the report's ``outcomes``, which :func:`embedfresh.ml.gate.outcomes.load_outcomes` reads)."""
    base = layout.reports(model, run_id)
    urls = {}
    for key in ("examples", "queries"):
        rel = f"{base}/{report_name}.{key}.parquet"
        store.write_bytes(rel, _parquet(tables[key]))
        urls[key] = store.url(rel)
    return urls


@dataclass
class VersionEval:
    """One model version, ready to evaluate: its model, its head's eval pairs, the
    searcher, and its encoder with the embed job's settings for the searched corpus."""

    cfg: EvaluateConfig
    store: ArtifactStore
    backend: Backend
    version: Any
    model: RelevanceModel
    pairs: Pairs
    searcher: Searcher
    encoder: TextEncoder
    settings: dict[str, Any]
    docs: np.ndarray | None = field(default=None, repr=False)
    """The searcher's documents by :attr:`encoder`, once a look embedded (or read) them."""
    documents_from: str = "embedded"
    """Where the documents' vectors came from: embedded here, or the URL of the verified
    embedding set they were read from."""

    @classmethod
    def load(cls, cfg: EvaluateConfig, searcher: Searcher | None = None) -> VersionEval:
        """``cfg``'s version with its data; ``searcher``: one already read (another
        version's evaluation on the same data set and corpus)."""
        store = ArtifactStore(cfg.artifact_root)
        backend = get_backend(cfg.backend)
        version = versions.load(store, cfg.model, cfg.target_version)
        spec = version.spec
        tokenizer = TextTokenizer(version.tokenizer_json, spec.max_length, spec.prompts)
        pairs = Pairs.load(store, cfg.dataset, tokenizer, spec.features)  # checked first
        if searcher is None or searcher.corpus != corpus_of(store, cfg.dataset, cfg.corpus):
            searcher = Searcher.load(store, cfg.dataset, cfg.corpus)
        max_length = spec.check_embedding_length(cfg.max_length or spec.embedding_max_length)
        first = layout.part_name(min(corpus_shards(store, searcher.corpus)))
        # int8 pins the texts it is calibrated on, as the embed job does (its set's
        # settings then equal these, and its vectors are served).
        pinned = None
        if cfg.quantize == "int8":
            texts = calibration_texts(
                store, f"{layout.corpus(searcher.corpus)}/{first}", spec.prompt("document")
            )
            pinned = calibration_digest(texts)
        settings = vector_settings(spec, max_length, cfg.quantize, backend.name, first, pinned)
        encoder = ReleaseEncoder(
            store, cfg.model, cfg.target_version, searcher.corpus, settings, backend
        )
        model = versions.instantiate(version).to(backend.device)
        return cls(cfg, store, backend, version, model, pairs, searcher, encoder, settings)

    def run(self, progress: str | None = None) -> tuple[dict[str, float], dict[str, Any]]:
        """The first look: the head's pairs and ``cfg.queries`` judged queries."""
        metrics, tables, self.docs = evaluate_model(
            self.model, self.backend, self.pairs, self.searcher, self.encoder,
            self.cfg.batch_size, self.cfg.first_look, progress, self._served(),
        )  # fmt: skip
        return metrics, tables

    def _served(self) -> np.ndarray | None:
        """The documents' vectors from the version's verified embedding set of the corpus,
        when it is current (:func:`served_vectors`); logged, and named in the report."""
        cfg, corpus = self.cfg, self.searcher.corpus
        found = served_vectors(
            self.store, cfg.model, cfg.target_version, corpus, self.settings, self.searcher.ids
        )
        if found is None:
            return None
        vectors, self.documents_from = found
        log.info(
            "the %d documents of %s: the vectors %s %s serves (its verified embedding set %s, "
            "current with the corpus and these settings), not embedded again",
            len(vectors), corpus, cfg.model, cfg.target_version, self.documents_from,
        )  # fmt: skip
        return vectors

    def more(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Judged queries ``start`` to ``stop`` of the pool (a later look)."""
        what = f"evaluating {self.cfg.model} {self.cfg.target_version}, queries {start}-{stop}"
        if self.docs is None:
            self.docs = self._served()
        if self.docs is None:
            log.info("%s: embedding the %d documents of corpus %s first", what,
                     len(self.searcher.texts), self.searcher.corpus)  # fmt: skip
            self.docs = self.encoder.documents(self.searcher.texts)
        counter = Progress(what, stop - start, unit="queries", log=log)
        out = self.searcher.evaluate(self.encoder, self.docs, start, stop, counter)
        counter.finish()
        return out

    def describe(self) -> dict[str, Any]:
        """What the report says of the search half: judgments, corpus, vectors."""
        j = self.searcher.judgments
        return {
            "corpus": self.searcher.corpus,
            "complete": j.complete,
            "pool": len(j),
            "left_out": j.left_out,
            "missing_documents": self.searcher.missing_documents,
            "documents_ranked": len(self.searcher.ids),
            "documents_from": self.documents_from,
            "vectors": self.settings,
            # The embed settings asked for (None: the model's own length): another
            # version evaluated on this definition resolves them for itself.
            "embed": {"max_length": self.cfg.max_length, "quantize": self.cfg.quantize},
        }


def served_vectors(
    store: ArtifactStore,
    model: str,
    version: str,
    corpus: str,
    settings: dict[str, Any],
    ids: np.ndarray,
) -> tuple[np.ndarray, str] | None:
    """The vectors of ``ids`` (sorted) from ``version``'s verified embedding set of
    ``corpus``, and its manifest's URL: what a release of the version serves. Only when
    the set is current: embedded with exactly ``settings``, and every corpus shard's
    commit marker's reuse key (the shard's content, the version's files, the settings)
    matches the store as it is now (:func:`embedfresh.core.shards.stale_reason`). None
    otherwise: the caller embeds."""
    try:
        eset = read_embedding_set(store, model, version, corpus)
    except BadInputError:
        return None
    shards = corpus_shards(store, corpus)
    if eset.settings != settings or set(eset.parts) != set(shards.values()):
        return None
    marker = versions.is_committed(store, model, version) or {}
    for index, name in shards.items():
        commit_rel = f"{eset.directory}/{commit_name(index)}"
        commit = store.read_json(commit_rel) if store.exists(commit_rel) else None
        key = reuse_key(
            store=store, source_rel=f"{layout.corpus(corpus)}/{name}",
            version_marker=marker, settings=settings,
        )  # fmt: skip
        if stale_reason(commit, key) is not None:
            return None
    try:
        return vectors_of(store, eset, ids), eset.manifest_url
    except BadInputError:  # an id the set lacks: it is not this corpus's
        return None


def _id_kind(store: ArtifactStore, corpus: str) -> str:
    first = next(iter(corpus_shards(store, corpus).values()))
    ids, _ = read_corpus_shard(store, f"{layout.corpus(corpus)}/{first}")
    return "string" if ids.dtype.kind == "U" else "int64"


def evaluate_version(
    cfg: EvaluateConfig, loaded: VersionEval | None = None
) -> tuple[dict[str, Any], str, VersionEval]:
    """Evaluate ``cfg``'s version (its first look); write its outcomes, then its report
    (``reports/{report_name}.json``, last). Returns the report, its URL and the loaded
    evaluation (for later looks)."""
    started = time.perf_counter()
    ev = loaded or VersionEval.load(cfg)
    j = ev.searcher.judgments
    if not len(j):
        raise BadInputError(
            f"no judged query of {cfg.dataset!r} has a relevant document in corpus "
            f"{ev.searcher.corpus!r}: search cannot be evaluated (docs/DATA.md)"
        )
    n = len(j) if cfg.first_look is None else min(cfg.first_look, len(j))
    log.info(
        "evaluating %s version %s on %s: %d pairs; %d of %d judged queries against corpus "
        "%s (%d documents, judgments %s)",
        cfg.model, cfg.target_version, cfg.dataset, len(ev.pairs), n, len(j),
        ev.searcher.corpus, len(ev.searcher.ids), "complete" if j.complete else "condensed",
    )  # fmt: skip
    what = f"evaluating {cfg.model} {cfg.target_version}"
    metrics, tables = ev.run(progress=what)
    outcomes = write_outcomes(ev.store, cfg.model, cfg.run_id, cfg.report_name, tables)
    report = {
        "status": "ok",
        "model": cfg.model,
        "run_id": cfg.run_id,
        "version": cfg.target_version,
        "version_url": ev.version.url,
        "dataset": cfg.dataset,
        "metrics": metrics,
        "n_examples": len(ev.pairs),
        "n_queries": n,
        "search": ev.describe(),
        "outcomes": outcomes,
        "wall_seconds": round(time.perf_counter() - started, 3),
        **ev.backend.metadata(),
    }
    report_rel = layout.report(cfg.model, cfg.run_id, cfg.report_name)
    ev.store.write_json(report_rel, report)  # written last: the outcomes it names exist
    return report, ev.store.url(report_rel), ev


def _parquet(columns: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    table = pa.table({k: pa.array(v) for k, v in columns.items()})
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()
