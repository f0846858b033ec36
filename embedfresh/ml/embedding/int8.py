"""Optional int8 embeddings: dynamic quantisation of the encoder's ``nn.Linear`` layers
(CPU only) and the parity gate they must pass before anything is published.

The gate embeds the eval split's queries and products twice with the job's own path
(bucketing, same truncation), fp32 and int8, computes recall@10 per query with
:func:`embedfresh.ml.evaluation.recall_at_k` and runs the paired bootstrap of
:func:`embedfresh.ml.gate.decision.gate` in ``parity`` mode (tolerance 0.001, the 0.1% SLA).
Only PASS lets the job write; anything else is a :class:`GateRefusedError` (exit 3).
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from embedfresh.core.exit_codes import BadInputError
from embedfresh.ml.embedding.bucketing import VariableTokenizer
from embedfresh.ml.embedding.encode import embed_texts
from embedfresh.ml.gate.decision import DEFAULT_TOLERANCE, GateResult, Mode, gate

if TYPE_CHECKING:
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.backends import Backend
    from embedfresh.ml.model.relevance import RelevanceModel

log = logging.getLogger("embedfresh.jobs.embed")

PARITY_METRIC = "recall_at_10"


def quantize_int8(model: RelevanceModel, backend: Backend) -> RelevanceModel:
    """A copy of ``model`` whose encoder ``nn.Linear`` layers are dynamically quantised
    to int8 (weights int8, activations quantised per batch at run time).

    :raises BadInputError: on any backend but CPU (quantised kernels are CPU-only).
    """
    import torch
    from torch import nn

    if backend.device.type != "cpu":
        raise BadInputError(
            f"quantize=int8 runs on the CPU backend only (dynamic int8 kernels are CPU "
            f"kernels); got backend {backend.name!r} ({backend.device}): use backend=cpu "
            "or quantize=none"
        )
    out = copy.deepcopy(model).eval()
    with warnings.catch_warnings():
        # torch.ao.quantization is deprecated in favour of torchao; it still works in 2.9.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        # Per-output-channel weight scales: measured on minilm (400 texts), median
        # 1 - cosine to fp32 0.023 against 0.058 with one scale per tensor.
        qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        out.encoder = torch.ao.quantization.quantize_dynamic(
            out.encoder, {nn.Linear: qconfig}, dtype=torch.qint8
        )
    return out


def parity_gate(
    store: ArtifactStore,
    dataset: str,
    fp32: RelevanceModel,
    int8: RelevanceModel,
    backend: Backend,
    tokenizer: VariableTokenizer,
    lengths: Sequence[int],
    token_budget: int,
    tolerance: float = DEFAULT_TOLERANCE,
) -> tuple[GateResult, dict[str, Any]]:
    """Recall@10 on the eval split of ``dataset``, int8 against fp32, in parity mode."""
    from embedfresh.ml.data.reader import read_eval
    from embedfresh.ml.evaluation import (
        DEFAULT_RECALL_POOL,
        _retrieval_sets,
        recall_at_k,
        recall_pools,
    )

    examples = read_eval(store, dataset)
    query_ids, query_texts, _, product_texts, relevant = _retrieval_sets(examples)
    if len(query_ids) == 0:
        raise BadInputError(
            f"eval split of {dataset!r} has no relevant (label 1) pairs: "
            "the int8 parity gate needs recall@10"
        )
    # The evaluation's own recall@10 definition: over a fixed candidate pool per query
    # (docs/GATE.md), where more queries narrow the interval; all products if too few.
    pool = DEFAULT_RECALL_POOL
    pools = None
    if pool is not None and pool < len(product_texts):
        pools = recall_pools(query_ids, relevant, len(product_texts), pool)
    hidden = fp32.spec.embedding_dim
    # The model's own prompts, as the embed job and the evaluation put them.
    query_texts = [fp32.spec.prompt("query") + t for t in query_texts]
    product_texts = [fp32.spec.prompt("document") + t for t in product_texts]
    recalls = {}
    for name, model in (("fp32", fp32), ("int8", int8)):
        q = embed_texts(model, backend, tokenizer, query_texts, lengths, token_budget, hidden)
        p = embed_texts(model, backend, tokenizer, product_texts, lengths, token_budget, hidden)
        recalls[name] = recall_at_k(q, p, relevant, pools=pools)
    result = gate(
        {PARITY_METRIC: recalls["int8"], "query_id": query_ids},
        {PARITY_METRIC: recalls["fp32"], "query_id": query_ids},
        [PARITY_METRIC],
        Mode.PARITY,
        tolerance=tolerance,
    )
    summary = {
        "verdict": str(result.verdict),
        "metric": PARITY_METRIC,
        "recall_at_10_fp32": round(float(np.mean(recalls["fp32"])), 6),
        "recall_at_10_int8": round(float(np.mean(recalls["int8"])), 6),
        "n_queries": len(query_ids),
        "n_products": len(product_texts),
        "recall_pool": pool if pools is not None else None,
        "dataset": dataset,
        "gate": result.to_dict(),
    }
    log.info(
        "int8 parity gate: %s (recall@10 fp32 %.6f, int8 %.6f, %d queries): %s",
        result.verdict,
        summary["recall_at_10_fp32"],
        summary["recall_at_10_int8"],
        len(query_ids),
        result.reason,
    )
    return result, summary
