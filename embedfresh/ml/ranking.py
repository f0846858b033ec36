"""Ranking metrics on graded judgments (:mod:`embedfresh.ml.data.judgments`), per query.

- ``ndcg_at_10``: normalised discounted cumulative gain of the first 10, gains the
  grades (0-3, linear, as trec_eval, BEIR and MTEB score), discount ``1/log2(rank+1)``,
  normalised by the best order of the query's judged documents.
- ``recall_at_10``, ``recall_at_100``: the share of the query's relevant documents
  (grade > 0) in the first 10 / 100.
- ``mrr_at_10``: 1 / the rank of the first relevant document in the first 10, else 0.
- ``judged_at_10``: the share of the first 10 that is judged (1 for complete judgments).

Complete judgments score the ranking as it is (an unlisted document is grade 0).
Incomplete ones score the **condensed list** (Sakai 2007): unjudged documents removed
before scoring, i.e. the query's judged documents in the order of the model's scores;
``judged_at_10`` then says how much of what users see was judged at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from embedfresh.ml.data.judgments import Judgments

K = 10
DEPTH = 100
"""How deep a ranking is read: recall@100."""
METRICS = ("ndcg_at_10", "recall_at_10", "recall_at_100", "mrr_at_10")
"""The ranking metrics every evaluation reports per query (``judged_at_10`` beside them
where the whole ranking was read)."""
_DISCOUNT = 1.0 / np.log2(np.arange(2, K + 2))


def _dcg(gains: np.ndarray) -> float:
    top = gains[:K].astype(np.float64)
    return float(top @ _DISCOUNT[: len(top)])


def score_rankings(
    judgments: Judgments,
    ranked: Sequence[np.ndarray] | None = None,
    judged_scores: Sequence[np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Per query of ``judgments``, its metrics (:data:`METRICS`, and ``judged_at_10``
    when ``ranked`` is given).

    :param ranked: per query, the ids a search returned, best first (at least
        :data:`DEPTH` where the corpus has them): scored as is for complete judgments.
    :param judged_scores: per query, the model's score of each of its judged documents
        (in :meth:`Judgments.of` order): the condensed list of incomplete judgments.
    """
    if judgments.complete and ranked is None:
        raise ValueError("complete judgments score a ranking: pass ranked")
    if not judgments.complete and judged_scores is None:
        raise ValueError("incomplete judgments score condensed lists: pass judged_scores")
    n = len(judgments)
    out = {name: np.zeros(n, dtype=np.float64) for name in METRICS}
    judged = np.zeros(n, dtype=np.float64) if ranked is not None else None
    for i in range(n):
        docs, grades = judgments.of(i)
        if judgments.complete:
            found = np.asarray(ranked[i])[:DEPTH]
            at = np.searchsorted(docs, found).clip(max=len(docs) - 1)
            gains = np.where(docs[at] == found, grades[at], 0)
        else:
            order = np.argsort(-np.asarray(judged_scores[i]), kind="stable")
            gains = grades[order][:DEPTH]
        if judged is not None:
            top = np.asarray(ranked[i])[:K]
            judged[i] = 1.0 if judgments.complete else np.isin(top, docs).mean() if len(top) else 0
        ideal = _dcg(np.sort(grades)[::-1])
        relevant = max(int((grades > 0).sum()), 1)
        hits = gains > 0
        out["ndcg_at_10"][i] = _dcg(gains) / ideal
        out["recall_at_10"][i] = hits[:K].sum() / relevant
        out["recall_at_100"][i] = hits[:DEPTH].sum() / relevant
        first = np.flatnonzero(hits[:K])
        out["mrr_at_10"][i] = 1.0 / (first[0] + 1) if len(first) else 0.0
    if judged is not None:
        out["judged_at_10"] = judged
    return out
