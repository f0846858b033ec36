"""Export a model version's encoder in the sentence-transformers format:
``python -m embedfresh.jobs.export_st --set model=minilm --set version=v7``.

Writes ``models/{model}/versions/{version}/sentence-transformers/``: ``config.json``
(a ``BertModel`` config), ``model.safetensors`` (the encoder's weights under Hugging
Face's names, which our encoder already uses), the tokenizer (``tokenizer.json``,
``vocab.txt``, ``tokenizer_config.json``, ``special_tokens_map.json``),
``modules.json`` (Transformer -> Pooling (the model's mode) -> Normalize), ``sentence_bert_config.json``
and ``1_Pooling/config.json``, then a :mod:`embedfresh.core.markers` ``COMMIT`` last. The
truncation length (``max_seq_length``) defaults to the model's own, as the embed job's does, so
``SentenceTransformer(path).encode(texts)`` gives the job's vectors. A committed export
that still verifies is left as it is (versions are immutable, and so is this).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from embedfresh.core import layout, markers
from embedfresh.core.cli import main_for
from embedfresh.core.config import ExportConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.model.presets import ModelSpec
from embedfresh.ml.model.sources import ACTIVATIONS as ACTIVATION_NAMES
from embedfresh.ml.model.sources import DECODER_MODEL_TYPES

log = logging.getLogger("embedfresh.jobs.export_st")

SUBDIR = "sentence-transformers"
ENCODER_PREFIX = "encoder."


def export_dir(model: str, version: str) -> str:
    return f"{layout.model_version(model, version)}/{SUBDIR}"


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def bert_config(spec: ModelSpec) -> dict[str, Any]:
    """``transformers.BertConfig`` fields of our encoder (exact GELU, absolute positions)."""
    enc = spec.encoder
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": enc.vocab_size,
        "hidden_size": enc.hidden_size,
        "num_hidden_layers": enc.num_hidden_layers,
        "num_attention_heads": enc.num_attention_heads,
        "intermediate_size": enc.intermediate_size,
        "hidden_act": "gelu",
        "hidden_dropout_prob": enc.dropout,
        "attention_probs_dropout_prob": enc.dropout,
        "max_position_embeddings": enc.max_position_embeddings,
        "type_vocab_size": enc.type_vocab_size,
        "layer_norm_eps": enc.layer_norm_eps,
        "initializer_range": 0.02,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
    }


def vocab_txt(tokenizer_json: bytes) -> bytes:
    """``vocab.txt`` (one WordPiece token per line, in id order) from ``tokenizer.json``."""
    vocab = json.loads(tokenizer_json)["model"]["vocab"]
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in ordered] != list(range(len(ordered))):
        raise BadInputError("tokenizer.json's vocabulary ids are not 0..n-1")
    return ("\n".join(tok for tok, _ in ordered) + "\n").encode()


def tokenizer_settings(
    tokenizer_json: bytes, spec: ModelSpec | None = None
) -> tuple[dict[str, str], bool]:
    """The special tokens and lower-casing the model's own ``tokenizer.json`` uses: the
    export's ``tokenizer_config.json`` must say the same, or transformers' BERT tokenizer
    rewrites the normaliser to match it, or adds tokens the vocabulary does not have.

    Tokens are looked up by id in the vocabulary (a dict for WordPiece/BPE, a list of
    ``[piece, score]`` for Unigram: XLM-R, DeBERTa-v3) and the added special tokens."""
    tok = json.loads(tokenizer_json)
    normalizer = tok.get("normalizer") or {}
    lowercase = bool(normalizer.get("lowercase", False))
    model = tok.get("model") or {}
    vocab = model.get("vocab") or {}
    by_id: dict[int, str] = (
        {i: t for t, i in vocab.items()}
        if isinstance(vocab, dict)
        else {i: entry[0] for i, entry in enumerate(vocab)}
    )
    for added in tok.get("added_tokens") or []:
        by_id[int(added["id"])] = added["content"]
    known = set(by_id.values())
    unk = model.get("unk_token") or by_id.get(model.get("unk_id"))
    # The pad token the model was trained with (RoBERTa-like models: "<pad>", id 1); a
    # decoder's EOS, which its last-token pooling reads, pads it where it names no pad.
    architecture = (spec.architecture if spec else None) or {}
    eos = architecture.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    pad_id = architecture.get("pad_token_id")
    if pad_id is None:
        pad_id = eos if architecture.get("model_type") in DECODER_MODEL_TYPES else 0
    special = {"unk_token": unk, "pad_token": by_id.get(pad_id), "eos_token": by_id.get(eos)}
    for key, names in (
        ("cls_token", ("[CLS]", "<s>")),
        ("sep_token", ("[SEP]", "</s>")),
        ("mask_token", ("[MASK]", "<mask>")),
    ):
        found = [n for n in names if n in known]
        if found:
            special[key] = found[0]
    return {k: v for k, v in special.items() if v}, lowercase


def encoder_weights(weights: dict[str, Any], prefix: str = ENCODER_PREFIX) -> dict[str, Any]:
    """The encoder's tensors of a relevance model's state dict under transformers' names
    (BertModel's for our encoder, the architecture's own on the generic path)."""
    out = {
        k[len(prefix) :]: v.detach().to("cpu").contiguous()
        for k, v in weights.items()
        if k.startswith(prefix) and not k.startswith(f"{ENCODER_PREFIX}dense.")
    }
    if not out:
        raise BadInputError("the model version has no encoder weights to export")
    if prefix != ENCODER_PREFIX:
        return out
    # BertModel has a pooler (for next-sentence prediction) that mean pooling never
    # reads; zeros keep transformers from reporting it as missing and randomly initialised.
    import torch

    hidden = out["embeddings.word_embeddings.weight"].shape[1]
    out.setdefault("pooler.dense.weight", torch.zeros(hidden, hidden))
    out.setdefault("pooler.dense.bias", torch.zeros(hidden))
    return out


def weights_of_dense(weights: dict[str, Any]) -> list[dict[str, Any]]:
    """Each Dense module's tensors (``linear.weight``, ``linear.bias``), in order."""
    layers: dict[int, dict[str, Any]] = {}
    for key, value in weights.items():
        if key.startswith(f"{ENCODER_PREFIX}dense."):
            index, name = key[len(f"{ENCODER_PREFIX}dense.") :].split(".", 1)
            layers.setdefault(int(index), {})[name] = value.detach().to("cpu").contiguous()
    return [layers[i] for i in sorted(layers)]


