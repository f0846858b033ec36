"""The search check: ``python -m embedfresh.jobs.search_check --set run_id=R --set corpus=products``.

Before a release goes live, search is tried as its users will live with it: the eval
split's queries whose relevant products are all in the corpus, embedded with the
release's own query encoder (:class:`embedfresh.ml.embedding.query.ReleaseEncoder`), are
searched in the release's table (approximate, over the whole corpus). Two checks:

1. **The index is faithful.** Its top 10 against the exact top 10 over the same vectors
   (a scan of the verified embedding parts): the mean overlap must reach
   ``min_ann_recall`` (default 0.95). Under it, ``ef_search`` is doubled (up to
   ``max_ef_search``) until it does; the release records the ``ef_search`` that did.
2. **Search got no worse.** Recall@10 against the relevance labels, query by query,
   paired with the live release's table searched with the live release's own query
   encoder, judged by the gate's paired bootstrap and 0.1% non-inferiority rule
   (:func:`embedfresh.ml.gate.decision.gate`, ``no_regression``). The first release of a
   corpus has nothing to pair with: its figure is reported only. With
   ``regression=report`` (a person's "promote anyway") the comparison is reported, not
   enforced.

Before either, the table must hold every corpus id exactly once: a missing id exits 2,
naming it. A check that fails writes its report (the figures are what a person needs to
decide) and exits 3: no release is made. Writes
``runs/{model}/{run_id}/reports/search-{corpus}.json``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from embedfresh.core import layout
from embedfresh.core.cli import main_for
from embedfresh.core.config import SearchCheckConfig
from embedfresh.core.embedding_sets import EmbeddingSet, id_type, iter_parts, read_embedding_set
from embedfresh.core.exit_codes import BadInputError, GateRefusedError
from embedfresh.core.index import VectorIndex, open_index
from embedfresh.core.registry import Registry
from embedfresh.core.releases import Release, production_release, read_release
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.embedding.query import ReleaseEncoder
from embedfresh.ml.evaluation import RECALL_K
from embedfresh.ml.gate.decision import Mode, gate
from embedfresh.ml.search import ann_recall, eval_queries, exact_top_k, recall_of

log = logging.getLogger("embedfresh.jobs.search_check")

METRIC = f"recall_at_{RECALL_K}"


def report_kind(corpus: str) -> str:
    return f"search-{corpus}"


def search_check(cfg: SearchCheckConfig) -> dict[str, Any]:
    """Check the release's table: faithful to the exact search, and search no worse."""
    started = time.perf_counter()
    store = ArtifactStore(cfg.artifact_root)
    eset = read_embedding_set(store, cfg.model, cfg.target_version, cfg.corpus)
    load_rel = layout.report(cfg.model, cfg.run_id, f"index-{cfg.corpus}")
    if not store.exists(load_rel):
        raise BadInputError(
            f"no index load report {store.url(load_rel)}: load the release's table first "
            f"(python -m embedfresh.jobs.index_load --set run_id={cfg.run_id} "
            f"--set corpus={cfg.corpus})"
        )
    loaded = store.read_json(load_rel)
    table, ann = loaded["index"]["table"], loaded["index"]["ann"]
    baseline = _release_replaced(store, cfg)
    with open_index(cfg.artifact_root) as index:
        _every_id_once(store, index, eset, table)
        queries = eval_queries(
            store, cfg.dataset, id_type(store, eset), lambda ids: index.missing_ids(table, ids)
        )
        judged = queries.subset(queries.judged)
        if queries.left_out:
            log.warning(
                "%d eval queries not judged on recall: a relevant product of theirs is not "
                "in corpus %s", queries.left_out, cfg.corpus,
            )  # fmt: skip
        encoder = ReleaseEncoder(store, cfg.model, cfg.target_version, cfg.corpus, eset.settings)
        vectors = encoder.queries(queries.texts)
        exact = exact_top_k(store, eset, vectors, RECALL_K)
        ef_search, found, faithful, tried = _faithful_ef_search(
            index, table, vectors, exact, ann["ef_search"], cfg
        )
        ann = {**ann, "ef_search": ef_search}
        recall = recall_of([found.ids[i] for i in np.flatnonzero(queries.judged)],
                           judged.relevant, RECALL_K)  # fmt: skip
        if len(judged.query_ids):
            compared = _compare(store, index, cfg, baseline, judged, recall)
        else:
            compared = {
                "verdict": "NOT_MEASURED",
                "reason": f"no query of the eval split of {cfg.dataset!r} has all its relevant "
                f"products in corpus {cfg.corpus!r}: recall cannot be measured on it (an eval "
                "split of its own products would: dataset=...)",
                "with": None,
            }
            log.warning("search quality not measured: %s", compared["reason"])
        location = index.location
    ann_mean = float(faithful.mean())
    ann_verdict = "PASS" if ann_mean >= cfg.min_ann_recall else "FAIL"
    verdict, reason = _decide(cfg, ann_mean, ann_verdict, compared)
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
        "queries": len(queries.query_ids),
        "queries_judged": len(judged.query_ids),
        "queries_left_out": queries.left_out,
        "queries_truncated": encoder.truncated,
        "k": RECALL_K,
        "ann_recall": round(ann_mean, 6),
        "min_ann_recall": cfg.min_ann_recall,
        "ann_verdict": ann_verdict,
        "ann_recall_by_ef_search": tried,
        "worst_ann_recall": round(float(faithful.min()), 6),
        METRIC: round(float(recall.mean()), 6) if len(recall) else None,
        "latency_ms": _latency(found.seconds),
        "regression": compared,
        # The release this check compared against (or found live): the release job
        # goes live only if it still is.
        "live_release": None if baseline is None else baseline.release,
        "seconds": round(time.perf_counter() - started, 3),
    }
    rel = layout.report(cfg.model, cfg.run_id, report_kind(cfg.corpus))
    store.write_json(rel, report)
    log.info(
        "search check of %s %s: %s (ANN recall@10 %.4f over %d queries, recall@10 %s over "
        "%d judged): %s", cfg.corpus, table, verdict, ann_mean, report["queries"],
        report[METRIC], report["queries_judged"], reason,
    )  # fmt: skip
    if verdict != "PASS":
        raise GateRefusedError(
            f"search check of corpus {cfg.corpus!r} for release {cfg.run_id}: {verdict}: "
            f"{reason}; no release is made (report: {store.url(rel)})"
        )
    keys = ("verdict", "reason", "release", "version", "corpus", "queries", "ann_recall", METRIC)
    return {**{k: report[k] for k in keys}, "table": table, "report": store.url(rel),
            "compared_with": (compared.get("with") or {}).get("release")}  # fmt: skip


