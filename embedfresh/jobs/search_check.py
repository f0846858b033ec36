"""The search check: ``python -m embedfresh.jobs.search_check --set run_id=R --set corpus=products``.

Before a release goes live, search is tried as its users will live with it: the data
set's judged queries (docs/DATA.md), embedded with the release's own query encoder
(:class:`embedfresh.ml.embedding.query.ReleaseEncoder`), are searched in the release's
table (approximate, over the whole corpus). Two checks:

1. **The index is faithful.** Its top 10 against the exact top 10 over the same vectors
   (a scan of the verified embedding parts): the mean overlap must reach
   ``min_ann_recall`` (default 0.95), and the nDCG@10 it loses against the exact search
   must stay within ``max_ndcg_loss`` (half the SLA). Under either, ``ef_search`` is
   doubled (up to ``max_ef_search``) until it does; the release records the
   ``ef_search`` that did.
2. **Search got no worse.** nDCG@10 on the graded judgments, query by query, paired
   with the live release's table searched with the live release's own query encoder,
   judged by the gate's paired bootstrap and 0.1% non-inferiority rule
   (:func:`embedfresh.ml.gate.decision.gate`, ``no_regression``), with the gate's looks:
   the first takes as many queries as this run's gate decided on, and while the
   comparison is open and the pool has more, it looks again at twice as many
   (:mod:`embedfresh.ml.gate.sequential`). Complete judgments score the ranking the
   index returns; incomplete ones the condensed list (the judged documents in the
   order of their cosine), with judged@10 of the returned top 10 reported and, under
   ``min_judged_at_10``, the check INCONCLUSIVE. The first release of a corpus has
   nothing to pair with: its figures are reported only. With ``regression=report`` (a
   person's "promote anyway") the comparison is reported, not enforced.

A release that cannot be judged (no judgments of this corpus, or none of its judged
documents in it) is INCONCLUSIVE. Before either check, the table must hold every corpus
id exactly once: a missing id exits 2, naming it. A check that does not PASS writes its
report (the figures are what a person needs to decide) and exits 3: no release is made.
Writes ``runs/{model}/{run_id}/reports/search-{corpus}.json``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedfresh.core import layout
from embedfresh.core.changes import ids_after
from embedfresh.core.cli import main_for
from embedfresh.core.config import SearchCheckConfig
from embedfresh.core.embedding_sets import (
    EmbeddingSet,
    id_type,
    iter_parts,
    read_embedding_set,
)
from embedfresh.core.exit_codes import BadInputError, GateRefusedError
from embedfresh.core.index import AppliedChange, VectorIndex, open_index
from embedfresh.core.registry import Registry
from embedfresh.core.releases import (
    Release,
    production_release,
    read_release,
    table_location,
)
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.data.judgments import Judgments, read_judgments
from embedfresh.ml.embedding.query import ReleaseEncoder
from embedfresh.ml.gate.decision import Mode, Verdict, gate
from embedfresh.ml.gate.sequential import plan_looks
from embedfresh.ml.ranking import DEPTH, K, score_rankings
from embedfresh.ml.search import ann_recall, exact_top_k, set_parts, vectors_of

log = logging.getLogger("embedfresh.jobs.search_check")

METRIC = "ndcg_at_10"


def report_kind(corpus: str) -> str:
    return f"search-{corpus}"


def search_check(cfg: SearchCheckConfig) -> dict[str, Any]:
    """Check the release's table: faithful to the exact search, and search no worse."""
    started = time.perf_counter()
    store = ArtifactStore(cfg.artifact_root)
    eset = read_embedding_set(store, cfg.model, cfg.target_version, cfg.corpus)
    table, ann = _loaded(store, cfg)
    baseline = _release_replaced(store, cfg)
    with open_index(cfg.artifact_root) as index:
        applied = index.applied_changes(table)  # the change sets the table was caught up with
        _every_id_once(store, index, eset, table, applied)
        watermarks = _watermarks(index, cfg, table, applied, baseline)
        judgments, unjudged = _judgments(store, index, cfg, eset, table)
        encoder = ReleaseEncoder(store, cfg.model, cfg.target_version, cfg.corpus, eset.settings)
        first = _first_look(store, cfg)
        # The index's faithfulness is an average: cfg.queries estimate it well.
        probe = judgments.head(min(first, cfg.queries)) if judgments is not None else None
        texts = probe.texts if probe is not None else _eval_texts(store, cfg)
        vectors = encoder.queries(texts)
        # Over what the table holds: the set's vectors, or once change sets were applied
        # to it, its own rows.
        parts = index.scan(table) if applied else set_parts(store, eset)
        exact = exact_top_k(parts, vectors, K)
        # What the index costs search: complete judgments only (a condensed list ranks
        # the judged documents by their own cosine, no index involved).
        judge = probe if probe is not None and probe.complete else None
        fit = _faithful_ef_search(index, table, vectors, exact, ann["ef_search"], cfg, judge)
        ann = {**ann, "ef_search": fit.ef_search}
        if judgments is None:
            compared = {"verdict": "INCONCLUSIVE", "reason": unjudged, "with": None}
            log.warning("search quality not judged: %s", unjudged)
        else:
            ours = Side(store, index, eset, table, fit.ef_search, encoder, bool(applied))
            compared = Comparison(store, index, cfg, ours, baseline, judgments, first).run()
        location = index.location
    verdict, reason = _decide(cfg, fit, compared)
    report = {
        "status": "ok" if verdict == "PASS" else "refused",
        "verdict": verdict,
        "reason": reason,
        "model": cfg.model,
        "release": cfg.run_id,
        "version": cfg.target_version,
        "corpus": cfg.corpus,
        "dataset": cfg.dataset,
        "index": {"location": location, "table": table, "ann": ann},
        "embeddings": eset.to_record(),
        "queries": len(texts),
        "queries_judged": compared.get("n_queries", 0),
        "queries_truncated": encoder.truncated,
        "k": K,
        "ann_recall": round(fit.recall, 6),
        "min_ann_recall": cfg.min_ann_recall,
        "ndcg_loss": fit.loss,
        "max_ndcg_loss": cfg.max_ndcg_loss,
        "ann_verdict": "PASS" if fit.ok else "FAIL",
        "ann_recall_by_ef_search": fit.tried,
        "worst_ann_recall": round(float(fit.per_query.min()), 6),
        **{k: compared.get(k) for k in (METRIC, "judged_at_10", "recall_at_100", "mrr_at_10")},
        "latency_ms": _latency(fit.found.seconds),
        "regression": compared,
        # The release this check compared against (or found live): the release job
        # goes live only if it still is.
        "live_release": None if baseline is None else baseline.release,
        # The last change set each table holds (docs/SEARCH.md "Corpus changes").
        "watermarks": watermarks,
        "seconds": round(time.perf_counter() - started, 3),
    }
    return _conclude(store, cfg, report, compared)


