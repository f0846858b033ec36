"""Model versions in the store: publish once (COMMIT last), load anywhere.

``models/{model}/versions/{version}/`` holds ``model.safetensors`` (the whole relevance
model), ``model.json`` (its :class:`ModelSpec` and provenance) and ``tokenizer.json``,
so a version is self-contained: evaluation and embedding need nothing else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from embedfresh.core import layout, markers
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.inputs import check_model, check_version
from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.checkpoint import cpu_state_dict, load_weights_bytes
from embedfresh.ml.model.encoder import BertEncoder
from embedfresh.ml.model.presets import (
    PRESET_NAMES,
    DenseLayer,
    EncoderConfig,
    ModelSpec,
    get_spec,
    minilm_dir,
    tokenizer_file,
)
from embedfresh.ml.model.relevance import RelevanceModel
from embedfresh.ml.model.sources import SourceModel

log = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
SPEC = "model.json"
TOKENIZER = "tokenizer.json"


@dataclass(frozen=True)
class ModelVersion:
    model: str
    version: str
    spec: ModelSpec
    weights: dict[str, torch.Tensor]
    tokenizer_json: bytes
    meta: dict[str, Any]
    url: str


def build_model(spec: ModelSpec, seed: int) -> RelevanceModel:
    """A freshly initialised model; the seed makes the random init reproducible."""
    torch.manual_seed(seed)
    return RelevanceModel(spec)


def load_base_weights(model: RelevanceModel) -> str:
    """Apply the config's base weights to ``model``; returns a description of them."""
    spec = model.spec
    if spec.base_weights == "random":
        return "random init"
    if spec.base_weights == "published":
        raise BadInputError(
            f"model {spec.name!r} has no built-in base weights: it starts from its published "
            "versions (init=auto or init=production, or init_version=<version>)"
        )
    path = minilm_dir() / "model.safetensors"
    hf = load_file(str(path))
    encoder_state = {k: v for k, v in hf.items() if not k.startswith(BertEncoder.IGNORED_KEYS)}
    missing, unexpected = model.encoder.load_state_dict(encoder_state, strict=False)
    if missing or unexpected:
        raise BadInputError(
            f"{path} does not match the {spec.name} encoder: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    return f"all-MiniLM-L6-v2 ({path})"


def is_committed(store: ArtifactStore, model: str, version: str) -> dict[str, Any] | None:
    return markers.read_marker(store, layout.model_version(model, version))


def version_meta(store: ArtifactStore, model: str, version: str) -> dict[str, Any]:
    """What a version's ``model.json`` records beside its spec (run id, init, steps)."""
    return _read_spec(store, layout.model_version(model, version))[1]


def publish(
    store: ArtifactStore,
    spec: ModelSpec,
    version: str,
    weights: dict[str, torch.Tensor],
    meta: dict[str, Any],
    tokenizer_json: bytes | None = None,
) -> str:
    """Write a version and commit it. An existing committed version is never replaced.

    ``tokenizer_json``: the model's own tokenizer; None: the presets' (MiniLM's).

    The weights are serialised straight from the tensors' memory into a local file and
    uploaded from it, hashed as they are read: publishing holds no second copy of them
    (in bytes), which is what lets the whole weights of a model sharded over many
    devices be published from one host's memory."""
    directory = layout.model_version(spec.name, version)
    existing = markers.read_marker(store, directory)
    if existing is not None:
        raise BadInputError(
            f"model version {store.url(directory)} already exists; versions are immutable "
            "(choose another version name)"
        )
    files = {
        SPEC: json.dumps(
            {"spec": spec.model_dump(mode="json"), **meta}, indent=2, sort_keys=True
        ).encode(),
        TOKENIZER: tokenizer_json if tokenizer_json is not None else tokenizer_file().read_bytes(),
    }
    with tempfile.TemporaryDirectory(prefix="embedfresh-version-") as tmp:
        local = os.path.join(tmp, WEIGHTS)
        save_file({k: v.contiguous() for k, v in weights.items()}, local)
        uploaded = {WEIGHTS: _file_digest(local)}
        store.put_file(local, f"{directory}/{WEIGHTS}")
    markers.publish(
        store,
        directory,
        files,
        written=uploaded,
        meta={
            "model": spec.name,
            "version": version,
            **{k: meta[k] for k in ("config_hash", "run_id") if k in meta},
        },
    )
    return store.url(directory)


def _file_digest(path: str) -> tuple[str, int]:
    """(sha256, size) of a local file, read a block at a time."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def load(store: ArtifactStore, model: str, version: str) -> ModelVersion:
    """Load a committed, checksum-verified version.

    :raises BadInputError: the version does not exist, is not committed or is corrupt.
    """
    directory = layout.model_version(model, version)
    url = store.url(directory)
    check_version(store, model, version)
    check = markers.verify(store, directory)
    if not check.ok:
        raise BadInputError(f"model version {url} is not usable: {check.reason}")
    spec, meta = _read_spec(store, directory)
    return ModelVersion(
        model=model,
        version=version,
        spec=spec,
        weights=load_weights_bytes(store.read_bytes(f"{directory}/{WEIGHTS}")),
        tokenizer_json=store.read_bytes(f"{directory}/{TOKENIZER}"),
        meta=meta,
        url=url,
    )


def _read_spec(store: ArtifactStore, directory: str) -> tuple[ModelSpec, dict[str, Any]]:
    """A version's :class:`ModelSpec` and the rest of its ``model.json``."""
    meta = json.loads(store.read_bytes(f"{directory}/{SPEC}"))
    try:
        return ModelSpec.model_validate(meta.pop("spec")), meta
    except Exception as e:
        raise BadInputError(
            f"model version {store.url(directory)} has an invalid model.json: {e}"
        ) from e


def resolve_model(store: ArtifactStore, model: str) -> tuple[ModelSpec, bytes]:
    """The architecture and tokenizer a run of ``model`` uses: a preset's, or for a
    team's own model those of its production version (all its versions share them).

    :raises BadInputError: neither a preset nor a model with a production version.
    """
    if model in PRESET_NAMES:
        return get_spec(model), tokenizer_file().read_bytes()
    check_model(store, model)
    production = Registry(store, model).production_version()
    # Its spec and tokenizer only (a run loads and verifies the weights it starts from).
    directory = layout.model_version(model, production)
    spec, _ = _read_spec(store, directory)
    return spec, store.read_bytes(f"{directory}/{TOKENIZER}")


def training_spec(
    store: ArtifactStore, model: str, dataset: str, features: Sequence[Sequence[str]] | None
) -> tuple[ModelSpec, bytes]:
    """The architecture and tokenizer a training run of ``model`` on ``dataset`` trains
    (:func:`resolve_model`), its relevance head taking ``features`` (the config's
    declaration), else the data set's own (:func:`~embedfresh.ml.data.reader.
    declared_features`; text-only if it declares none)."""
    from embedfresh.ml.data.reader import check_declaration, declared_features

    spec, tokenizer_json = resolve_model(store, model)
    if features is None:
        declared = declared_features(store, dataset)
    else:
        declared = check_declaration(features, "the config's features")
    return spec.model_copy(update={"features": declared}), tokenizer_json


def spec_from_source(source: SourceModel, name: str, **training: Any) -> ModelSpec:
    """The :class:`ModelSpec` of a team's model directory; ``training`` holds the
    training settings (``max_length``, ``head_hidden``, ...). BERT encoders take the
    fast path; any other encoder keeps its transformers config (``architecture``)."""
    from embedfresh.ml.model.hf_encoder import hf_config
    from embedfresh.ml.model.sources import fast_path

    fast = fast_path(source.config)
    try:
        # Through transformers' config class, whose attribute map reads every family's
        # names (DistilBERT's dim/n_layers/n_heads are hidden_size/... there).
        c = hf_config(source.config)
        encoder = EncoderConfig(
            vocab_size=c.vocab_size,
            hidden_size=c.hidden_size,
            num_hidden_layers=c.num_hidden_layers,
            num_attention_heads=c.num_attention_heads,
            intermediate_size=getattr(c, "intermediate_size", None)
            or getattr(c, "hidden_dim", None)
            or 4 * c.hidden_size,
            max_position_embeddings=c.max_position_embeddings,
            type_vocab_size=getattr(c, "type_vocab_size", None) or 2,
            layer_norm_eps=getattr(c, "layer_norm_eps", None) or 1e-12,
            dropout=getattr(c, "hidden_dropout_prob", None) or getattr(c, "dropout", 0.1),
        )
        return ModelSpec(
            name=name,
            encoder=encoder,
            base_weights="published",
            max_seq_length=source.max_seq_length,
            architecture=None if fast else source.config,
            pooling=None if source.pooling == "mean" else source.pooling,
            dense=[DenseLayer(**layer) for layer, _ in source.dense] or None,
            prompts=source.prompts,
            **training,
        )
    except (AttributeError, KeyError, ValueError) as e:
        raise BadInputError(
            f"{source.url}/config.json does not describe a usable encoder: {e}"
        ) from e


def source_weights(source: SourceModel, spec: ModelSpec, seed: int) -> dict[str, torch.Tensor]:
    """A relevance model's state dict: the source's encoder weights, a seeded new head.

    :raises BadInputError: the weights do not match the encoder the config describes.
    """
    from safetensors.torch import load as load_safetensors

    net = build_model(spec, seed)
    hf = load_safetensors(source.weights)
    if spec.architecture is None:
        target, ignored = net.encoder, BertEncoder.IGNORED_KEYS
    else:
        target, ignored = net.encoder.hf, ("pooler.",)
    # sentence-transformers and AutoModel save the base model's names; a *ForX model
    # prefixes them with its base_model_prefix ("bert.", "roberta.", "distilbert.").
    own = set(target.state_dict())
    if not own & set(hf):
        prefixes = {k.split(".", 1)[0] + "." for k in hf if "." in k}
        for prefix in prefixes:
            stripped = {k[len(prefix) :]: v for k, v in hf.items() if k.startswith(prefix)}
            if own & set(stripped):
                hf = stripped
                break
    state = {k: v for k, v in hf.items() if not k.startswith(ignored)}
    missing, unexpected = target.load_state_dict(state, strict=False)
    # Position-id buffers and a pooler the checkpoint leaves out are not weights pooling reads.
    # (Dense modules load from their own files, below.)
    missing = [
        k for k in missing if not k.startswith((*ignored, "dense.")) and not k.endswith("_ids")
    ]
    unexpected = [k for k in unexpected if not k.endswith("_ids")]
    if missing or unexpected:
        raise BadInputError(
            f"{source.url}/model.safetensors does not match its config.json's encoder: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    for i, (_, data) in enumerate(source.dense):
        try:
            net.encoder.dense[i].load_state_dict(load_safetensors(data), strict=True)
        except RuntimeError as e:
            raise BadInputError(
                f"{source.url}: Dense module {i} does not match its config: {e}"
            ) from e
    return cpu_state_dict(net)


def instantiate(version: ModelVersion) -> RelevanceModel:
    model = RelevanceModel(version.spec)
    model.load_state_dict(version.weights, strict=True)
    return model


def ensure_baseline(store: ArtifactStore, model: str, name: str, seed: int) -> str:
    """Publish the base weights as version ``name`` once; returns its name."""
    if is_committed(store, model, name) is not None:
        return name

    spec, tokenizer_json = resolve_model(store, model)
    net = build_model(spec, seed)
    source = load_base_weights(net)
    publish(
        store,
        spec,
        name,
        cpu_state_dict(net),
        {"baseline": True, "weights": source},
        tokenizer_json=tokenizer_json,
    )
    log.info("published baseline version %s (%s)", name, source)
    return name
