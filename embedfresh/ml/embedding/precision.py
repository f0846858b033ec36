"""The embed job's fast modes, reduced-precision copies of the encoder, and the quality
gate they must pass before anything is published.

- ``int8`` (:func:`quantize_int8`, x86 CPUs): PyTorch's PT2E quantisation of the
  exported encoder (torchao's ``X86InductorQuantizer``), activation scales calibrated on
  the corpus's first shard, compiled by inductor into oneDNN int8 kernels.
- ``bf16`` (:func:`to_bf16`, CPU and CUDA): the whole encoder in bfloat16, pooled in fp32.
  Its GEMMs run on AMX / AVX512-BF16 where the CPU has them (5.4x fp32's GEMM rate on a
  Sapphire Rapids Xeon, measured 2026-11-27); elsewhere they would be emulated at 0.15x
  fp32, so it is refused there (exit 2).

The gate asks the question a user asks of a fast mode, "is it worse?": a one-sided
non-inferiority test. It embeds the eval split's queries and products twice with the
job's own path (bucketing, the model's own truncation), fp32 and the fast mode, computes
recall@10 per query with :func:`embedfresh.ml.embedding.pools.recall_at_k` and runs the paired
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
    device runs bf16 natively (always true: elsewhere it is refused).

    The eager packed forward in bf16, not inductor under autocast: both ran at the same
    rate on an AMX host (606.3 against 636.0 sentences/s, the compiled one after a 26 s
    cold compile per process; docs/BENCHMARKS.md, "int8 through PT2E").

    :raises BadInputError: on a backend other than CPU or CUDA (XLA/Neuron cast with their
        own compiler flags: ``--auto-cast``), or a device without native bf16 GEMMs.
    """
    if backend.device.type not in BF16_BACKENDS:
        raise BadInputError(
            f"quantize=bf16 runs on the CPU and CUDA backends; got backend {backend.name!r} "
            f"({backend.device}): use backend=cpu or backend=cuda, or quantize=none"
        )
    native = native_bf16(backend)
    if not native:
        raise BadInputError(
            f"quantize=bf16 on {backend.device} without native bf16 (the CPU has neither AMX "
            "nor AVX512-BF16 in /proc/cpuinfo's flags; a GPU below compute capability 8.0): "
            "its GEMMs would be emulated, 0.15x fp32's rate (docs/BENCHMARKS.md): use "
            "quantize=int8 or quantize=none here"
        )
    return copy.deepcopy(model).to(torch.bfloat16).eval(), {"native_bf16": native}


INT8_ROUTE = "pt2e-x86-inductor"
"""How ``quantize=int8`` runs: PyTorch's own int8 route for x86 CPUs. The encoder is
exported (``torch.export``), its linear layers annotated by torchao's
``X86InductorQuantizer`` (int8 weights per output channel; int8 activations per tensor,
calibrated), and the quantised graph compiled by inductor with ``freezing``, which fuses
each quantise -> linear -> dequantise into one oneDNN int8 kernel (VNNI, AMX).

It replaced ``torch.ao.quantization.quantize_dynamic`` (deprecated, eager int8 layers,
with a SmoothQuant calibration of our own): 601.8 against 375.1 sentences/s on the same
host and texts, and 939.2 with the rest of the graph in bf16 where the CPU has AMX
(docs/BENCHMARKS.md, "int8 through PT2E")."""


class Int8Encoder(nn.Module):
    """The encoder's quantised and compiled forward behind the model's ``embed``: what
    the embed job, the fast-mode gate and a release's query encoder call. ``spec`` is the
    fp32 model's. Its graphs are static: call it with static batches, one graph per
    bucket (inductor compiles each on its first call)."""

    def __init__(self, graph: Any, spec: Any, mixed_bf16: bool) -> None:
        super().__init__()
        self.graph = graph
        self.spec = spec
        self.mixed_bf16 = mixed_bf16
        self._forward = torch.compile(graph, dynamic=False)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # Freezing as PyTorch's x86 PT2E tutorial sets it, scoped to these calls (a new
        # shape compiles inside them): passed as torch.compile(options=...) instead,
        # torchao's int8 weight-prepack pass fails to lower (torch 2.9.1, torchao 0.15.0).
        import torch._inductor.config as inductor_config

        with (
            inductor_config.patch(freezing=True),
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.mixed_bf16),
        ):
            return self._forward(input_ids, attention_mask)


