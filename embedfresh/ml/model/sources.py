"""A team's own model: a sentence-transformers or Hugging Face transformers directory.

``read_source(url)`` reads such a directory (a local path, ``file://`` or ``s3://``)
the way sentence-transformers does: ``modules.json`` lists the modules,
``1_Pooling/config.json`` says how tokens are pooled, ``2_Normalize`` whether vectors are
unit length, ``sentence_bert_config.json`` holds ``max_seq_length``; a plain transformers
directory (no ``modules.json``) is mean-pooled, as sentence-transformers does with one.
Everything is validated before anything is written, and what this project cannot run
the same way is refused with the reason instead of giving other vectors:

- code from the model's repository (``auto_map``, ``trust_remote_code``) never runs;
- weights load only from safetensors (a ``.bin``-only model gets the conversion command);
- the tokenizer must be a fast one (``tokenizer.json``), which every job uses as is;
- ``max_seq_length`` comes from ``sentence_bert_config.json`` (sentence-transformers < 6)
  or ``tokenizer_config.json``'s ``model_max_length`` (6.x), else the position limit;
- BERT encoders with absolute positions run on the fast path here, any other encoder
  transformers' ``AutoModel`` builds (RoBERTa/XLM-R, MPNet, DistilBERT, ...) on the
  generic path, pooled by mean, CLS token or max as their Pooling config says, then
  their Dense modules; their ``query`` and ``document`` prompts go before queries and
  documents as ``encode_query``/``encode_document`` put them;
- decoder embedding models (Qwen2/Qwen3, Mistral, Llama: Qwen3-Embedding, gte-Qwen2,
  e5-mistral) run on the generic path too, pooled by their last token: the Pooling
  config's ``lasttoken`` (or, for a plain transformers directory, which has none, the
  pooling such models are trained with). Their tokenizer must append the EOS token
  that pooling reads; which side it pads does not matter here: the last attended token is
  found on either side, and rotary positions give a left-padded text the vectors of a
  right-padded one;
- other decoders, other pooling modes or modules and a ``default_prompt_name`` are
  refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.model.presets import positions_usable

# Module types by class name: sentence-transformers < 6 writes
# ``sentence_transformers.models.Pooling``, 6.x ``sentence_transformers.<...>.pooling.Pooling``.
TRANSFORMER = "Transformer"
POOLING = "Pooling"
DENSE = "Dense"
NORMALIZE = "Normalize"
ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
}
"""sentence-transformers' Dense ``activation_function`` names -> ours."""
DOCUMENT_PROMPTS = ("document", "passage", "corpus")
"""Prompt names sentence-transformers' ``encode_document`` looks for, in its order."""
DECODER_MODEL_TYPES = ("qwen2", "qwen3", "mistral", "llama")
"""Decoder architectures embedded here (last-token pooling, rotary positions)."""
FAST_PATH_MODEL_TYPES = ("bert",)
"""``model_type`` values whose weights load into :class:`~embedfresh.ml.model.encoder.BertEncoder`
(with absolute positions and exact gelu): the fast path. Any other encoder that
transformers' ``AutoModel`` builds runs on the generic path."""

CONVERT_TO_SAFETENSORS = (
    'python -c "from transformers import AutoModel; '
    "AutoModel.from_pretrained('{path}').save_pretrained('{path}', safe_serialization=True)\""
)
SAVE_EOS_TOKENIZER = (
    'python -c "from transformers import AutoTokenizer; '
    "AutoTokenizer.from_pretrained('{path}', add_eos_token=True).save_pretrained('{path}')\""
)
SAVE_FAST_TOKENIZER = (
    'python -c "from transformers import AutoTokenizer; '
    "AutoTokenizer.from_pretrained('{path}').save_pretrained('{path}')\""
)


@dataclass(frozen=True)
class SourceModel:
    """What a model directory says, validated; weights still as safetensors bytes."""

    url: str
    config: dict[str, Any]
    """Its ``config.json`` (transformers)."""
    weights: bytes
    """Its ``model.safetensors``."""
    tokenizer_json: bytes
    max_seq_length: int
    pooling: str
    normalize: bool
    kind: str
    """``sentence-transformers`` or ``transformers``."""
    dense: tuple[tuple[dict[str, Any], bytes], ...] = ()
    """Each Dense module: ``{in_features, out_features, bias, activation}`` and its
    ``model.safetensors`` (``linear.weight``, ``linear.bias``)."""
    prompts: dict[str, str] | None = None
    """``query`` and ``document`` prompts, where the model defines them."""