def _conclude(
    store: ArtifactStore, cfg: SearchCheckConfig, report: dict[str, Any], compared: dict
) -> dict[str, Any]:
    """Write the report, then exit as its verdict says: PASS, an INCONCLUSIVE a person
    decides (``inconclusive_exits`` off), or refused (exit 3)."""
    verdict, reason, table = report["verdict"], report["reason"], report["index"]["table"]
    rel = layout.report(cfg.model, cfg.run_id, report_kind(cfg.corpus))
    store.write_json(rel, report)
    log.info(
        "search check of %s %s: %s (ANN recall@10 %.4f over %d queries, nDCG@10 %s over "
        "%d judged): %s", cfg.corpus, table, verdict, report["ann_recall"], report["queries"],
        report[METRIC], report["queries_judged"], reason,
    )  # fmt: skip
    if verdict == "INCONCLUSIVE" and not cfg.inconclusive_exits:
        log.warning("search check INCONCLUSIVE: a person decides (%s)", reason)
    elif verdict != "PASS":
        raise GateRefusedError(
            f"search check of corpus {cfg.corpus!r} for release {cfg.run_id}: {verdict}: "
            f"{reason}; no release is made (report: {store.url(rel)})"
        )
    keys = ("verdict", "reason", "release", "version", "corpus", "queries", "ann_recall", METRIC)
    return {**{k: report[k] for k in keys}, "table": table, "report": store.url(rel),
            "compared_with": (compared.get("with") or {}).get("release")}  # fmt: skip


def _loaded(store: ArtifactStore, cfg: SearchCheckConfig) -> tuple[str, dict[str, Any]]:
    """The release's table and its ANN settings, from this run's index load report."""
    load_rel = layout.report(cfg.model, cfg.run_id, f"index-{cfg.corpus}")
    if not store.exists(load_rel):
        raise BadInputError(
            f"no index load report {store.url(load_rel)}: load the release's table first "
            f"(python -m embedfresh.jobs.index_load --set run_id={cfg.run_id} "
            f"--set corpus={cfg.corpus})"
        )
    loaded = store.read_json(load_rel)
    return loaded["index"]["table"], loaded["index"]["ann"]