class _Embed(nn.Module):
    """``model.embed`` as a module's forward: what ``torch.export`` traces."""

    def __init__(self, model: RelevanceModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model.embed(input_ids, attention_mask)


def _check_exported(graph: Any, model: RelevanceModel, ids: Sequence[int]) -> None:
    """The exported graph computes the model's ``embed`` (before anything is quantised),
    checked on one calibration text at its own length."""
    row = torch.tensor([list(ids)], dtype=torch.long)
    mask = torch.ones_like(row)
    with torch.no_grad():
        diff = float((graph(row, mask) - model.embed(row, mask)).abs().max())
    if diff > 1e-4:
        raise RuntimeError(
            f"the exported encoder differs from the model by {diff:.3g} on a calibration "
            "text: torch.export did not capture its forward; use quantize=none"
        )


def mixed_bf16_int8() -> bool:
    """Whether int8's layers between the int8 GEMMs (attention, LayerNorm, GELU) run in
    bf16: on CPUs with AMX only (939.2 against 601.8 sentences/s all-fp32 there; on
    AVX512-BF16 without AMX bf16 GEMMs ran slower than fp32: docs/BENCHMARKS.md)."""
    return "amx_bf16" in cpuinfo.field("flags").split()


def int8_settings() -> dict[str, str]:
    """What an int8 output's vectors depend on beyond its calibration shard, for its
    parts' reuse key and its release's query encoder: the route, and whether this host
    runs the layers between the GEMMs in bf16 (:func:`mixed_bf16_int8`)."""
    return {"int8_route": INT8_ROUTE, "int8_between_gemms": "bf16" if mixed_bf16_int8() else "fp32"}


def quantize_int8(
    model: RelevanceModel,
    backend: Backend,
    calibration: Sequence[Sequence[int]] = (),
    between_gemms: str | None = None,
) -> tuple[Int8Encoder, dict[str, Any]]:
    """The encoder in int8 through PT2E (:data:`INT8_ROUTE`), and what was done to it.

    The activations' int8 scales are static, observed on ``calibration`` (token ids of
    texts the job will embed: the first :data:`CALIBRATION_TOKENS` of them, one text at
    a time so no padding enters the statistics). Dynamic scales are not offered: inductor
    cannot lower torchao's dynamic int8 linear without calibration data (torch 2.9.1,
    torchao 0.15.0: ``onednn.qlinear_prepack`` has no fake kernel).

    ``between_gemms`` (``bf16``/``fp32``): as recorded with the vectors to repeat; None:
    this host's choice (:func:`int8_settings`).

    :raises BadInputError: on any backend but CPU, a CPU that is not x86 (the
        quantiser's kernels are oneDNN's x86 ones), no calibration text, or an encoder
        whose graph the quantiser cannot handle (MPNet).
    """
    import platform
    import warnings

    with warnings.catch_warnings():  # torchao's modules warn of their own import paths
        warnings.simplefilter("ignore", DeprecationWarning)
        from torchao.quantization.pt2e import move_exported_model_to_eval

    if backend.device.type != "cpu" or platform.machine().lower() not in ("x86_64", "amd64"):
        raise BadInputError(
            f"quantize=int8 runs on the CPU backend of x86 machines only (PyTorch's int8 "
            f"route there is oneDNN's x86 kernels); got backend {backend.name!r} "
            f"({backend.device}) on {platform.machine()}: use backend=cpu on x86, "
            "quantize=bf16 or quantize=none"
        )
    texts = _calibration_batch(calibration)
    if not texts:
        raise BadInputError(
            "quantize=int8 calibrates its activation scales on the corpus's first shard, "
            "which has no text: embed a corpus whose first shard has rows, or quantize=none"
        )
    converted = _calibrated(_exported(model, texts[0]), texts, model)
    move_exported_model_to_eval(converted)
    layers = sum(
        1
        for node in converted.graph.nodes
        if node.op == "call_function" and "dequantize_per_channel" in str(node.target)
    )
    mixed = (between_gemms or int8_settings()["int8_between_gemms"]) == "bf16"
    summary = {
        "route": INT8_ROUTE,
        "between_gemms": "bf16" if mixed else "fp32",
        "calibration_texts": len(texts),
        "calibration_tokens": sum(len(t) for t in texts),
        "int8_layers": layers,
    }
    log.info(
        "int8 (%s): %d linear layers in int8, activation scales from %d calibration "
        "tokens; the rest in %s. Inductor compiles one graph per bucket on its first batch",
        INT8_ROUTE,
        layers,
        summary["calibration_tokens"],
        summary["between_gemms"],
    )
    return Int8Encoder(converted, model.spec, mixed), summary


def _exported(model: RelevanceModel, first_text: Sequence[int]) -> torch.fx.GraphModule:
    """The fp32 encoder exported with dynamic rows and length, checked against eager.

    Two rows of 16 tokens as the example (ids and mask two distinct tensors: one tensor
    passed twice is traced as one input); rows and length are dynamic in the exported
    graph, so calibration runs each text at its own length. Strict export: the quantiser
    finds linear layers by the source metadata that only dynamo records."""
    import warnings

    with warnings.catch_warnings():  # torchao's modules warn of their own import paths
        warnings.simplefilter("ignore", DeprecationWarning)
        from torchao.quantization.pt2e import move_exported_model_to_eval

    fp32 = copy.deepcopy(model).eval()
    example = (torch.full((2, 16), 7, dtype=torch.long), torch.ones((2, 16), dtype=torch.long))
    dims = {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
    graph = torch.export.export(
        _Embed(fp32).eval(), example, dynamic_shapes=(dims, dims), strict=True
    ).module()
    move_exported_model_to_eval(graph)  # its dropout calls, which .eval() cannot reach
    _check_exported(graph, fp32, first_text)
    return graph


def _calibrated(
    graph: torch.fx.GraphModule, texts: Sequence[Sequence[int]], model: RelevanceModel
) -> torch.fx.GraphModule:
    """``graph`` observed on ``texts`` (one at a time: no padding in the statistics) and
    converted to int8 by the x86 inductor quantiser."""
    import warnings

    with warnings.catch_warnings():  # torchao's modules warn of their own import paths
        warnings.simplefilter("ignore", DeprecationWarning)
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config())
    try:
        prepared = prepare_pt2e(graph, quantizer)
        with torch.no_grad():
            for ids in texts:
                row = torch.tensor([list(ids)], dtype=torch.long)
                prepared(row, torch.ones_like(row))
        return convert_pt2e(prepared)
    except (NotImplementedError, RuntimeError) as err:
        # Seen on MPNet: the quantiser observes the integer relative-position buckets.
        raise BadInputError(
            f"quantize=int8 cannot quantise this encoder ({type(model.encoder).__name__}): "
            f"PyTorch's x86 quantiser failed on its graph ({type(err).__name__}: "
            f"{str(err)[:200]}); use quantize=bf16 or quantize=none"
        ) from err


CALIBRATION_TEXTS = 512
"""Texts of the corpus's first shard read to calibrate int8 (at most
:data:`CALIBRATION_TOKENS` of their tokens are used)."""


def fast_model(
    model: RelevanceModel,
    backend: Backend,
    mode: str,
    tokenizer: VariableTokenizer,
    calibration_texts: Sequence[str] | None = None,
    between_gemms: str | None = None,
) -> tuple[RelevanceModel, dict[str, Any]]:
    """The encoder of a fast ``mode`` (``int8``, ``bf16``) and what was done to it: the
    one way the embed job and a release's query encoder build it, so both get the same
    model. int8 is calibrated on the first :data:`CALIBRATION_TEXTS` of
    ``calibration_texts`` (prompts already put before them); ``between_gemms`` as
    :func:`quantize_int8` takes it.

    :raises BadInputError: an unknown mode, or one the backend cannot run.
    """
    if mode == "bf16":
        return to_bf16(model, backend)
    if mode == "int8":
        texts = list(calibration_texts or ())[:CALIBRATION_TEXTS]
        calibration = tokenizer(texts)[0] if texts else ()
        return quantize_int8(model, backend, calibration, between_gemms)
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
    from embedfresh.ml.data.judgments import pairs_corpus
    from embedfresh.ml.data.reader import read_eval
    from embedfresh.ml.embedding.pools import (
        POOL_SIZE,
        recall_at_k,
        recall_pools,
        retrieval_sets,
    )

    examples = read_eval(store, dataset, {}, pairs_corpus(store, dataset))
    query_ids, query_texts, _, product_texts, relevant = retrieval_sets(examples)
    if len(query_ids) == 0:
        raise BadInputError(
            f"eval split of {dataset!r} has no relevant (label 1, grade 2-3) pairs: "
            f"the {mode} quality gate needs recall@10"
        )
    # Over a fixed candidate pool per query (docs/GATE.md), where more queries narrow the
    # interval; all products if too few.
    pool = POOL_SIZE
    pools = None
    if pool < len(product_texts):
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
