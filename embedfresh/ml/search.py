"""Search as its users live with it: queries against a whole corpus, judged two ways.

- **The index is faithful**: an approximate index's top-k against the exact top-k over
  the same vectors (:func:`exact_top_k` scans the verified embedding parts, one at a
  time, so memory stays that of one part); :func:`ann_recall` per query, ties counted.
- **Search is as good**: recall@k against the eval split's relevance labels
  (:func:`recall_of`), over every product of the corpus, not the gate's pool of 100.

The queries are those of the eval split whose relevant products are all in the corpus
(:func:`eval_queries`). Used by the search check before a release goes live
(:mod:`embedfresh.jobs.search_check`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from embedfresh.core.embedding_sets import EmbeddingSet, iter_parts
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.data.reader import read_eval


@dataclass(frozen=True)
class EvalQueries:
    """The eval split's queries: every one searches (the index's faithfulness), those
    whose relevant products are all in the corpus also judge recall."""

    query_ids: np.ndarray
    texts: list[str]
    relevant: list[np.ndarray]
    """Per query, its relevant products' ids (as the corpus types them); may be empty."""
    judged: np.ndarray
    """Per query: it has relevant products and all of them are in the corpus."""

    def subset(self, mask: np.ndarray) -> EvalQueries:
        """The queries where ``mask`` is true."""
        keep = np.flatnonzero(mask)
        return EvalQueries(
            query_ids=self.query_ids[keep],
            texts=[self.texts[i] for i in keep],
            relevant=[self.relevant[i] for i in keep],
            judged=self.judged[keep],
        )

    @property
    def left_out(self) -> int:
        """Queries with relevant products of which some are not in the corpus."""
        return int(
            sum(1 for r, j in zip(self.relevant, self.judged, strict=True) if len(r) and not j)
        )


def eval_queries(
    store: ArtifactStore,
    dataset: str,
    id_type: str,
    missing: Callable[[np.ndarray], np.ndarray],
) -> EvalQueries:
    """Every query of the eval split, and which of them recall can be judged on: those
    whose relevant products are all in the corpus.

    :param id_type: the corpus's id type (``int64`` or ``string``); the eval split's
        product ids are compared as that type.
    :param missing: which of some product ids the corpus lacks (the index's
        :meth:`~embedfresh.core.index.VectorIndex.missing_ids`).
    """
    examples = read_eval(store, dataset)
    text: dict[int, str] = {}
    relevant: dict[int, list] = {}
    for qid, pid, label, query in zip(
        examples.query_ids, examples.product_ids, examples.labels, examples.queries, strict=True
    ):
        text.setdefault(int(qid), query)
        relevant.setdefault(int(qid), [])
        if label == 1:
            relevant[int(qid)].append(int(pid) if id_type == "int64" else str(pid))
    wanted = [i for ids in relevant.values() for i in ids]
    absent = set(missing(np.unique(np.asarray(wanted))).tolist()) if wanted else set()
    order = sorted(text)
    rel = [np.unique(np.asarray(relevant[q])) for q in order]
    return EvalQueries(
        query_ids=np.asarray(order, dtype=np.int64),
        texts=[text[q] for q in order],
        relevant=rel,
        judged=np.asarray([len(r) > 0 and not absent.intersection(r.tolist()) for r in rel]),
    )


@dataclass(frozen=True)
class TopK:
    """Per query, ``k`` ids nearest first and their cosine similarities."""

    ids: list[np.ndarray]
    similarities: list[np.ndarray]


def exact_top_k(store: ArtifactStore, eset: EmbeddingSet, queries: np.ndarray, k: int) -> TopK:
    """Per query, its ``k`` nearest vectors by cosine (the vectors are unit length: the
    largest dot products), nearest first, over every part of ``eset``."""
    n = len(queries)
    best_scores = np.full((n, 0), -np.inf, dtype=np.float32)
    best_ids: np.ndarray | None = None
    q = np.ascontiguousarray(queries, dtype=np.float32)
    for _, ids, vectors in iter_parts(store, eset):
        scores = q @ vectors.T
        take = min(k, scores.shape[1])
        top = np.argpartition(-scores, take - 1, axis=1)[:, :take]
        part_scores = np.take_along_axis(scores, top, axis=1)
        part_ids = ids[top]
        if best_ids is None:
            best_ids = np.empty((n, 0), dtype=part_ids.dtype)
        merged_scores = np.concatenate([best_scores, part_scores], axis=1)
        merged_ids = np.concatenate([best_ids.astype(part_ids.dtype), part_ids], axis=1)
        keep = np.argsort(-merged_scores, axis=1, kind="stable")[:, :k]
        best_scores = np.take_along_axis(merged_scores, keep, axis=1)
        best_ids = np.take_along_axis(merged_ids, keep, axis=1)
    if best_ids is None:
        return TopK([np.asarray([]) for _ in range(n)], [np.zeros(0) for _ in range(n)])
    return TopK(list(best_ids), list(best_scores.astype(np.float64)))


#: Two cosines closer than this are a tie, as ann-benchmarks' k-NN recall counts them
#: (epsilon 1e-3 on the distance): a corpus of near-duplicate texts (a product in five
#: colours) puts many vectors within it of the 10th neighbour, and which of them an
#: exact sort lists tenth is arbitrary. With 1e-5 (float rounding only), one build of
#: bench/vector_index.py's 100,000 MiniLM products read 0.905 at ef_search 100, 0.928
#: with 1e-3.
TIE = 1e-3


def ann_recall(found_similarities: list[np.ndarray], exact: TopK, k: int) -> np.ndarray:
    """Per query, the share of the ``k`` results an approximate search found that are as
    near as the exact ``k``-th neighbour (ties included): the k-NN recall of
    ann-benchmarks. Many near-duplicate items (a product in five colours) sit at equal
    distances, and which of them an exact sort lists tenth is arbitrary: counting ids
    would call a correct answer wrong."""
    out = np.zeros(len(exact.ids), dtype=np.float64)
    for i, (got, truth) in enumerate(zip(found_similarities, exact.similarities, strict=True)):
        want = min(k, len(truth))
        if want == 0:
            out[i] = 1.0
            continue
        threshold = truth[want - 1] - TIE
        out[i] = min(int((np.asarray(got[:k]) >= threshold).sum()), want) / want
    return out


def recall_of(found: list[np.ndarray], relevant: list[np.ndarray], k: int) -> np.ndarray:
    """Per query, the share of its relevant products among ``found``'s first ``k``
    (the evaluation's recall@k, over the whole corpus)."""
    out = np.zeros(len(relevant), dtype=np.float64)
    for i, (got, rel) in enumerate(zip(found, relevant, strict=True)):
        out[i] = np.isin(rel, got[:k]).sum() / len(rel)
    return out