def st_modules(spec: ModelSpec, dense_weights: list[dict[str, Any]]) -> dict[str, bytes]:
    """``modules.json`` (Transformer -> Pooling -> Dense... -> Normalize) and each
    module's folder: ``1_Pooling/config.json``, ``<i>_Dense/`` (config, weights),
    ``<n>_Normalize/config.json``."""
    from safetensors.torch import save

    names = {v: k for k, v in ACTIVATION_NAMES.items()}
    modules = [("", "Transformer"), ("1_Pooling", "Pooling")]
    files = {
        "1_Pooling/config.json": _json(
            {
                "word_embedding_dimension": spec.encoder.hidden_size,
                "pooling_mode_cls_token": spec.pooling_mode == "cls",
                "pooling_mode_mean_tokens": spec.pooling_mode == "mean",
                "pooling_mode_max_tokens": spec.pooling_mode == "max",
                "pooling_mode_lasttoken": spec.pooling_mode == "lasttoken",
                "pooling_mode_mean_sqrt_len_tokens": False,
            }
        )
    }
    for layer, tensors in zip(spec.dense or [], dense_weights, strict=True):
        path = f"{len(modules)}_Dense"
        modules.append((path, "Dense"))
        files[f"{path}/config.json"] = _json(
            {
                "in_features": layer.in_features,
                "out_features": layer.out_features,
                "bias": layer.bias,
                "activation_function": names[layer.activation],
            }
        )
        files[f"{path}/model.safetensors"] = save(tensors, metadata={"format": "pt"})
    path = f"{len(modules)}_Normalize"
    modules.append((path, "Normalize"))
    # Object stores have no empty directories; Normalize has no parameters.
    files[f"{path}/config.json"] = _json({})
    listing = [
        {"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{kind}"}
        for i, (p, kind) in enumerate(modules)
    ]
    return {"modules.json": _json(listing), **files}