def _root_url(source: str) -> str:
    if "://" in source:
        return source.rstrip("/")
    path = Path(source).expanduser().resolve()
    if not path.is_dir():
        raise BadInputError(f"model source {source} is not a directory")
    return f"file://{path}"


def _json(store: ArtifactStore, name: str) -> Any | None:
    if not store.exists(name):
        return None
    try:
        return json.loads(store.read_bytes(name))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInputError(f"{store.url(name)} is not valid JSON: {e}") from e


def _pooling(store: ArtifactStore, modules: list[dict[str, Any]]) -> tuple[str, bool]:
    """(pooling mode, normalize) from ``modules.json``; refuses what we cannot reproduce."""
    types = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if not types or types[0] != TRANSFORMER:
        raise BadInputError(
            f"{store.url('modules.json')}: the first module must be {TRANSFORMER}, got {types[:1]}"
        )
    order = [t for t in types[1:] if t in (POOLING, DENSE, NORMALIZE)]
    if order != types[1:] or order[:1] != [POOLING] or NORMALIZE in order[:-1]:
        raise BadInputError(
            f"{store.url('modules.json')}: modules {types} are not supported (only "
            "Transformer -> Pooling -> Dense... -> Normalize): others would change the vectors"
        )
    pooling_modules = [m for m, t in zip(modules, types, strict=True) if t == POOLING]
    if len(pooling_modules) != 1:
        raise BadInputError(f"{store.url('modules.json')}: expected one Pooling module")
    rel = f"{pooling_modules[0].get('path', '1_Pooling')}/config.json"
    config = _json(store, rel)
    if not isinstance(config, dict):
        raise BadInputError(f"{store.url(rel)} is missing: the Pooling module has no config")
    # {"pooling_mode": "mean"} (sentence-transformers 6) or {"pooling_mode_mean_tokens": true}.
    modes = sorted(k for k, v in config.items() if k.startswith("pooling_mode_") and v is True)
    if isinstance(config.get("pooling_mode"), str):
        modes = [f"pooling_mode_{config['pooling_mode']}"]
    supported = {
        "pooling_mode_mean_tokens": "mean",
        "pooling_mode_mean": "mean",
        "pooling_mode_cls_token": "cls",
        "pooling_mode_cls": "cls",
        "pooling_mode_max_tokens": "max",
        "pooling_mode_max": "max",
        "pooling_mode_lasttoken": "lasttoken",
    }
    if config.get("include_prompt") is False:
        raise BadInputError(
            f"{store.url(rel)}: include_prompt false (prompt tokens left out of pooling) is "
            "not supported"
        )
    if len(modes) != 1 or modes[0] not in supported:
        raise BadInputError(
            f"{store.url(rel)}: pooling {modes} is not supported (one of mean, cls, max or "
            "lasttoken)"
        )
    return supported[modes[0]], NORMALIZE in types


def _dense(store: ArtifactStore, modules: list[dict[str, Any]]) -> tuple:
    """Each Dense module's config (ours) and safetensors weights, in order."""
    out = []
    for module in modules:
        if str(module.get("type", "")).rsplit(".", 1)[-1] != DENSE:
            continue
        path = module.get("path") or ""
        config = _json(store, f"{path}/config.json")
        if not isinstance(config, dict):
            raise BadInputError(f"{store.url(path)} has no config.json for its Dense module")
        activation = ACTIVATIONS.get(str(config.get("activation_function")))
        if activation is None:
            raise BadInputError(
                f"{store.url(path)}/config.json: activation {config.get('activation_function')!r}"
                f" is not supported ({', '.join(ACTIVATIONS)})"
            )
        if not store.exists(f"{path}/model.safetensors"):
            raise BadInputError(
                f"{store.url(path)} has no model.safetensors (pickle weights are never "
                "unpickled here): re-save the model with a current sentence-transformers "
                "(SentenceTransformer(path).save(path, safe_serialization=True))"
            )
        layer = {
            "in_features": config.get("in_features"),
            "out_features": config.get("out_features"),
            "bias": bool(config.get("bias", True)),
            "activation": activation,
        }
        out.append((layer, store.read_bytes(f"{path}/model.safetensors")))
    return tuple(out)