def _faithful_ef_search(
    index: VectorIndex,
    table: str,
    vectors: np.ndarray,
    exact: Any,
    ef_search: int,
    cfg: SearchCheckConfig,
) -> tuple[int, Any, np.ndarray, list[dict[str, float]]]:
    """The smallest ``ef_search`` at which the table is faithful: the load's, doubled
    while its ANN recall is under ``min_ann_recall``, up to ``max_ef_search``. Returns it
    (or the largest tried), its results, its recall per query and every mean tried.

    How many candidates an HNSW search needs depends on the corpus (near-duplicates need
    more: docs/BENCHMARKS.md, "Vector index"), so it is measured here, and the release
    records what its search service must search with."""
    tried: list[dict[str, float]] = []
    while True:
        found = index.search(table, vectors, RECALL_K, ef_search=ef_search)
        faithful = ann_recall([1 - d for d in found.distances], exact, RECALL_K)
        tried.append({"ef_search": ef_search, "ann_recall": round(float(faithful.mean()), 6)})
        if faithful.mean() >= cfg.min_ann_recall or ef_search >= cfg.max_ef_search:
            break
        ef_search = min(2 * ef_search, cfg.max_ef_search)
    if len(tried) > 1:
        log.warning(
            "table %s: ANN recall@10 %s at ef_search %s, under %.0f%%: searched with "
            "ef_search %d (%.4f); the release records it for its search service",
            table, tried[0]["ann_recall"], tried[0]["ef_search"], 100 * cfg.min_ann_recall,
            ef_search, tried[-1]["ann_recall"],
        )  # fmt: skip
    return ef_search, found, faithful, tried


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


def _every_id_once(
    store: ArtifactStore, index: VectorIndex, eset: EmbeddingSet, table: str
) -> None:
    """The table holds the corpus: as many rows as the embedding set (its primary key
    makes each id unique), and when not, which ids are missing.

    :raises BadInputError: a corpus id missing from the table, named.
    """
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


