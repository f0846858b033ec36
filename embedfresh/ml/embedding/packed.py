"""Unpadded ("packed") encoder forward for eager inference, linear layers on oneDNN.

Two measured savings over :meth:`BertEncoder.forward` on the padded batch, with the
same weights, mask and pooling (vectors equal to float rounding, cosine > 0.9999999):

- Padding costs attention only. The linear layers, layer norms and GELU (about 95% of
  the work for short texts) run on the real tokens alone, packed into one
  ``[tokens, hidden]`` matrix; each layer scatters Q/K/V into the padded
  ``[rows, heads, length, head_dim]`` shape for ``scaled_dot_product_attention`` and
  gathers the result back. Measured on the benchmark texts (1 thread, CPU time):
  1.15x, against 1.19x for no padding at all.
- On AVX-512 CPUs, fp32 linear layers go to oneDNN (``torch.ops.mkldnn._linear_pointwise``,
  GELU fused) rather than to ``aten::linear``, which calls MKL's sgemm: on an AVX-512 AMD
  EPYC MKL reaches ~100 GFLOP/s a core, oneDNN ~220. On AVX2-only CPUs both reach ~75-80
  and MKL scales better to 2 threads (measured 2026-11-27, docs/BENCHMARKS.md): there the
  layers stay on ``aten::linear`` and the gain is packing alone.

Shapes vary with the number of real tokens: this is for eager CPU/CUDA, never for
XLA/Neuron or compiled graphs (they take the padded, static-shape path). Quantised
(int8) linear layers are called as they are.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from embedfresh.ml.model.encoder import BertEncoder, BertLayer


@functools.cache
def onednn_is_faster() -> bool:
    """Whether fp32 GEMMs go to oneDNN rather than MKL: where torch dispatches to AVX-512
    (~2.2x MKL a core on our AMD EPYC) and oneDNN's linear op exists. On AVX2-only CPUs
    MKL is as fast or faster (measured 2026-11-27 on an AVX2 EPYC: 5% less CPU time for
    the packed forward at 1 thread, 141 vs 115 GFLOP/s for a 512 x 384 x 1536 GEMM at 2
    threads; docs/BENCHMARKS.md)."""
    return (
        torch.backends.cpu.get_cpu_capability().startswith("AVX512")
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


CHUNK_ROWS = 512
"""Rows go through the GEMMs in chunks of 512, the last one padded to a multiple of
``ROW_STEP``, so a model sees at most 8 shapes per layer kind. oneDNN JIT-compiles and
caches a kernel per input shape (about 1 MiB each, up to 1024 of them), and MKL keeps
work buffers per shape: fed one new row count per batch, the job's peak memory grew by
~5 MiB a shard either way (oneDNN 2026-11-22; MKL 2026-11-27, +46 MiB over 20 shards of
the tiny model). GEMMs of 512 rows run as fast as of 4,096 (~220 GFLOP/s a core on
oneDNN with AVX-512)."""
ROW_STEP = 64


def _chunked_linear(x: torch.Tensor, layer: nn.Linear, gelu: bool) -> torch.Tensor:
    onednn = onednn_is_faster()
    if onednn:
        attr, algorithm = ("gelu", "none") if gelu else ("none", "")
    out = x.new_empty(x.shape[0], layer.out_features)
    for start in range(0, x.shape[0], CHUNK_ROWS):
        part = x[start : start + CHUNK_ROWS]
        n = part.shape[0]
        pad = -n % ROW_STEP
        if pad:
            part = F.pad(part, (0, 0, 0, pad))
        if onednn:
            y = torch.ops.mkldnn._linear_pointwise(
                part, layer.weight, layer.bias, attr, [], algorithm
            )
        else:
            y = F.linear(part, layer.weight, layer.bias)
            if gelu:
                y = F.gelu(y)
        out[start : start + n] = y[:n]
    return out


def _linear(module: nn.Module, x: torch.Tensor, gelu: bool = False) -> torch.Tensor:
    """``module(x)`` (then exact GELU); a dense fp32 CPU layer in chunks of fixed shapes,
    on oneDNN where that is faster (AVX-512) and on MKL elsewhere."""
    if type(module) is nn.Linear and x.device.type == "cpu" and x.dtype == torch.float32:
        return _chunked_linear(x, module, gelu)
    out = module(x)
    return F.gelu(out) if gelu else out


def _attention(
    layer: BertLayer,
    x: torch.Tensor,
    where: torch.Tensor,
    rows: int,
    length: int,
    bias: torch.Tensor,
) -> torch.Tensor:
    att = layer.attention.self
    d = x.shape[1]
    padded = x.new_zeros(rows * length, 3, d)
    padded[where, 0] = _linear(att.query, x)
    padded[where, 1] = _linear(att.key, x)
    padded[where, 2] = _linear(att.value, x)
    qkv = padded.view(rows, length, 3, att.heads, d // att.heads).permute(2, 0, 3, 1, 4)
    out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=bias)
    return out.transpose(1, 2).reshape(rows * length, d)[where]


def _output(block: nn.Module, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``BertSelfOutput`` in eval mode: LayerNorm(dense(h) + residual)."""
    return block.LayerNorm(_linear(block.dense, h) + residual)


def packed_embed(
    encoder: BertEncoder, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """L2-normalised mean-pooled embeddings [rows, hidden] of a padded batch, computed
    on its real tokens only (eval mode: no dropout). Rows without any token (filler of
    a static-shape batch) come out as zeros."""
    rows, length = input_ids.shape
    where = attention_mask.reshape(-1).bool().nonzero().squeeze(1)
    emb = encoder.embeddings
    x = emb.LayerNorm(
        emb.word_embeddings(input_ids.reshape(-1)[where])
        + emb.position_embeddings.weight[where % length]
        + emb.token_type_embeddings.weight[0]
    )
    bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
    for layer in encoder.encoder.layer:
        a = _output(layer.attention.output, _attention(layer, x, where, rows, length, bias), x)
        x = _output(layer.output, _linear(layer.intermediate.dense, a, gelu=True), a)
    row = where // length
    pooled = x.new_zeros(rows, x.shape[1]).index_add_(0, row, x)
    counts = torch.bincount(row, minlength=rows).to(x.dtype).clamp(min=1e-9)
    return F.normalize(pooled / counts[:, None], p=2, dim=1)