def _prompts(store: ArtifactStore) -> dict[str, str] | None:
    """The query and document prompts, as ``encode_query``/``encode_document`` use them.

    :raises BadInputError: a default prompt, which ``encode`` would put before every text
        whatever its role: ask which role it plays instead of guessing.
    """
    config = _json(store, "config_sentence_transformers.json") or {}
    prompts = {k: v for k, v in (config.get("prompts") or {}).items() if v}
    if config.get("default_prompt_name"):
        raise BadInputError(
            f"{store.url('config_sentence_transformers.json')}: default_prompt_name "
            f"{config['default_prompt_name']!r} is not supported (name the prompts query and "
            "document instead)"
        )
    document = next((prompts[k] for k in DOCUMENT_PROMPTS if k in prompts), "")
    found = {k: v for k, v in (("query", prompts.get("query", "")), ("document", document)) if v}
    return found or None


def fast_path(config: dict[str, Any]) -> bool:
    """Whether the model's weights run on our BERT encoder (else the generic path)."""
    return (
        config.get("model_type") in FAST_PATH_MODEL_TYPES
        and config.get("position_embedding_type", "absolute") == "absolute"
        and config.get("hidden_act", "gelu") == "gelu"
    )


def _check_architecture(root: str, config: dict[str, Any]) -> bool:
    """Refuse an architecture this project cannot embed with; whether it is a decoder."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_MAPPING_NAMES,
    )

    model_type = config.get("model_type")
    if model_type not in MODEL_MAPPING_NAMES:
        raise BadInputError(
            f"{root}/config.json: model_type {model_type!r} is not an architecture this "
            "transformers version ships (AutoModel cannot build it)"
        )
    if model_type in DECODER_MODEL_TYPES and not config.get("is_encoder_decoder"):
        return True
    # Encoders are the architectures pre-trained as masked language models (BERT,
    # RoBERTa/XLM-R, MPNet, DistilBERT, DeBERTa, ModernBERT, ...); other decoders
    # (GPT-2, Falcon, ...) and encoder-decoders are not.
    if (
        model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
        or config.get("is_decoder")
        or config.get("is_encoder_decoder")
    ):
        raise BadInputError(
            f"{root}/config.json: {model_type!r} is a decoder or encoder-decoder model; "
            f"supported are encoders and the decoders {', '.join(DECODER_MODEL_TYPES)}"
        )
    return False


def _check_eos(store: ArtifactStore, config: dict[str, Any], tokenizer_json: bytes) -> None:
    """Last-token pooling reads the EOS token's state: the tokenizer must append it.

    :raises BadInputError: no EOS token named, or the tokenizer does not append it
        (the command that saves one that does).
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json.decode())
    eos = config.get("eos_token_id")
    ids = set(eos if isinstance(eos, list) else [eos]) - {None}
    named = (_json(store, "tokenizer_config.json") or {}).get("eos_token")
    if isinstance(named, dict):
        named = named.get("content")
    if isinstance(named, str) and tok.token_to_id(named) is not None:
        ids.add(tok.token_to_id(named))
    if not ids:
        raise BadInputError(
            f"{store.url('config.json')}: last-token pooling reads the EOS token, and "
            "neither config.json (eos_token_id) nor tokenizer_config.json (eos_token) names one"
        )
    probe = tok.encode("an EOS probe", add_special_tokens=True).ids
    if not probe or probe[-1] not in ids:
        path = store.url("").removeprefix("file://")
        raise BadInputError(
            f"{store.url('tokenizer.json')} does not append the EOS token "
            f"{sorted(tok.id_to_token(i) or str(i) for i in ids)}: last-token pooling would "
            "pool each text's last word instead of the token the model was trained to pool. "
            f"Save a tokenizer that appends it: {SAVE_EOS_TOKENIZER.format(path=path)}"
        )