def _judgments(
    store: ArtifactStore,
    index: VectorIndex,
    cfg: SearchCheckConfig,
    eset: EmbeddingSet,
    table: str,
) -> tuple[Judgments | None, str]:
    """The data set's judgments of this corpus, without documents the table lacks; or
    None and why the release cannot be judged."""
    try:
        judgments = read_judgments(store, cfg.dataset, id_type(store, eset))
    except BadInputError as e:
        if "no judgments for data set" not in str(e):
            raise
        return None, f"the release cannot be judged: {e}"
    if judgments.corpus not in (None, cfg.corpus):
        return None, (
            f"the release cannot be judged: the judgments of data set {cfg.dataset!r} judge "
            f"corpus {judgments.corpus!r}, not {cfg.corpus!r} (judge this corpus, docs/DATA.md, "
            "or name its data set: dataset=...)"
        )
    documents = judgments.documents()
    absent = index.missing_ids(table, documents)
    judgments, _ = judgments.restricted(np.setdiff1d(documents, absent))
    if not len(judgments):
        return None, (
            f"the release cannot be judged: no judged query of {cfg.dataset!r} has a relevant "
            f"document in corpus {cfg.corpus!r}"
        )
    return judgments, ""


def _first_look(store: ArtifactStore, cfg: SearchCheckConfig) -> int:
    """As many queries as this run's gate decided on, else ``cfg.queries``."""
    rel = layout.report(cfg.model, cfg.run_id, cfg.gate_report)
    if store.exists(rel):
        decision = store.read_json(rel)
        if decision.get("candidate", {}).get("version") == cfg.target_version:
            n = decision.get("n_queries")
            if isinstance(n, int) and n > 0:
                return n
    return cfg.queries


def _eval_texts(store: ArtifactStore, cfg: SearchCheckConfig) -> list[str]:
    """Queries to probe the index's faithfulness with when nothing is judged: the eval
    split's (distinct texts), when there is one."""
    from embedfresh.ml.data.judgments import pairs_corpus
    from embedfresh.ml.data.reader import has_eval, read_eval

    if not has_eval(store, cfg.dataset):
        raise BadInputError(
            f"neither judgments nor an eval split in data set {cfg.dataset!r}: the search "
            "check has no query to search with (docs/DATA.md)"
        )
    pairs = read_eval(store, cfg.dataset, (), pairs_corpus(store, cfg.dataset))
    return list(dict.fromkeys(pairs.queries))[: cfg.queries]


class Side:
    """One release's side of the comparison: its table searched with its own encoder."""

    def __init__(
        self,
        store: ArtifactStore,
        index: VectorIndex,
        eset: EmbeddingSet,
        table: str,
        ef_search: int | None,
        encoder: ReleaseEncoder,
        synced: bool | None = None,
    ) -> None:
        """``synced``: whether the table was caught up with change sets (then it holds
        vectors its embedding set does not); None: read from the index's ledger."""
        self.store, self.index, self.eset, self.table = store, index, eset, table
        self.synced = bool(index.applied_changes(table)) if synced is None else synced
        self.ef_search = max(ef_search or 0, DEPTH)  # HNSW returns at most ef_search rows
        self.encoder = encoder
        self.latency: list[np.ndarray] = []

    def outcomes(self, part: Judgments) -> dict[str, np.ndarray]:
        """``part``'s queries searched in the table (top :data:`DEPTH`) and scored."""
        q = self.encoder.queries(part.texts)
        found = self.index.search(self.table, q, DEPTH, ef_search=self.ef_search)
        self.latency.append(found.seconds)
        judged_scores = None
        if not part.complete:  # the condensed list: the judged documents by cosine
            docs = part.documents()
            vec = (
                self.index.vectors(self.table, docs)
                if self.synced
                else vectors_of(self.store, self.eset, docs)
            )
            judged_scores = [
                vec[np.searchsorted(docs, part.of(i)[0])] @ q[i] for i in range(len(part))
            ]
        return {"query_id": part.query_ids,
                **score_rankings(part, found.ids, judged_scores)}  # fmt: skip


