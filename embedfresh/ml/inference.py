"""Batched inference with fixed shapes: relevance scores and embeddings.

Every batch has exactly ``batch_size`` rows (the last one padded by repeating rows,
whose outputs are dropped), so an XLA/Neuron device or a compiled graph sees one
shape only.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from embedfresh.ml.backends import Backend
from embedfresh.ml.model.relevance import RelevanceModel
from embedfresh.ml.model.tokenizer import Tokenized


def _fixed_batches(n: int, batch_size: int) -> Iterator[tuple[np.ndarray, int]]:
    for start in range(0, n, batch_size):
        index = np.arange(start, min(start + batch_size, n))
        real = len(index)
        if real < batch_size:  # pad with the first row: same shape, outputs discarded
            index = np.concatenate([index, np.full(batch_size - real, index[0])])
        yield index, real


def score(
    model: RelevanceModel,
    backend: Backend,
    queries: Tokenized,
    products: Tokenized,
    features: np.ndarray,
    batch_size: int,
) -> np.ndarray:
    """Relevance probabilities (float64 [n]) of aligned (query, product, features) rows."""
    with backend.inference():
        return _score(model, backend, queries, products, features, batch_size)


def _score(
    model: RelevanceModel,
    backend: Backend,
    queries: Tokenized,
    products: Tokenized,
    features: np.ndarray,
    batch_size: int,
) -> np.ndarray:
    model.eval()
    out = []
    for index, real in _fixed_batches(len(features), batch_size):
        batch = backend.to_device(
            {
                "q": torch.from_numpy(queries.input_ids[index]),
                "qm": torch.from_numpy(queries.attention_mask[index]),
                "p": torch.from_numpy(products.input_ids[index]),
                "pm": torch.from_numpy(products.attention_mask[index]),
                "f": torch.from_numpy(features[index]),
            }
        )
        with backend.autocast():
            logits = model(batch["q"], batch["qm"], batch["p"], batch["pm"], batch["f"])
        backend.mark_step()
        out.append(torch.sigmoid(logits.float()).to("cpu").numpy()[:real])
    return np.concatenate(out).astype(np.float64) if out else np.zeros(0)


def embed(
    model: RelevanceModel, backend: Backend, tokens: Tokenized, batch_size: int
) -> np.ndarray:
    """L2-normalised embeddings (float32 [n, hidden]) of tokenised texts."""
    with backend.inference():
        return _embed(model, backend, tokens, batch_size)


def _embed(
    model: RelevanceModel, backend: Backend, tokens: Tokenized, batch_size: int
) -> np.ndarray:
    model.eval()
    out = []
    for index, real in _fixed_batches(len(tokens.input_ids), batch_size):
        batch = backend.to_device(
            {
                "ids": torch.from_numpy(tokens.input_ids[index]),
                "mask": torch.from_numpy(tokens.attention_mask[index]),
            }
        )
        with backend.autocast():
            vectors = model.embed(batch["ids"], batch["mask"])
        backend.mark_step()
        out.append(vectors.float().to("cpu").numpy()[:real])
    hidden = model.spec.embedding_dim
    return np.concatenate(out) if out else np.zeros((0, hidden), dtype=np.float32)
