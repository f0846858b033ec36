"""Texts to unit vectors in memory: length bucketing (:mod:`embedfresh.ml.embedding.bucketing`)
and the model's ``embed``, or on eager CPU/CUDA its unpadded twin
(:mod:`embedfresh.ml.embedding.packed`). The embed job runs it per corpus shard; the int8
quality gate and ``bench/embeddings.py`` run it on plain lists of texts, without the store."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from embedfresh.core.progress import Progress
from embedfresh.ml.embedding.bucketing import Plan, VariableTokenizer, make_batches

if TYPE_CHECKING:
    import torch
    from torch import nn

    from embedfresh.ml.backends import Backend


@dataclass
class EncodeStats:
    """What :func:`embed_plan` saw: the distinct input shapes."""

    shapes: set[tuple[int, int]] = field(default_factory=set)


def uses_packed(model: nn.Module, backend: Backend, packed: bool = True) -> bool:
    """Whether :func:`embed_plan` runs the packed forward: asked for, on an eager CPU/CUDA
    device, and a mean-pooled BERT encoder of ours without Dense modules (any other runs
    padded)."""
    from embedfresh.ml.model.encoder import BertEncoder

    return (
        packed
        and backend.device.type in ("cpu", "cuda")
        and isinstance(getattr(model, "encoder", None), BertEncoder)
        and model.encoder.pooling == "mean"
        and model.encoder.dense is None
    )


def embed_plan(
    model: nn.Module,
    backend: Backend,
    plan: Plan,
    rows: int,
    hidden: int,
    stats: EncodeStats | None = None,
    packed: bool = True,
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    progress: Progress | None = None,
) -> np.ndarray:
    """Run every batch of ``plan`` through ``model.embed`` (each batch's rows counted in
    ``progress``); float32 [rows, hidden] in the
    original text order, L2-normalised. ``packed``: on a CPU/CUDA device, the unpadded
    forward of :func:`embedfresh.ml.embedding.packed.packed_embed` instead (same vectors; never on
    XLA/Neuron, which need the static shapes). ``forward``: the forward to call instead
    of either (the compiled one, :mod:`embedfresh.ml.embedding.compiled`)."""
    import torch
    import torch.nn.functional as F

    from embedfresh.ml.embedding.packed import packed_embed, prepare

    if forward is None and uses_packed(model, backend, packed):
        layers = prepare(model.encoder)

        def packed_forward(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return packed_embed(model.encoder, ids, mask, layers)

        forward = packed_forward
    elif forward is None:
        forward = model.embed

    vectors = np.zeros((rows, hidden), dtype=np.float32)
    with backend.inference():  # no_grad on XLA: inference tensors break its graphs
        for batch in plan.batches:
            dev = backend.to_device(
                {
                    "ids": torch.from_numpy(batch.input_ids),
                    "mask": torch.from_numpy(batch.attention_mask),
                }
            )
            with backend.autocast():
                out = forward(dev["ids"], dev["mask"])
            # Normalise the whole static batch, then drop the padding rows on the host: a
            # slice to ``batch.real`` on the device would be one more XLA graph per count.
            out = F.normalize(out.float(), p=2, dim=1)
            backend.mark_step()
            vectors[batch.index] = out.to("cpu").numpy()[: batch.real]
            if stats is not None:
                stats.shapes.add(tuple(batch.input_ids.shape))
            if progress is not None:
                progress.advance(batch.real)
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
    packed: bool = True,
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> np.ndarray:
    """Tokenise, bucket and embed ``texts``; float32 [len(texts), hidden] in their order
    (``forward``: as :func:`embed_plan` takes it)."""
    token_ids, _ = tokenizer(texts)
    plan = make_batches(token_ids, lengths, token_budget, static=static)
    return embed_plan(model, backend, plan, len(texts), hidden, packed=packed, forward=forward)