class Comparison:
    """This release against the one it replaces, on nDCG@10 of the judged queries, in
    the gate's looks; or this release's figures alone when nothing is live."""

    def __init__(
        self,
        store: ArtifactStore,
        index: VectorIndex,
        cfg: SearchCheckConfig,
        ours: Side,
        baseline: Release | None,
        judgments: Judgments,
        first: int,
    ) -> None:
        self.store, self.index, self.cfg, self.ours = store, index, cfg, ours
        self.baseline, self.judgments = baseline, judgments
        n_max = min(len(judgments), cfg.max_queries or len(judgments))
        self.plan = plan_looks(min(first, n_max), n_max, cfg.confidence)
        self.tables: dict[str, dict[str, np.ndarray]] = {}

    def run(self) -> dict[str, Any]:
        if self.baseline is None or self.cfg.corpus not in self.baseline.corpora:
            return self._alone()
        theirs = self._live_side()
        looks, result, n = [], None, 0
        for look in self.plan:
            part = self.judgments.slice(n, look.n)
            for name, side in (("candidate", self.ours), ("reference", theirs)):
                self._append(name, side.outcomes(part))
            n = look.n
            result = gate(
                self.tables["candidate"], self.tables["reference"], [METRIC],
                Mode.NO_REGRESSION, self.cfg.tolerance, look.resamples(self.cfg.resamples),
                look.confidence, self.cfg.seed, min_pass_n=self.cfg.min_queries,
            )  # fmt: skip
            looks.append({"n_queries": n, "confidence": look.confidence,
                          "verdict": str(result.verdict)})  # fmt: skip
            if result.verdict != Verdict.INCONCLUSIVE:
                break
        out = {
            **self._figures(n),
            "verdict": str(result.verdict),
            "reason": result.reason,
            "mode": self.cfg.regression,
            "with": {
                "release": self.baseline.release,
                "version": self.baseline.version,
                "table": self.baseline.corpus(self.cfg.corpus).table,
                METRIC: round(float(self.tables["reference"][METRIC].mean()), 6),
            },
            "looks": looks,
            "gate": result.to_dict(),
        }
        return self._judged_enough(out)

    def _alone(self) -> dict[str, Any]:
        what = "no live release" if self.baseline is None else (
            f"the live {'version ' + self.baseline.version if self.baseline.legacy else 'release ' + str(self.baseline.release)} "
            f"has no {self.cfg.corpus!r} embeddings"
        )  # fmt: skip
        log.info("first release of corpus %s: %s; nDCG@10 is reported only", self.cfg.corpus, what)
        n = self.plan[0].n
        self._append("candidate", self.ours.outcomes(self.judgments.head(n)))
        return {**self._figures(n), "verdict": "NOT_COMPARED",
                "reason": f"first release of this corpus ({what})", "with": None}  # fmt: skip

    def _live_side(self) -> Side:
        live = self.baseline.corpus(self.cfg.corpus)
        where = table_location(self.store, self.baseline, self.cfg.corpus)
        if where != self.index.location:
            raise BadInputError(
                f"the live release {self.baseline.release} has its {self.cfg.corpus!r} table in "
                f"{where}, this run's index is {self.index.location}: the search check "
                "compares both in one index; point this run at the live release's index, or "
                "if the index moved (a moved store, a new DSN), attach the live release's "
                f"tables here: python -m embedfresh.jobs.index_attach --set model={self.cfg.model}"
            )
        if live.table not in {t.name for t in self.index.tables(self.cfg.model)}:
            raise BadInputError(
                f"the live release {self.baseline.release}'s table {live.table} is not in "
                f"{self.index.location}: production's own table is gone; restore it before "
                "releasing"
            )
        eset = read_embedding_set(
            self.store, self.cfg.model, self.baseline.version, self.cfg.corpus
        )
        encoder = ReleaseEncoder.for_release(self.store, self.baseline, self.cfg.corpus)
        ef = live.index.get("ann", {}).get("ef_search")
        return Side(self.store, self.index, eset, live.table, ef, encoder)

    def _append(self, side: str, more: dict[str, np.ndarray]) -> None:
        have = self.tables.setdefault(side, {})
        for key, values in more.items():
            have[key] = np.concatenate([have[key], values]) if key in have else values

    def _figures(self, n: int) -> dict[str, Any]:
        ours = self.tables["candidate"]
        figures = {k: round(float(ours[k].mean()), 6)
                   for k in (METRIC, "recall_at_100", "mrr_at_10", "judged_at_10")}  # fmt: skip
        return {**figures, "n_queries": n, "complete": self.judgments.complete}

    def _judged_enough(self, out: dict[str, Any]) -> dict[str, Any]:
        """Under ``min_judged_at_10`` (incomplete judgments), a PASS is INCONCLUSIVE."""
        judged = out["judged_at_10"]
        if out["verdict"] == "PASS" and judged < self.cfg.min_judged_at_10:
            out["verdict"] = "INCONCLUSIVE"
            out["reason"] = (
                f"only {judged:.1%} of the top 10 is judged (min_judged_at_10 "
                f"{self.cfg.min_judged_at_10:.0%}): the condensed nDCG@10 says little of what "
                f"users see; judge more of what search returns (was: {out['reason']})"
            )
        return out