def _check_files(store: ArtifactStore, root: str, source: str) -> None:
    """Safetensors weights (pickles are never loaded) and a fast tokenizer."""
    if not store.exists("model.safetensors"):
        names = set(store.listdir(""))
        if "pytorch_model.bin" in names or any(n.endswith(".bin") for n in names):
            raise BadInputError(
                f"{root} has only PyTorch pickle weights (.bin), which are never unpickled "
                f"here; convert them to safetensors first: {CONVERT_TO_SAFETENSORS.format(path=source)}"
            )
        raise BadInputError(f"{root} has no model.safetensors")
    if not store.exists("tokenizer.json"):
        raise BadInputError(
            f"{root} has no tokenizer.json (a fast tokenizer); write one with: "
            f"{SAVE_FAST_TOKENIZER.format(path=source)}"
        )


def _max_seq_length(
    store: ArtifactStore, root: str, config: dict[str, Any], st_config: dict[str, Any]
) -> int:
    """``sentence_bert_config.json``'s, else ``tokenizer_config.json``'s
    ``model_max_length`` within the positions, else the position limit."""
    positions = positions_usable(config)
    max_seq_length = st_config.get("max_seq_length")
    if max_seq_length is None:
        tok_cfg = _json(store, "tokenizer_config.json") or {}
        limit = tok_cfg.get("model_max_length")
        max_seq_length = (
            int(limit) if isinstance(limit, int | float) and limit <= positions else positions
        )
    if not 2 <= int(max_seq_length) <= positions:
        raise BadInputError(
            f"{root}: max_seq_length {max_seq_length} is not within 2..{positions} "
            "(max_position_embeddings)"
        )
    return int(max_seq_length)


def read_source(source: str, storage_options: dict[str, Any] | None = None) -> SourceModel:
    """Read and validate the model directory at ``source``.

    :raises BadInputError: naming the file and what to do: not a model directory,
        remote code, no safetensors weights, no fast tokenizer, an unsupported
        architecture, pooling, module or prompt.
    """
    root = _root_url(source)
    store = ArtifactStore(root, storage_options)
    config = _json(store, "config.json")
    if not isinstance(config, dict):
        raise BadInputError(
            f"{root} has no config.json: not a Hugging Face transformers or "
            "sentence-transformers model directory"
        )
    if config.get("auto_map") or config.get("trust_remote_code"):
        raise BadInputError(
            f"{root}/config.json needs trust_remote_code (auto_map "
            f"{sorted(config.get('auto_map') or {})}): code from a model directory is never "
            "run; use a model whose architecture transformers ships"
        )
    decoder = _check_architecture(root, config)
    _check_files(store, root, source)
    modules = _json(store, "modules.json")
    if modules is None:
        # sentence-transformers mean-pools a plain transformers directory; a decoder
        # embedding model is trained to be read at its last token.
        kind, pooling, normalize = "transformers", "lasttoken" if decoder else "mean", False
        st_config: dict[str, Any] = {}
        dense, prompts = (), None
    else:
        if not isinstance(modules, list):
            raise BadInputError(f"{root}/modules.json must be a list of modules")
        kind = "sentence-transformers"
        pooling, normalize = _pooling(store, modules)
        st_config = _json(store, "sentence_bert_config.json") or {}
        if st_config.get("do_lower_case"):
            raise BadInputError(
                f"{root}/sentence_bert_config.json: do_lower_case is not supported (it "
                "lower-cases texts before the tokenizer); give the tokenizer a lowercasing "
                "normalizer instead"
            )
        dense = _dense(store, modules)
        prompts = _prompts(store)
    tokenizer_json = store.read_bytes("tokenizer.json")
    if pooling == "lasttoken" and not decoder:
        raise BadInputError(
            f"{root}: lasttoken pooling of the encoder {config.get('model_type')!r} is not "
            f"supported (it is for the decoders {', '.join(DECODER_MODEL_TYPES)})"
        )
    if pooling == "lasttoken":
        _check_eos(store, config, tokenizer_json)
    max_seq_length = _max_seq_length(store, root, config, st_config)
    return SourceModel(
        url=root,
        config=config,
        weights=store.read_bytes("model.safetensors"),
        tokenizer_json=tokenizer_json,
        max_seq_length=max_seq_length,
        pooling=pooling,
        normalize=normalize,
        kind=kind,
        dense=dense,
        prompts=prompts,
    )