def _compare(
    store: ArtifactStore,
    index: VectorIndex,
    cfg: SearchCheckConfig,
    baseline: Release | None,
    queries: Any,
    recall: np.ndarray,
) -> dict[str, Any]:
    """Recall@10 paired with the release this one replaces, on its own table and encoder."""
    if baseline is None or cfg.corpus not in baseline.corpora:
        what = "no live release" if baseline is None else (
            f"the live {'version ' + baseline.version if baseline.legacy else 'release ' + str(baseline.release)} "
            f"has no {cfg.corpus!r} embeddings"
        )  # fmt: skip
        log.info("first release of corpus %s: %s; recall@10 is reported only", cfg.corpus, what)
        return {
            "verdict": "NOT_COMPARED",
            "reason": f"first release of this corpus ({what})",
            "with": None,
        }
    live = baseline.corpus(cfg.corpus)
    if live.index.get("location") != index.location:
        raise BadInputError(
            f"the live release {baseline.release} has its {cfg.corpus!r} table in "
            f"{live.index.get('location')}, this run's index is {index.location}: the search "
            "check compares both in one index; point this run at the live release's index"
        )
    known = {t.name for t in index.tables(cfg.model)}
    if live.table not in known:
        raise BadInputError(
            f"the live release {baseline.release}'s table {live.table} is not in "
            f"{index.location}: production's own table is gone; restore it before releasing"
        )
    encoder = ReleaseEncoder.for_release(store, baseline, cfg.corpus)
    theirs = index.search(
        live.table, encoder.queries(queries.texts), RECALL_K,
        ef_search=live.index.get("ann", {}).get("ef_search"),
    )  # fmt: skip
    reference = recall_of(theirs.ids, queries.relevant, RECALL_K)
    with_ = {
        "release": baseline.release,
        "version": baseline.version,
        "table": live.table,
        METRIC: round(float(reference.mean()), 6),
    }
    if not reference.any():  # d = (cand - ref) / ref is undefined; nothing can be lost
        reason = (
            f"the live release finds none of the {len(reference)} queries' relevant products "
            f"in its top {RECALL_K} (recall@10 0); this one: {float(recall.mean()):.4f}"
        )
        log.warning("search comparison: %s", reason)
        return {
            "verdict": "PASS",
            "reason": reason,
            "mode": cfg.regression,
            "with": with_,
            "gate": None,
        }
    result = gate(
        {METRIC: recall, "query_id": queries.query_ids},
        {METRIC: reference, "query_id": queries.query_ids},
        [METRIC],
        Mode.NO_REGRESSION,
        tolerance=cfg.tolerance,
        resamples=cfg.resamples,
        confidence=cfg.confidence,
        seed=cfg.seed,
    )
    out = {
        "verdict": str(result.verdict),
        "reason": result.reason,
        "mode": cfg.regression,
        "with": with_,
        "gate": result.to_dict(),
        "gate_fallback": None,
    }
    if result.verdict == "INCONCLUSIVE":
        out["gate_fallback"] = _gate_decided(store, cfg, baseline.version)
        if out["gate_fallback"]:
            log.warning(
                "search over the whole corpus is INCONCLUSIVE against release %s (%s): the "
                "release rests on %s (counted in the report as gate_fallback)",
                baseline.release, result.reason, out["gate_fallback"],
            )  # fmt: skip
    return out


def _gate_decided(store: ArtifactStore, cfg: SearchCheckConfig, reference: str) -> str | None:
    """When this run's quality gate compared the same pair (this version against the
    live release's) on recall@10 and said PASS: which gate said so. Sparse relevance
    labels over a whole corpus often leave the search comparison undecided at any
    practical eval size (docs/SEARCH.md); the gate's recall@10 over fixed pools of 100
    candidates per query decides on the same queries. None when it did not."""
    rel = layout.report(cfg.model, cfg.run_id, cfg.gate_report)
    if not store.exists(rel):
        return None
    decision = store.read_json(rel)
    same_pair = (
        decision.get("candidate", {}).get("version") == cfg.target_version
        and decision.get("reference", {}).get("version") == reference
    )
    recall = next((m for m in decision.get("metrics", []) if m.get("metric") == METRIC), None)
    if not same_pair or recall is None or recall.get("verdict") != "PASS":
        return None
    low = recall.get("ci_low")
    return (
        f"the quality gate's {METRIC} over pools of candidates ({store.url(rel)}: PASS, "
        f"d {recall.get('d'):+.3%}, lower bound {low:+.3%})"
    )


def _decide(
    cfg: SearchCheckConfig, ann_recall: float, ann_verdict: str, compared: dict[str, Any]
) -> tuple[str, str]:
    if ann_verdict != "PASS":
        return "FAIL", (
            f"the index is not faithful: its top 10 holds {ann_recall:.2%} of the exact top 10, "
            f"below {cfg.min_ann_recall:.0%} even at ef_search {cfg.max_ef_search} (load it again "
            "with a larger hnsw_m / hnsw_ef_construction)"
        )
    verdict = compared["verdict"]
    if verdict in ("NOT_COMPARED", "NOT_MEASURED"):
        return (
            "PASS",
            f"the index is faithful ({ann_recall:.2%}); {compared['reason']}: reported only",
        )
    if cfg.regression == "report":
        return "PASS", (
            f"the index is faithful ({ann_recall:.2%}); search against release "
            f"{compared['with']['release']}: {verdict} (reported only: {compared['reason']})"
        )
    if verdict == "INCONCLUSIVE" and compared.get("gate_fallback"):
        return "PASS", (
            f"the index is faithful ({ann_recall:.2%}); search over the whole corpus against "
            f"release {compared['with']['release']} is INCONCLUSIVE ({compared['reason']}); "
            f"decided by {compared['gate_fallback']}"
        )
    if verdict != "PASS":
        return (
            verdict,
            f"search against release {compared['with']['release']}: {compared['reason']}",
        )
    return "PASS", (
        f"the index is faithful ({ann_recall:.2%}); search is no worse than release "
        f"{compared['with']['release']}: {compared['reason']}"
    )


def _latency(seconds: np.ndarray) -> dict[str, float] | None:
    if not len(seconds):
        return None
    ms = seconds * 1000
    return {"p50": round(float(np.percentile(ms, 50)), 3), "p99": round(float(np.percentile(ms, 99)), 3),
            "queries": len(ms)}  # fmt: skip


if __name__ == "__main__":
    main_for("search_check", SearchCheckConfig, search_check)