def st_files(
    spec: ModelSpec, weights: dict[str, Any], tokenizer_json: bytes, max_seq_length: int
) -> dict[str, bytes]:
    """Every file of the sentence-transformers directory, by relative path."""
    from safetensors.torch import save

    special, lowercase = tokenizer_settings(tokenizer_json, spec)
    if spec.architecture is None:  # our BERT encoder, under BertModel's names
        config = bert_config(spec)
        tensors = encoder_weights(weights)
        tokenizer_files = {
            "vocab.txt": vocab_txt(tokenizer_json),
            "tokenizer_config.json": _json(
                {
                    **special,
                    "tokenizer_class": "BertTokenizer",
                    "do_lower_case": lowercase,
                    "do_basic_tokenize": True,
                    "tokenize_chinese_chars": True,
                    "strip_accents": None,
                    "model_max_length": max_seq_length,
                }
            ),
        }
    else:  # any other encoder: its own config and names; the tokenizer as tokenizer.json says
        config = spec.architecture
        tensors = encoder_weights(weights, prefix=f"{ENCODER_PREFIX}hf.")
        tokenizer_files = {
            "tokenizer_config.json": _json(
                {
                    **special,
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "model_max_length": max_seq_length,
                }
            ),
        }
    return {
        "config.json": _json(config),
        "model.safetensors": save(tensors, metadata={"format": "pt"}),
        "tokenizer.json": tokenizer_json,
        **tokenizer_files,
        "special_tokens_map.json": _json(special),
        **st_modules(spec, weights_of_dense(weights)),
        "sentence_bert_config.json": _json(
            {"max_seq_length": max_seq_length, "do_lower_case": False}
        ),
        "config_sentence_transformers.json": _json(
            {
                "__version__": {},
                "prompts": dict(spec.prompts or {}),
                "default_prompt_name": None,
                "similarity_fn_name": "cosine",
            }
        ),
    }


def export(cfg: ExportConfig) -> dict[str, Any]:
    """Write the version's encoder as a sentence-transformers model, COMMIT last."""
    from embedfresh.ml.model import versions

    store = ArtifactStore(cfg.artifact_root)
    version = versions.load(store, cfg.model, cfg.version)
    spec = version.spec
    max_seq_length = spec.check_embedding_length(cfg.max_seq_length or spec.embedding_max_length)
    directory = export_dir(cfg.model, cfg.version)
    existing = markers.read_marker(store, directory)
    if existing is not None and markers.verify(store, directory).ok:
        if existing.get("max_seq_length") != max_seq_length:
            raise BadInputError(
                f"{store.url(directory)} is already exported with max_seq_length "
                f"{existing.get('max_seq_length')}, not {max_seq_length} (exports made before "
                "the model's own length became the default cut at the training length); "
                "exports are immutable: ask for that length with --set max_seq_length="
                f"{existing.get('max_seq_length')}, or export another version"
            )
        log.info("%s already exported and verified: left as it is", store.url(directory))
        return {
            "status": "ok",
            "output": store.url(directory),
            "max_seq_length": max_seq_length,
            "skipped": True,
        }
    files = st_files(spec, version.weights, version.tokenizer_json, max_seq_length)
    markers.publish(
        store,
        directory,
        files,
        meta={
            "kind": "sentence-transformers",
            "model": cfg.model,
            "version": cfg.version,
            "version_url": version.url,
            "max_seq_length": max_seq_length,
            "hidden": spec.embedding_dim,
            "run_id": cfg.run_id,
        },
    )
    log.info("exported %s (max_seq_length %d)", store.url(directory), max_seq_length)
    return {
        "status": "ok",
        "output": store.url(directory),
        "max_seq_length": max_seq_length,
        "skipped": False,
    }


def local_copy(store: ArtifactStore, model: str, version: str, dest: Path) -> Path:
    """Copy a committed, verified export to ``dest`` (for ``SentenceTransformer(dest)``)."""
    directory = export_dir(model, version)
    check = markers.verify(store, directory)
    if not check.ok:
        raise BadInputError(f"{store.url(directory)} is not a usable export: {check.reason}")
    marker = markers.read_marker(store, directory) or {}
    for name in marker["files"]:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.read_bytes(f"{directory}/{name}"))
    return dest


if __name__ == "__main__":
    main_for("export_st", ExportConfig, export)
