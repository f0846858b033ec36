"""Any encoder architecture transformers ships, as the generic path: ``AutoModel`` built
from the model's own ``config.json``, pooled as its Pooling config says (mean, cls or max) and L2-normalised,
the way sentence-transformers' Transformer -> Pooling -> Normalize computes it.

The BERT family runs on :class:`~embedfresh.ml.model.encoder.BertEncoder` instead (our own
graph: static shapes, the packed CPU path); everything else (RoBERTa/XLM-R, MPNet,
DistilBERT, ...) runs here, padded, with transformers' own modules and weight names.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from embedfresh.ml.model.encoder import dense_stack, embed_tokens
from embedfresh.ml.model.presets import DenseLayer


def hf_config(architecture: dict[str, Any]) -> Any:
    """The transformers config object of a ``config.json`` dict."""
    from transformers import AutoConfig

    fields = dict(architecture)
    model_type = fields.pop("model_type")
    # Trained and embedded in float32 like every other model here (the backend's autocast
    # decides any lower precision): a config saved as bfloat16 must not build a bf16 model.
    for key in ("torch_dtype", "dtype"):
        fields.pop(key, None)
    return AutoConfig.for_model(model_type, **fields)


class HFEncoder(nn.Module):
    """Token ids and attention mask in, L2-normalised pooled embedding out."""

    def __init__(
        self,
        architecture: dict[str, Any],
        pooling: str = "mean",
        dense: list[DenseLayer] | None = None,
    ) -> None:
        super().__init__()
        from transformers import AutoModel

        self.pooling = pooling
        config = hf_config(architecture)
        #: Padding positions get the model's own pad id: RoBERTa-like models derive
        #: position ids from it, and a batch is padded with zeros.
        self.pad_token_id = int(getattr(config, "pad_token_id", None) or 0)
        # transformers' own attention choice: sdpa where the architecture has it (MPNet and
        # DeBERTa do not, and asking for it by name fails there), eager otherwise.
        self.hf = AutoModel.from_config(config, dtype=torch.float32)
        # BERT-likes' NSP pooler (BERT, MPNet, RoBERTa): its weights are the model's and
        # stay in its versions, but the embedding pools the token states and never reads
        # it, so it gets no gradient. Frozen, data parallel ignores it instead of failing
        # ("parameters that were not used in producing loss", all-mpnet-base-v2 under
        # DDP); training does not change (AdamW skips a parameter without a gradient).
        pooler = getattr(self.hf, "pooler", None)
        if isinstance(pooler, nn.Module):
            pooler.requires_grad_(False)
        self.dense = dense_stack(dense)

    def token_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        ids = torch.where(attention_mask.bool(), input_ids, self.pad_token_id)
        return self.hf(input_ids=ids, attention_mask=attention_mask).last_hidden_state

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.token_states(input_ids, attention_mask)
        return embed_tokens(states, attention_mask, self.pooling, self.dense)
