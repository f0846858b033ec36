"""Search as its users live with it: queries against a whole corpus.

- **The index is faithful**: an approximate index's top-k against the exact top-k over
  the same vectors (:func:`exact_top_k` scans the verified embedding parts, one at a
  time, so memory stays that of one part); :func:`ann_recall` per query, ties counted.
- **The vectors of judged documents** (:func:`vectors_of`), which a condensed list
  orders by their cosine (:mod:`embedfresh.ml.ranking`).

Used by the search check before a release goes live (:mod:`embedfresh.jobs.search_check`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from embedfresh.core.embedding_sets import EmbeddingSet, iter_parts
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore


@dataclass(frozen=True)
class TopK:
    """Per query, ``k`` ids nearest first and their cosine similarities."""

    ids: list[np.ndarray]
    similarities: list[np.ndarray]


def exact_top_k(
    parts: Iterable[tuple[np.ndarray, np.ndarray]], queries: np.ndarray, k: int
) -> TopK:
    """Per query, its ``k`` nearest vectors by cosine (the vectors are unit length: the
    largest dot products), nearest first, over every ``(ids, vectors)`` of ``parts``
    (an embedding set's parts, or a table's rows in batches)."""
    n = len(queries)
    best_scores = np.full((n, 0), -np.inf, dtype=np.float32)
    best_ids: np.ndarray | None = None
    q = np.ascontiguousarray(queries, dtype=np.float32)
    for ids, vectors in parts:
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


def set_parts(store: ArtifactStore, eset: EmbeddingSet) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(ids, vectors)`` of every part of ``eset``: :func:`exact_top_k`'s ``parts``."""
    for _, ids, vectors in iter_parts(store, eset):
        yield ids, vectors


def vectors_of(store: ArtifactStore, eset: EmbeddingSet, ids: np.ndarray) -> np.ndarray:
    """The vectors of ``ids`` (sorted, all in ``eset``) in their order, read from the
    verified embedding parts one at a time.

    :raises BadInputError: an id the embedding set does not hold.
    """
    out: np.ndarray | None = None
    seen = np.zeros(len(ids), dtype=bool)
    for _, part_ids, vectors in iter_parts(store, eset):
        if out is None:
            out = np.zeros((len(ids), vectors.shape[1]), dtype=np.float32)
        at = np.searchsorted(ids, part_ids).clip(max=max(len(ids) - 1, 0))
        hit = ids[at] == part_ids if len(ids) else np.zeros(len(part_ids), bool)
        out[at[hit]] = vectors[hit]
        seen[at[hit]] = True
    if out is None or not seen.all():
        missing = ids[~seen][:5].tolist() if len(ids) else []
        raise BadInputError(f"embedding set of {eset.corpus!r} lacks ids {missing}")
    return out
