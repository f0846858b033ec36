"""Batched inference of the relevance head: its probability for (query, product) pairs.

Embeddings go through :mod:`embedfresh.ml.embedding` (what the corpus and the release's
queries are embedded with).

Every batch has exactly ``batch_size`` rows (the last one padded by repeating rows,
whose outputs are dropped). Where the backend needs static shapes (an XLA/Neuron device,
a compiled graph) every batch is also ``max_length`` wide, so it sees one shape only;
eager backends take each batch at its longest text
(:func:`~embedfresh.ml.model.tokenizer.trim_padding`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from embedfresh.core.progress import Progress
from embedfresh.ml.backends import Backend
from embedfresh.ml.model.relevance import RelevanceModel
from embedfresh.ml.model.tokenizer import Tokenized, trim_padding


def _fixed_batches(n: int, batch_size: int) -> Iterator[tuple[np.ndarray, int]]:
    for start in range(0, n, batch_size):
        index = np.arange(start, min(start + batch_size, n))
        real = len(index)
        if real < batch_size:  # pad with the first row: same shape, outputs discarded
            index = np.concatenate([index, np.full(batch_size - real, index[0])])
        yield index, real


def _texts(backend: Backend, tokens: Tokenized, index: np.ndarray) -> tuple[torch.Tensor, ...]:
    """Rows ``index`` of ``tokens``: ids and mask, trimmed unless shapes are static."""
    ids, mask = tokens.input_ids[index], tokens.attention_mask[index]
    if not backend.static_shapes:
        ids, mask = trim_padding(ids, mask)
    return torch.from_numpy(ids), torch.from_numpy(mask)


def score(
    model: RelevanceModel,
    backend: Backend,
    queries: Tokenized,
    products: Tokenized,
    features: np.ndarray,
    batch_size: int,
    progress: Progress | None = None,
) -> np.ndarray:
    """Relevance probabilities (float64 [n]) of aligned (query, product, features) rows;
    each batch's rows counted in ``progress``."""
    with backend.inference():
        return _score(model, backend, queries, products, features, batch_size, progress)


def _score(
    model: RelevanceModel,
    backend: Backend,
    queries: Tokenized,
    products: Tokenized,
    features: np.ndarray,
    batch_size: int,
    progress: Progress | None,
) -> np.ndarray:
    model.eval()
    out = []
    for index, real in _fixed_batches(len(features), batch_size):
        (q, qm), (p, pm) = _texts(backend, queries, index), _texts(backend, products, index)
        batch = backend.to_device(
            {"q": q, "qm": qm, "p": p, "pm": pm, "f": torch.from_numpy(features[index])}
        )
        with backend.autocast():
            logits = model(batch["q"], batch["qm"], batch["p"], batch["pm"], batch["f"])
        backend.mark_step()
        out.append(torch.sigmoid(logits.float()).to("cpu").numpy()[:real])
        if progress is not None:
            progress.advance(real)
    return np.concatenate(out).astype(np.float64) if out else np.zeros(0)
