"""Unpadded ("packed") encoder forward for eager inference: fp32, bf16 or int8 layers.

Measured savings over :meth:`BertEncoder.forward` on the padded batch, with the
same weights, mask and pooling (vectors equal to float rounding, cosine > 0.9999999):

- Padding costs attention only. The linear layers, layer norms and GELU (about 95% of
  the work for short texts) run on the real tokens alone, packed into one
  ``[tokens, hidden]`` matrix; each layer scatters Q/K/V into the padded
  ``[rows, heads, length, head_dim]`` shape for ``scaled_dot_product_attention`` and
  gathers the result back. Measured on the benchmark texts (1 thread, CPU time):
  1.15x, against 1.19x for no padding at all.
- On AVX-512 AMD CPUs, linear layers go to oneDNN with their weights reordered once into
  its own layout (``torch.utils.mkldnn.MkldnnLinear``: :class:`OneDnnLinear`) rather than
  to MKL's sgemm or ``addmm_``. On Intel CPUs and AVX2-only ones MKL is as fast or
  faster (:func:`onednn_is_faster`). Public APIs only: an earlier version called
  oneDNN's private ops (``mkldnn._linear_pointwise``), which a torch upgrade can break.
- Query, key and value run as one fused GEMM (:func:`fuse_qkv`); every GEMM runs in
  fixed-shape chunks, on MKL accumulated into its output, the attention output's and the
  FFN output's onto their residual (no separate add). :func:`prepare` lays the weights
  out once (``embed_plan`` calls it once a shard).
- bf16 encoders (the embed job's ``quantize=bf16``) take the same path: GEMMs and
  attention in bf16 (AMX where the CPU has it), pooling in fp32.

Shapes vary with the number of real tokens: this is for eager CPU/CUDA, never for
XLA/Neuron or compiled graphs (they take the padded, static-shape path). Quantised
(int8) linear layers are called as they are.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from embedfresh.core import cpuinfo
from embedfresh.ml.model.encoder import BertEncoder, BertLayer, embed_tokens


@functools.cache
def onednn_is_faster() -> bool:
    """Whether fp32 GEMMs go to oneDNN rather than MKL: on non-Intel CPUs where torch
    dispatches to AVX-512 and oneDNN's linear op exists. MKL takes its AVX-512 kernels on
    Intel CPUs only: on an AVX-512 AMD EPYC it ran at ~100 GFLOP/s a core against
    oneDNN's ~220; on an AVX-512 Intel Xeon (Sapphire Rapids) both ran at ~185 and the
    packed forward was 10% faster on MKL (332 against 302 sentences/s at 2 threads,
    2026-11-27); on AVX2-only CPUs both reach ~75-80 and MKL scales better to 2 threads.
    On another AVX-512 EPYC (2026-11-27), where MKL and oneDNN both ran at ~100 GFLOP/s a
    core, oneDNN with its weights reordered once (:class:`OneDnnLinear`) ran 6% ahead of
    MKL end to end, and 12% ahead of oneDNN handed plain weights (docs/BENCHMARKS.md)."""
    return (
        torch.backends.cpu.get_cpu_capability().startswith("AVX512")
        and cpuinfo.field("vendor_id") != "GenuineIntel"
        and torch.backends.mkldnn.is_available()
    )


CHUNK_ROWS = 512
"""Rows go through the GEMMs in chunks of at most 512, each a multiple of ``ROW_STEP``
(the packed matrix is padded to one once per batch), so a model sees at most 8 shapes per
layer kind. oneDNN JIT-compiles and caches a kernel per input shape (about 1 MiB each,
up to 1024 of them), and MKL keeps work buffers per shape: fed one new row count per
batch, the job's peak memory grew by ~5 MiB a shard either way (oneDNN 2026-11-22; MKL
2026-11-27, +46 MiB over 20 shards of the tiny model). GEMMs of 512 rows run as fast as
of 4,096 (~220 GFLOP/s a core on oneDNN with AVX-512)."""
ROW_STEP = 64
CHUNKED_DTYPES = (torch.float32, torch.bfloat16)
"""Dense layers of these dtypes run in fixed-shape chunks on the CPU: fp32, and bf16 (the
``quantize=bf16`` fast mode, AMX/AVX512-BF16 GEMMs through oneDNN)."""


ONEDNN_BF16_FLAGS = ({"avx512bw", "avx512vl", "avx512dq"}, {"avx_ne_convert"})
"""``/proc/cpuinfo`` flags of which oneDNN needs one set for bf16 (its own check, read from
the flags: torch's probe of it is private)."""


def onednn_has(dtype: torch.dtype) -> bool:
    """Whether oneDNN has a GEMM path for ``dtype`` on this CPU: fp32 everywhere, bf16 only
    with AVX512-BW/VL/DQ or AVX-NE-CONVERT (its weight reorder refuses bf16 on an
    AVX2-only CPU)."""
    if dtype != torch.bfloat16:
        return True
    flags = set(cpuinfo.field("flags").split())
    return any(needed <= flags for needed in ONEDNN_BF16_FLAGS)


def _dense(module: nn.Module) -> bool:
    return type(module) is nn.Linear


class OneDnnLinear:
    """A dense CPU layer as oneDNN runs it: its weight reordered once into oneDNN's own
    blocked layout (``torch.utils.mkldnn.MkldnnLinear``), as inductor's frozen graphs keep
    theirs. Handed the plain ``[out, in]`` weight, oneDNN reorders it on every call: on a
    2-core AVX-512 AMD EPYC, GEMMs of minilm's shapes ran 10-38% faster reordered once
    (fp32, 2 threads: 189 against 137 GFLOP/s for the FFN's output layer), and the packed
    fp32 forward 12% faster end to end (2026-11-27, docs/BENCHMARKS.md). The same
    function; the sums' order differs (within 1e-5 of the plain weight's)."""

    def __init__(self, layer: nn.Linear) -> None:
        from torch.utils.mkldnn import MkldnnLinear

        self.module = MkldnnLinear(layer, layer.weight.dtype)
        self.out_features = layer.out_features


def _onednn_linear(
    x: torch.Tensor, layer: OneDnnLinear, gelu: bool, residual: torch.Tensor | None
) -> torch.Tensor:
    """``layer(x)`` (then exact GELU, or plus ``residual``) in chunks of at most
    ``CHUNK_ROWS`` rows, written out chunk by chunk."""
    out = x.new_empty(x.shape[0], layer.out_features)
    for start in range(0, x.shape[0], CHUNK_ROWS):
        part = x[start : start + CHUNK_ROWS]
        end = start + part.shape[0]
        y = layer.module(part)
        if gelu:
            out[start:end] = F.gelu(y)
        elif residual is None:
            out[start:end] = y
        else:
            torch.add(y, residual[start:end], out=out[start:end])
    return out


def _chunked_linear(
    x: torch.Tensor, layer: nn.Linear, gelu: bool, residual: torch.Tensor | None
) -> torch.Tensor:
    """``layer(x)`` (then exact GELU, or plus ``residual``) in chunks of at most
    ``CHUNK_ROWS`` rows, accumulated straight into the output (``addmm_`` onto the bias
    or residual + bias)."""
    rows = x.shape[0]
    if residual is not None:
        out = residual + layer.bias if layer.bias is not None else residual.clone()
    elif layer.bias is not None:
        out = layer.bias.expand(rows, layer.out_features).contiguous()
    else:
        out = x.new_zeros(rows, layer.out_features)
    weight = layer.weight.t()
    for start in range(0, rows, CHUNK_ROWS):
        part = x[start : start + CHUNK_ROWS]
        out[start : start + part.shape[0]].addmm_(part, weight)
    if gelu:
        torch.ops.aten.gelu_(out)
    return out


Layer = nn.Module | OneDnnLinear
"""A linear layer as the packed forward calls it."""


def _linear(
    module: Layer, x: torch.Tensor, gelu: bool = False, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """``module(x)``, then exact GELU or plus ``residual``: on oneDNN with its reordered
    weight, or a dense fp32/bf16 CPU layer in chunks of fixed shapes, or (quantised
    layers, CUDA) called whole. ``x`` has a multiple of ``ROW_STEP`` rows."""
    if isinstance(module, OneDnnLinear):
        return _onednn_linear(x, module, gelu, residual)
    if _dense(module) and x.device.type == "cpu" and x.dtype in CHUNKED_DTYPES:
        return _chunked_linear(x, module, gelu, residual)
    out = module(x)
    if gelu:
        out = F.gelu(out)
    return out if residual is None else out + residual


def fuse_qkv(encoder: BertEncoder) -> list[nn.Linear | None]:
    """Per layer, query, key and value as one ``[3 * hidden, hidden]`` layer (one GEMM and
    one scatter instead of three), or None where they are not all dense (int8)."""
    fused: list[nn.Linear | None] = []
    for layer in encoder.encoder.layer:
        att = layer.attention.self
        parts = (att.query, att.key, att.value)
        if not all(_dense(m) and m.bias is not None for m in parts):
            fused.append(None)
            continue
        weight = torch.cat([m.weight.detach() for m in parts])
        qkv = torch.nn.utils.skip_init(  # no random init of weights replaced next
            nn.Linear, weight.shape[1], weight.shape[0], device=weight.device, dtype=weight.dtype
        )
        qkv.weight = nn.Parameter(weight, requires_grad=False)
        qkv.bias = nn.Parameter(torch.cat([m.bias.detach() for m in parts]), requires_grad=False)
        fused.append(qkv)
    return fused


@dataclass(frozen=True)
class PreparedLayer:
    """One encoder layer's linear layers as the packed forward calls them."""

    qkv: Layer | None
    """Query, key and value fused (None: called one by one, as quantised ones are)."""
    attention_output: Layer
    intermediate: Layer
    output: Layer


def _for_gemm(module: nn.Module) -> Layer:
    """``module`` with its weight reordered for oneDNN where oneDNN runs it: a dense fp32
    or bf16 CPU layer on a CPU where oneDNN is the faster library
    (:func:`onednn_is_faster`; bf16 there: 3% faster end to end than on ``addmm_``,
    2026-11-27) and has a path for the layer's dtype (:func:`onednn_has`). Any other
    layer as it is."""
    if (
        _dense(module)
        and module.weight.device.type == "cpu"
        and module.weight.dtype in CHUNKED_DTYPES
        and onednn_is_faster()
        and onednn_has(module.weight.dtype)
    ):
        return OneDnnLinear(module)
    return module


def prepare(encoder: BertEncoder) -> list[PreparedLayer]:
    """The encoder's linear layers laid out once for :func:`packed_embed`: Q/K/V fused
    (:func:`fuse_qkv`), every weight in the GEMM library's own layout where that is
    oneDNN. Costs a second copy of the dense weights there (minilm in fp32: 32 MiB of
    weights, +21-26 MiB of peak RSS measured) and ~30 ms for minilm on 2 cores."""
    return [
        PreparedLayer(
            qkv=None if fused is None else _for_gemm(fused),
            attention_output=_for_gemm(layer.attention.output.dense),
            intermediate=_for_gemm(layer.intermediate.dense),
            output=_for_gemm(layer.output.dense),
        )
        for layer, fused in zip(encoder.encoder.layer, fuse_qkv(encoder), strict=True)
    ]


def _attention(
    layer: BertLayer,
    qkv: Layer | None,
    x: torch.Tensor,
    tokens: int,
    where: torch.Tensor,
    rows: int,
    length: int,
    bias: torch.Tensor,
) -> torch.Tensor:
    """Self-attention of the packed ``x`` (``tokens`` real rows, then padding rows): Q/K/V
    scattered into the padded batch for ``scaled_dot_product_attention``, the result
    gathered back into the packed layout."""
    att = layer.attention.self
    d = x.shape[1]
    if qkv is not None:
        # Under autocast (the cuda backend) the projection comes out in bf16 from fp32 x.
        projected = _linear(qkv, x)[:tokens].view(tokens, 3, d)
        padded = projected.new_zeros(rows * length, 3, d)
        padded.index_copy_(0, where, projected)
    else:
        projected = [_linear(m, x)[:tokens] for m in (att.query, att.key, att.value)]
        padded = projected[0].new_zeros(rows * length, 3, d)
        for i, part in enumerate(projected):
            padded[where, i] = part
    heads = padded.view(rows, length, 3, att.heads, d // att.heads).permute(2, 0, 3, 1, 4)
    out = F.scaled_dot_product_attention(heads[0], heads[1], heads[2], attn_mask=bias)
    gathered = out.new_empty(x.shape)
    gathered[tokens:].zero_()
    torch.index_select(
        out.transpose(1, 2).reshape(rows * length, d), 0, where, out=gathered[:tokens]
    )
    return gathered


def _output(
    dense: Layer, layer_norm: nn.Module, h: torch.Tensor, residual: torch.Tensor
) -> torch.Tensor:
    """``BertSelfOutput`` in eval mode: LayerNorm(dense(h) + residual)."""
    return layer_norm(_linear(dense, h, residual=residual))


def packed_embed(
    encoder: BertEncoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    layers: list[PreparedLayer] | None = None,
) -> torch.Tensor:
    """L2-normalised mean-pooled fp32 embeddings [rows, hidden] of a padded batch, computed
    on its real tokens only (eval mode: no dropout), in the encoder's dtype (fp32 or
    bf16; pooled in fp32). Rows without any token (filler of a static-shape batch) come
    out as zeros. ``layers``: :func:`prepare` of the encoder, made once by the caller (made
    here when None)."""
    if layers is None:
        layers = prepare(encoder)
    rows, length = input_ids.shape
    where = attention_mask.reshape(-1).bool().nonzero().squeeze(1)
    tokens = where.numel()
    emb = encoder.embeddings
    x = emb.LayerNorm(
        emb.word_embeddings(input_ids.reshape(-1)[where])
        + emb.position_embeddings.weight[where % length]
        + emb.token_type_embeddings.weight[0]
    )
    # Padding rows (zeros) up to a multiple of ROW_STEP: every GEMM chunk has a fixed shape.
    # They never reach a real row: linear layers and LayerNorm work row by row, and only
    # the first ``tokens`` rows go into attention and pooling.
    x = F.pad(x, (0, 0, 0, -tokens % ROW_STEP))
    # The mask in the dtype attention runs in: autocast's (bf16 on cuda) or the model's.
    kind = x.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
    bias = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
    for layer, prepared in zip(encoder.encoder.layer, layers, strict=True):
        h = _attention(layer, prepared.qkv, x, tokens, where, rows, length, bias)
        a = _output(prepared.attention_output, layer.attention.output.LayerNorm, h, x)
        ffn = _linear(prepared.intermediate, a, gelu=True)
        x = _output(prepared.output, layer.output.LayerNorm, ffn, a)
    x = x[:tokens].float()  # pooled in fp32 whatever the model's dtype: a bf16 sum drifts
    # Back on a zero-filled [rows, length] grid and pooled as the padded forward pools: a
    # reduction of a fixed shape adds in a fixed order on every device. index_add_ did not
    # on CUDA (its float atomics add in arrival order): a shard embedded twice on an H200
    # came out with other last bits, and a killed run's re-run was not byte-equal to a
    # clean run.
    grid = x.new_zeros(rows * length, x.shape[1]).index_copy_(0, where, x)
    return embed_tokens(grid.view(rows, length, -1), attention_mask, "mean", None)
