"""The embed job's fast modes, reduced-precision copies of the encoder, and the quality
gate they must pass before anything is published.

- ``int8`` (:func:`quantize_int8`, CPU only): dynamic quantisation of the encoder's
  ``nn.Linear`` layers, calibrated (SmoothQuant) on the corpus's first shard.
- ``bf16`` (:func:`to_bf16`, CPU and CUDA): the whole encoder in bfloat16, pooled in fp32.
  Its GEMMs run on AMX / AVX512-BF16 where the CPU has them (5.4x fp32's GEMM rate on a
  Sapphire Rapids Xeon, measured 2026-11-27); elsewhere they are emulated and slower
  than fp32, which is logged and reported.

The gate asks the question a user asks of a fast mode, "is it worse?": a one-sided
non-inferiority test. It embeds the eval split's queries and products twice with the
job's own path (bucketing, the model's own truncation), fp32 and the fast mode, computes
recall@10 per query with :func:`embedfresh.ml.evaluation.recall_at_k` and runs the paired
bootstrap of :func:`embedfresh.ml.gate.decision.gate` in ``no_regression`` mode at
:data:`GATE_CONFIDENCE`: PASS when the lower bound of the relative difference
d = (fast - fp32) / fp32 is at least -0.1% (the SLA) at one-sided 95% confidence.
A fast mode that is better than fp32 passes; one whose interval lies entirely below
-0.1% FAILs; one that straddles it is INCONCLUSIVE and the reason says how many eval
queries would decide. Only PASS lets the job write; anything else is a
:class:`GateRefusedError` (exit 3). docs/GATE.md, "Fast modes: int8 and bf16 embeddings".
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from embedfresh.core import cpuinfo
from embedfresh.core.exit_codes import BadInputError
from embedfresh.ml.embedding.bucketing import VariableTokenizer
from embedfresh.ml.embedding.encode import embed_texts
from embedfresh.ml.gate.decision import DEFAULT_TOLERANCE, GateResult, Mode, gate

if TYPE_CHECKING:
    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.backends import Backend
    from embedfresh.ml.model.relevance import RelevanceModel

log = logging.getLogger("embedfresh.jobs.embed")

GATE_METRIC = "recall_at_10"
GATE_CONFIDENCE = 0.90
"""The two-sided bootstrap interval whose lower bound (its 5th percentile) the gate
compares with -0.1%: a one-sided test at 95%."""


CALIBRATION_TOKENS = 8192
"""Real tokens of calibration text (the corpus's first shard's, one text at a time so
no padding enters the statistics)."""
SMOOTHING_ALPHAS = (0.0, 0.5, 0.75)
"""Migration strengths tried per layer (0: no smoothing); the one with the smallest error
on the calibration tokens is kept."""
MAX_LAYER_ERROR = 0.10
"""A layer whose int8 output still differs from its fp32 output by more than this
(relative Frobenius error on the calibration tokens, best alpha) stays in fp32."""


BF16_BACKENDS = ("cpu", "cuda")


def native_bf16(backend: Backend) -> bool:
    """Whether ``backend``'s device runs bf16 GEMMs in hardware: AMX or AVX512-BF16 on a
    CPU (its ``/proc/cpuinfo`` flags: torch's own probes are private), compute capability
    8.0+ on an NVIDIA GPU."""
    if backend.device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    flags = set(cpuinfo.field("flags").split())
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def to_bf16(model: RelevanceModel, backend: Backend) -> tuple[RelevanceModel, dict[str, Any]]:
    """A copy of ``model`` whose encoder runs in bfloat16 (weights and activations; the
    packed forward pools in fp32 and every vector is normalised in fp32), and whether the
    device runs bf16 natively. Without native bf16 the GEMMs are emulated, slower than
    fp32 (logged as a warning; the vectors are the same).

    :raises BadInputError: on a backend other than CPU or CUDA (XLA/Neuron cast with their
        own compiler flags: ``--auto-cast``).
    """
    if backend.device.type not in BF16_BACKENDS:
        raise BadInputError(
            f"quantize=bf16 runs on the CPU and CUDA backends; got backend {backend.name!r} "
            f"({backend.device}): use backend=cpu or backend=cuda, or quantize=none"
        )
    native = native_bf16(backend)
    if not native:
        log.warning(
            "quantize=bf16 on %s without native bf16 (no AMX / AVX512-BF16): the GEMMs are "
            "emulated and slower than fp32; quantize=none is faster here",
            backend.device,
        )
    return copy.deepcopy(model).to(torch.bfloat16).eval(), {"native_bf16": native}


class SmoothedInt8Linear(nn.Module):
    """``qlinear(x * inv_scale)``: an int8 dynamic linear whose weight columns were
    multiplied by ``1 / inv_scale``, the same function as the fp32 layer with the
    activations' outlier channels moved into the weights (SmoothQuant)."""

    def __init__(self, qlinear: nn.Module, inv_scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("inv_scale", inv_scale)
        self.qlinear = qlinear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.qlinear(x * self.inv_scale)


def quantize_int8(
    model: RelevanceModel,
    backend: Backend,
    calibration: Sequence[Sequence[int]] = (),
) -> tuple[RelevanceModel, dict[str, Any]]:
    """A copy of ``model`` whose encoder ``nn.Linear`` layers run in int8 (weights int8
    per output channel, activations quantised per batch at run time), and what was done
    to each layer.

    With ``calibration`` (token ids of texts the job will embed), each layer is first
    smoothed: input channel j is divided by s_j = max|x_j|^a / max|W_j|^(1-a) and the
    weight's column j multiplied by it, for the a of :data:`SMOOTHING_ALPHAS` whose int8
    output is closest to the fp32 layer's on the calibration tokens; a layer still
    further than :data:`MAX_LAYER_ERROR` from fp32 stays in fp32. Without calibration
    every layer is quantised as it is.

    :raises BadInputError: on any backend but CPU (quantised kernels are CPU-only).
    """
    if backend.device.type != "cpu":
        raise BadInputError(
            f"quantize=int8 runs on the CPU backend only (dynamic int8 kernels are CPU "
            f"kernels); got backend {backend.name!r} ({backend.device}): use backend=cpu "
            "or quantize=none"
        )
    out = copy.deepcopy(model).eval()
    linears = {n: m for n, m in out.encoder.named_modules() if type(m) is nn.Linear}
    texts = _calibration_batch(calibration)
    absmax = _input_absmax(out, linears, texts) if texts else {}
    candidates = {n: _candidates(m, absmax.get(n)) for n, m in linears.items()}
    errors = _errors(out, linears, candidates, texts) if texts else {}
    layers = []
    for name, module in linears.items():
        if name in errors:
            alpha = min(errors[name], key=errors[name].get)
            error = errors[name][alpha]
        else:
            alpha, error = 0.0, None
        keep = error is not None and error > MAX_LAYER_ERROR
        replacement = module if keep else candidates[name][alpha]
        parent, _, leaf = name.rpartition(".")
        setattr(out.encoder.get_submodule(parent) if parent else out.encoder, leaf, replacement)
        layers.append(
            {
                "layer": name,
                "dtype": "fp32" if keep else "int8",
                "alpha": alpha,
                "relative_error": None if error is None else round(error, 5),
            }
        )
    kept = [entry["layer"] for entry in layers if entry["dtype"] == "fp32"]
    summary = {
        "calibration_texts": len(texts),
        "calibration_tokens": sum(len(t) for t in texts),
        "int8_layers": len(layers) - len(kept),
        "fp32_layers": kept,
        "layers": layers,
    }
    if kept:
        log.warning(
            "int8: %d of %d linear layers stay in fp32 (int8 error over %.0f%% on the "
            "calibration tokens): %s",
            len(kept),
            len(layers),
            MAX_LAYER_ERROR * 100,
            ", ".join(kept),
        )
    if texts:
        worst = max(layers, key=lambda e: e["relative_error"] or 0.0)
        log.info(
            "int8: %d layers smoothed and quantised on %d calibration tokens; worst relative "
            "error %.4f (%s)",
            len(layers) - len(kept),
            summary["calibration_tokens"],
            worst["relative_error"],
            worst["layer"],
        )
    return out, summary


CALIBRATION_TEXTS = 512
"""Texts of the corpus's first shard read to calibrate int8 (at most
:data:`CALIBRATION_TOKENS` of their tokens are used)."""


def fast_model(
    model: RelevanceModel,
    backend: Backend,
    mode: str,
    tokenizer: VariableTokenizer,
    calibration_texts: Sequence[str] | None = None,
) -> tuple[RelevanceModel, dict[str, Any]]:
    """The encoder of a fast ``mode`` (``int8``, ``bf16``) and what was done to it: the
    one way the embed job and a release's query encoder build it, so both get the same
    model. int8 is calibrated on the first :data:`CALIBRATION_TEXTS` of
    ``calibration_texts`` (prompts already put before them); none: uncalibrated.

    :raises BadInputError: an unknown mode, or one the backend cannot run.
    """
    if mode == "bf16":
        return to_bf16(model, backend)
    if mode == "int8":
        texts = list(calibration_texts or ())[:CALIBRATION_TEXTS]
        calibration = tokenizer(texts)[0] if texts else ()
        return quantize_int8(model, backend, calibration)
    raise BadInputError(f"unknown fast mode {mode!r}: int8 or bf16")


def _calibration_batch(calibration: Sequence[Sequence[int]]) -> list[Sequence[int]]:
    texts, tokens = [], 0
    for ids in calibration:
        if tokens >= CALIBRATION_TOKENS:
            break
        if len(ids):
            texts.append(ids)
            tokens += len(ids)
    return texts


def _forward_each(
    model: Any, linears: dict[str, Any], texts: Sequence[Sequence[int]], seen: Any
) -> None:
    """The fp32 encoder on every calibration text alone (no padding, no mask effects),
    calling ``seen(name, x, y)`` with each linear layer's input and output."""
    hooks = [
        m.register_forward_hook(lambda _m, inp, out, n=n: seen(n, inp[0], out))
        for n, m in linears.items()
    ]
    try:
        with torch.inference_mode():
            for ids in texts:
                row = torch.tensor([list(ids)], dtype=torch.long)
                model.embed(row, torch.ones_like(row))
    finally:
        for hook in hooks:
            hook.remove()


def _input_absmax(model: Any, linears: dict[str, Any], texts: Sequence[Sequence[int]]) -> dict:
    absmax: dict[str, Any] = {}

    def record(name: str, x: Any, _out: Any) -> None:
        m = x.reshape(-1, x.shape[-1]).abs().amax(0)
        absmax[name] = m if name not in absmax else torch.maximum(absmax[name], m)

    _forward_each(model, linears, texts, record)
    return absmax


def _candidates(module: Any, absmax: Any) -> dict[float, Any]:
    """The layer in int8 for each alpha (only alpha 0 without calibration statistics)."""
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    out = {}
    for alpha in SMOOTHING_ALPHAS if absmax is not None else (0.0,):
        layer = copy.deepcopy(module)
        scale = torch.ones(module.in_features)
        if alpha:
            w = module.weight.detach().abs().amax(0).clamp(min=1e-5)
            scale = (absmax.clamp(min=1e-5) ** alpha / w ** (1 - alpha)).clamp(min=1e-5)
            with torch.no_grad():
                layer.weight.mul_(scale)
        with warnings.catch_warnings():
            # torch.ao.quantization is deprecated in favour of torchao; it works in 2.9.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            # Per-output-channel weight scales: measured on minilm (400 texts), median
            # 1 - cosine to fp32 0.023 against 0.058 with one scale per tensor.
            q = torch.ao.quantization.quantize_dynamic(
                nn.Sequential(layer), {nn.Linear: qconfig}, dtype=torch.qint8
            )[0]
        out[alpha] = q if not alpha else SmoothedInt8Linear(q, 1.0 / scale)
    return out


def _errors(
    model: Any, linears: dict[str, Any], candidates: dict, texts: Sequence[Sequence[int]]
) -> dict[str, dict[float, float]]:
    """Relative Frobenius error of every candidate against its fp32 layer, summed over
    the calibration tokens (each layer fed the fp32 model's own activations)."""
    sums: dict[str, dict[float, list[float]]] = {
        n: {a: [0.0, 0.0] for a in c} for n, c in candidates.items()
    }

    def record(name: str, x: Any, y: Any) -> None:
        ref = float(y.pow(2).sum())
        for alpha, candidate in candidates[name].items():
            acc = sums[name][alpha]
            acc[0] += float((candidate(x) - y).pow(2).sum())
            acc[1] += ref

    _forward_each(model, linears, texts, record)
    return {
        n: {a: (e / r) ** 0.5 if r else 0.0 for a, (e, r) in per.items()} for n, per in sums.items()
    }


def fast_mode_gate(
    store: ArtifactStore,
    dataset: str,
    fp32: RelevanceModel,
    fast: RelevanceModel,
    backend: Backend,
    tokenizer: VariableTokenizer,
    lengths: Sequence[int],
    token_budget: int,
    mode: str = "int8",
    tolerance: float = DEFAULT_TOLERANCE,
) -> tuple[GateResult, dict[str, Any]]:
    """Recall@10 on the eval split of ``dataset``, the fast ``mode`` (``int8``/``bf16``)
    against fp32: is it worse than fp32 by more than ``tolerance``? (one-sided,
    :data:`GATE_CONFIDENCE`). The summary's keys name the mode (``recall_at_10_bf16``)."""
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
            f"the {mode} quality gate needs recall@10"
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
    for name, model in (("fp32", fp32), (mode, fast)):
        q = embed_texts(model, backend, tokenizer, query_texts, lengths, token_budget, hidden)
        p = embed_texts(model, backend, tokenizer, product_texts, lengths, token_budget, hidden)
        recalls[name] = recall_at_k(q, p, relevant, pools=pools)
    result = gate(
        {GATE_METRIC: recalls[mode], "query_id": query_ids},
        {GATE_METRIC: recalls["fp32"], "query_id": query_ids},
        [GATE_METRIC],
        Mode.NO_REGRESSION,
        tolerance=tolerance,
        confidence=GATE_CONFIDENCE,
    )
    summary = {
        "verdict": str(result.verdict),
        "metric": GATE_METRIC,
        "mode": mode,
        "test": f"one-sided non-inferiority at 95%: the lower bound of d = ({mode} - fp32) / "
        f"fp32 must be at least -{tolerance:.2%}",
        "recall_at_10_fp32": round(float(np.mean(recalls["fp32"])), 6),
        f"recall_at_10_{mode}": round(float(np.mean(recalls[mode])), 6),
        "n_queries": len(query_ids),
        "n_products": len(product_texts),
        "recall_pool": pool if pools is not None else None,
        "dataset": dataset,
        "gate": result.to_dict(),
    }
    log.info(
        "%s quality gate: %s (recall@10 fp32 %.6f, %s %.6f, %d queries): %s",
        mode,
        result.verdict,
        summary["recall_at_10_fp32"],
        mode,
        summary[f"recall_at_10_{mode}"],
        len(query_ids),
        result.reason,
    )
    return result, summary