@dataclass(frozen=True)
class Faithful:
    """How faithful the table is at the ``ef_search`` found (the smallest tried that is,
    else the largest tried): its ANN recall@10 per query, the nDCG@10 it loses against
    the exact search (relative; None without complete judgments) and every try."""

    ef_search: int
    found: Any
    per_query: np.ndarray
    loss: float | None
    tried: list[dict[str, Any]]
    ok: bool

    @property
    def recall(self) -> float:
        return float(self.per_query.mean())


def _faithful_ef_search(
    index: VectorIndex,
    table: str,
    vectors: np.ndarray,
    exact: Any,
    ef_search: int,
    cfg: SearchCheckConfig,
    judged: Judgments | None,
) -> Faithful:
    """The smallest ``ef_search`` at which the table is faithful: its top 10 holds at
    least ``min_ann_recall`` of the exact top 10, and (complete judgments) it loses at
    most ``max_ndcg_loss`` of the exact search's nDCG@10. The load's ``ef_search``,
    doubled while not, up to ``max_ef_search``.

    How many candidates an HNSW search needs depends on the corpus (near-duplicates need
    more: docs/BENCHMARKS.md, "Vector index"), and an ANN recall of 0.99 still cost the
    demo's search 0.4% of nDCG@10, four times the SLA (docs/GATE.md): so it is measured
    here, and the release records what its search service must search with."""
    best = None
    if judged is not None:
        best = float(score_rankings(judged, ranked=exact.ids)["ndcg_at_10"].mean())
    tried: list[dict[str, Any]] = []
    while True:
        found = index.search(table, vectors, K, ef_search=ef_search)
        per_query = ann_recall([1 - d for d in found.distances], exact, K)
        loss = None
        if best:
            got = float(score_rankings(judged, ranked=found.ids)["ndcg_at_10"].mean())
            loss = round(1.0 - got / best, 6)
        tried.append({"ef_search": ef_search, "ann_recall": round(float(per_query.mean()), 6),
                      "ndcg_loss": loss})  # fmt: skip
        ok = per_query.mean() >= cfg.min_ann_recall and (loss is None or loss <= cfg.max_ndcg_loss)
        if ok or ef_search >= cfg.max_ef_search:
            break
        ef_search = min(2 * ef_search, cfg.max_ef_search)
    if len(tried) > 1:
        log.warning(
            "table %s at ef_search %s: ANN recall@10 %s, nDCG@10 loss %s (limits %.0f%%, "
            "%s): searched with ef_search %d (%s, %s); the release records it for its "
            "search service", table, tried[0]["ef_search"], tried[0]["ann_recall"],
            tried[0]["ndcg_loss"], 100 * cfg.min_ann_recall, cfg.max_ndcg_loss, ef_search,
            tried[-1]["ann_recall"], tried[-1]["ndcg_loss"],
        )  # fmt: skip
    return Faithful(ef_search, found, per_query, loss, tried, bool(ok))


def _release_replaced(store: ArtifactStore, cfg: SearchCheckConfig) -> Release | None:
    """The release this one would replace: the live one, or, when this very release is
    live already (a re-run after its release), the one it replaced."""
    registry = Registry(store, cfg.model)
    doc, _ = registry.read()
    live = production_release(store, cfg.model, doc)
    if live is None or live.release != cfg.run_id:
        return live
    previous = (doc or {}).get("production", {}).get("previous_release")
    return read_release(store, cfg.model, previous) if previous else None


def _watermarks(
    index: VectorIndex,
    cfg: SearchCheckConfig,
    table: str,
    applied: dict[str, AppliedChange],
    baseline: Release | None,
) -> dict[str, str | None]:
    """The last change set this run's table and the live release's hold; warns when
    they differ (the comparison is then over two states of the corpus: the live table's
    corpus sync is behind)."""
    out = {"this": max(applied, default=None)}
    if baseline is not None and cfg.corpus in baseline.corpora:
        live_table = baseline.corpus(cfg.corpus).table
        out["live"] = max(index.applied_changes(live_table), default=None)
        if out["live"] != out["this"]:
            log.warning(
                "table %s holds the change sets of %s up to %s, the live release's %s up to "
                "%s: the comparison is over two states of the corpus (run python -m "
                "embedfresh.jobs.corpus_sync --set model=%s --set corpus=%s first)",
                table, cfg.corpus, out["this"], live_table, out["live"], cfg.model, cfg.corpus,
            )  # fmt: skip
    return out


