"""Model versions in the store: publish once (COMMIT last), load anywhere.

``models/{model}/versions/{version}/`` holds ``model.safetensors`` (the whole relevance
model), ``model.json`` (its :class:`ModelSpec` and provenance) and ``tokenizer.json``,
so a version is self-contained: evaluation and embedding need nothing else.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load_file

from embedfresh.core import layout, markers
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.checkpoint import cpu_state_dict, load_weights_bytes, weights_bytes
from embedfresh.ml.model.encoder import BertEncoder
from embedfresh.ml.model.presets import ModelSpec, get_spec, minilm_dir, tokenizer_file
from embedfresh.ml.model.relevance import RelevanceModel

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


def publish(
    store: ArtifactStore,
    spec: ModelSpec,
    version: str,
    weights: dict[str, torch.Tensor],
    meta: dict[str, Any],
) -> str:
    """Write a version and commit it. An existing committed version is never replaced."""
    directory = layout.model_version(spec.name, version)
    existing = markers.read_marker(store, directory)
    if existing is not None:
        raise BadInputError(
            f"model version {store.url(directory)} already exists; versions are immutable "
            "(choose another version name)"
        )
    files = {
        WEIGHTS: weights_bytes(weights),
        SPEC: json.dumps(
            {"spec": spec.model_dump(mode="json"), **meta}, indent=2, sort_keys=True
        ).encode(),
        TOKENIZER: tokenizer_file().read_bytes(),
    }
    markers.publish(
        store,
        directory,
        files,
        meta={
            "model": spec.name,
            "version": version,
            **{k: meta[k] for k in ("config_hash", "run_id") if k in meta},
        },
    )
    return store.url(directory)


def load(store: ArtifactStore, model: str, version: str) -> ModelVersion:
    """Load a committed, checksum-verified version.

    :raises BadInputError: the version does not exist, is not committed or is corrupt.
    """
    directory = layout.model_version(model, version)
    url = store.url(directory)
    if not store.exists(f"{directory}/{markers.COMMIT}"):
        raise BadInputError(
            f"model version {version} of {model!r} does not exist ({url} has no "
            f"{markers.COMMIT}); versions in the store: {', '.join(list_versions(store, model)) or 'none'}"
        )
    check = markers.verify(store, directory)
    if not check.ok:
        raise BadInputError(f"model version {url} is not usable: {check.reason}")
    meta = json.loads(store.read_bytes(f"{directory}/{SPEC}"))
    try:
        spec = ModelSpec.model_validate(meta.pop("spec"))
    except Exception as e:
        raise BadInputError(f"model version {url} has an invalid model.json: {e}") from e
    return ModelVersion(
        model=model,
        version=version,
        spec=spec,
        weights=load_weights_bytes(store.read_bytes(f"{directory}/{WEIGHTS}")),
        tokenizer_json=store.read_bytes(f"{directory}/{TOKENIZER}"),
        meta=meta,
        url=url,
    )


def list_versions(store: ArtifactStore, model: str) -> list[str]:
    """Names of the committed versions of ``model``, sorted."""
    parent = layout.model_versions(model)
    return sorted(
        name for name in store.listdir(parent) if store.exists(f"{parent}/{name}/{markers.COMMIT}")
    )


def instantiate(version: ModelVersion) -> RelevanceModel:
    model = RelevanceModel(version.spec)
    model.load_state_dict(version.weights, strict=True)
    return model


def ensure_baseline(store: ArtifactStore, model: str, name: str, seed: int) -> str:
    """Publish the base weights as version ``name`` once; returns its name."""
    if is_committed(store, model, name) is not None:
        return name

    spec = get_spec(model)
    net = build_model(spec, seed)
    source = load_base_weights(net)
    publish(store, spec, name, cpu_state_dict(net), {"baseline": True, "weights": source})
    log.info("published baseline version %s (%s)", name, source)
    return name
