"""Texts to unit vectors in memory: length bucketing (:mod:`jobs.embedding.bucketing`)
and the model's ``embed``. The embed job runs it per corpus shard; the int8 parity gate
and ``bench/embeddings.py`` run it on plain lists of texts, without the store."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from jobs.embedding.bucketing import Plan, VariableTokenizer, make_batches

if TYPE_CHECKING:
    from torch import nn

    from jobs.backends import Backend


@dataclass
class EncodeStats:
    """What :func:`embed_plan` saw: the distinct input shapes."""

    shapes: set[tuple[int, int]] = field(default_factory=set)


def embed_plan(
    model: nn.Module,
    backend: Backend,
    plan: Plan,
    rows: int,
    hidden: int,
    stats: EncodeStats | None = None,
) -> np.ndarray:
    """Run every batch of ``plan`` through ``model.embed``; float32 [rows, hidden] in the
    original text order, L2-normalised."""
    import torch
    import torch.nn.functional as F

    vectors = np.zeros((rows, hidden), dtype=np.float32)
    with torch.inference_mode():
        for batch in plan.batches:
            dev = backend.to_device(
                {
                    "ids": torch.from_numpy(batch.input_ids),
                    "mask": torch.from_numpy(batch.attention_mask),
                }
            )
            with backend.autocast():
                out = model.embed(dev["ids"], dev["mask"])
            backend.mark_step()
            out = F.normalize(out[: batch.real].float(), p=2, dim=1)
            vectors[batch.index] = out.to("cpu").numpy()
            if stats is not None:
                stats.shapes.add(tuple(batch.input_ids.shape))
    return vectors


def embed_texts(
    model: nn.Module,
    backend: Backend,
    tokenizer: VariableTokenizer,
    texts: Sequence[str],
    lengths: Sequence[int],
    token_budget: int,
    hidden: int,
    static: bool = True,
) -> np.ndarray:
    """Tokenise, bucket and embed ``texts``; float32 [len(texts), hidden] in their order."""
    token_ids, _ = tokenizer(texts)
    plan = make_batches(token_ids, lengths, token_budget, static=static)
    return embed_plan(model, backend, plan, len(texts), hidden)
