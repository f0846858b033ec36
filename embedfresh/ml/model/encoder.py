"""A BERT encoder in plain PyTorch with Hugging Face's parameter names.

Written out rather than imported from transformers so that the training graph is ours:
static shapes, ``scaled_dot_product_attention``, nothing data-dependent in forward (one
graph for XLA/Neuron and torch.compile), and a fast import. Parameter names match
``transformers.BertModel`` so MiniLM's safetensors load as they are and the model can
be exported back to the sentence-transformers format.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from embedfresh.ml.model.presets import DenseLayer, EncoderConfig


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # Single-segment inputs: token type 0 everywhere, as sentence-transformers does.
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)[None]
            + self.token_type_embeddings.weight[0]
        )
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        if cfg.hidden_size % cfg.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        self.heads = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout_p = cfg.dropout

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            split(self.query(x)),
            split(self.key(x)),
            split(self.value(x)),
            attn_mask=bias,
            dropout_p=self.dropout_p if self.training else 0.0,
        )
        return out.transpose(1, 2).reshape(b, n, d)


class BertSelfOutput(nn.Module):
    def __init__(self, cfg: EncoderConfig, inner: int) -> None:
        super().__init__()
        self.dense = nn.Linear(inner, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg, cfg.hidden_size)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, bias), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertSelfOutput(cfg, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        a = self.attention(x, bias)
        return self.output(self.intermediate(a), a)


class BertLayers(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, bias)
        return x


def _init_weights(module: nn.Module) -> None:
    """BERT's initialisation (normal, std 0.02). PyTorch's default N(0, 1) embeddings
    let the shared position embeddings dominate every pooled vector, and a randomly
    initialised encoder then does not learn at all (measured: loss stuck at the label
    entropy for 3 epochs, against 0.45 with this init)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            module.weight.data[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


POOLING_MODES = ("mean", "cls", "max", "lasttoken")
"""Pooling over token states, as sentence-transformers' Pooling module computes them."""


def pool(states: torch.Tensor, attention_mask: torch.Tensor, mode: str = "mean") -> torch.Tensor:
    """[rows, length, hidden] token states -> [rows, hidden]: the mean or max over real
    tokens, the first token's state (``cls``) or the last attended token's
    (``lasttoken``, on either padding side, as sentence-transformers finds it)."""
    mask = attention_mask[..., None].to(states.dtype)
    if mode == "cls":
        return states[:, 0]
    if mode == "lasttoken":
        length = attention_mask.shape[1]
        last = length - 1 - attention_mask.flip(1).argmax(1)
        return states[torch.arange(states.shape[0], device=states.device), last]
    if mode == "max":
        # sentence-transformers sets padding to -1e9 before the max.
        return torch.where(mask.bool(), states, torch.full_like(states, -1e9)).max(1).values
    return (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


ACTIVATIONS = {
    "identity": nn.Identity,
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "sigmoid": nn.Sigmoid,
}


class DenseModule(nn.Module):
    """sentence-transformers' Dense: ``activation(linear(x))``, weights named ``linear.*``."""

    def __init__(self, layer: DenseLayer) -> None:
        super().__init__()
        self.linear = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
        self.activation = ACTIVATIONS[layer.activation]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(x))


def dense_stack(layers: list[DenseLayer] | None) -> nn.Sequential | None:
    """The Dense modules after pooling, None when the model has none."""
    return nn.Sequential(*(DenseModule(layer) for layer in layers)) if layers else None


def embed_tokens(
    states: torch.Tensor,
    attention_mask: torch.Tensor,
    pooling: str,
    dense: nn.Module | None,
) -> torch.Tensor:
    """Token states -> the unit-length sentence embedding: pool, Dense modules, L2 norm."""
    x = pool(states, attention_mask, pooling)
    if dense is not None:
        x = dense(x)
    return F.normalize(x, p=2, dim=1)


class BertEncoder(nn.Module):
    """Token ids and attention mask in, L2-normalised pooled embedding out (mean pooling
    unless the model's own Pooling config says ``cls`` or ``max``)."""

    def __init__(
        self, cfg: EncoderConfig, pooling: str = "mean", dense: list[DenseLayer] | None = None
    ) -> None:
        super().__init__()
        self.config = cfg
        self.pooling = pooling
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertLayers(cfg)
        self.apply(_init_weights)
        # After the init: nn.Linear's own init, as sentence-transformers' Dense has.
        self.dense = dense_stack(dense)

    def token_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # Additive mask (0 keep, large negative drop) shaped to broadcast over heads.
        bias = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * torch.finfo(
            torch.float32
        ).min
        return self.encoder(self.embeddings(input_ids), bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.token_states(input_ids, attention_mask)
        return embed_tokens(states, attention_mask, self.pooling, self.dense)

    # Keys in HF checkpoints that this encoder does not use (the pooler is for NSP).
    IGNORED_KEYS = ("pooler.", "embeddings.position_ids")