def _every_id_once(
    store: ArtifactStore,
    index: VectorIndex,
    eset: EmbeddingSet,
    table: str,
    applied: dict[str, AppliedChange],
) -> None:
    """The table holds the corpus: as many rows as the embedding set (its primary key
    makes each id unique), and when not, which ids are missing.

    :raises BadInputError: a corpus id missing from the table, named.
    """
    if applied:  # caught up with change sets: the corpus as they leave it
        _every_id_after_changes(store, index, eset, table, applied)
        return
    rows = index.count(table)
    if rows == eset.rows:
        return
    for name, ids, _ in iter_parts(store, eset):
        missing = index.missing_ids(table, ids)
        if len(missing):
            raise BadInputError(
                f"table {table} of {index.location} lacks {len(missing)} id(s) of corpus "
                f"{eset.corpus!r} (e.g. {missing[:5].tolist()}, in {name}): it holds {rows} "
                f"rows of {eset.rows}; load it again (index_load) after finding who deleted them"
            )
    raise BadInputError(
        f"table {table} of {index.location} holds {rows} rows, the corpus has {eset.rows}: "
        "rows that are not the corpus's were added outside embedfresh"
    )


def _every_id_after_changes(
    store: ArtifactStore,
    index: VectorIndex,
    eset: EmbeddingSet,
    table: str,
    applied: dict[str, Any],
) -> None:
    """The table holds the corpus's snapshot with the change sets its ledger records
    applied: exactly those ids (deleted ones gone, added ones in).

    :raises BadInputError: an id missing or one too many, named.
    """
    kind = id_type(store, eset)
    snapshot = np.concatenate([ids for _, ids, _ in iter_parts(store, eset)])
    expected = ids_after(store, eset.corpus, snapshot, applied, kind)
    missing = index.missing_ids(table, expected)
    rows = index.count(table)
    if len(missing) or rows != len(expected):
        raise BadInputError(
            f"table {table} of {index.location} holds {rows} rows, corpus {eset.corpus!r} "
            f"after change sets {sorted(applied)[-3:]} has {len(expected)}"
            + (f"; it lacks {missing[:5].tolist()}" if len(missing) else "")
            + ": load it again (index_load) after finding who changed it"
        )


def _decide(cfg: SearchCheckConfig, fit: Faithful, compared: dict[str, Any]) -> tuple[str, str]:
    if not fit.ok:
        loss = "" if fit.loss is None else f" and loses {fit.loss:.3%} of the exact nDCG@10"
        return "FAIL", (
            f"the index is not faithful: its top 10 holds {fit.recall:.2%} of the exact top 10"
            f"{loss} even at ef_search {fit.ef_search} (limits {cfg.min_ann_recall:.0%} and "
            f"{cfg.max_ndcg_loss:.3%}; load it again with a larger hnsw_m / "
            "hnsw_ef_construction)"
        )
    faithful = f"the index is faithful ({fit.recall:.2%}" + (
        f", nDCG@10 loss {fit.loss:.3%})" if fit.loss is not None else ")"
    )
    verdict = compared["verdict"]
    against = (compared.get("with") or {}).get("release")
    if cfg.regression == "report":
        return "PASS", (
            f"{faithful}; search{' against release ' + str(against) if against else ''}: "
            f"{verdict} (reported only: {compared['reason']})"
        )
    if verdict == "NOT_COMPARED":
        return "PASS", f"{faithful}; {compared['reason']}: reported only"
    if verdict != "PASS":
        where = f" against release {against}" if against else ""
        return verdict, f"search{where}: {compared['reason']}"
    return "PASS", f"{faithful}; search is no worse than release {against}: {compared['reason']}"


def _latency(seconds: np.ndarray) -> dict[str, float] | None:
    if not len(seconds):
        return None
    ms = seconds * 1000
    return {"p50": round(float(np.percentile(ms, 50)), 3), "p99": round(float(np.percentile(ms, 99)), 3),
            "queries": len(ms)}  # fmt: skip


if __name__ == "__main__":
    main_for("search_check", SearchCheckConfig, search_check)
