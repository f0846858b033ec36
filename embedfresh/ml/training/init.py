"""What a run starts from: its start weights (``TrainConfig.init``), its dropout, and
the compile environment prepared before the backend starts."""

from __future__ import annotations

import os
from typing import Any

import torch

from embedfresh.core import layout
from embedfresh.core.config import TrainConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.compile import cache_key, modes, neuron_env, resolve_mode, torch_cache
from embedfresh.ml.compile.neuron import cache_root
from embedfresh.ml.model import versions
from embedfresh.ml.model.relevance import RelevanceModel


def load_start(model: RelevanceModel, version: versions.ModelVersion, what: str) -> None:
    """Load a start version's weights into ``model``. A version whose relevance head never
    trained (a published model's seeded head) gives its encoder alone when its head takes
    other features than the data declares; a trained head must take the same ones.

    :raises BadInputError: another architecture, or a trained head of other features.
    """
    spec = model.spec
    if version.spec.fingerprint() == spec.fingerprint():
        model.load_state_dict(version.weights, strict=True)
        return
    if version.spec.model_copy(update={"features": spec.features}).fingerprint() != (
        spec.fingerprint()
    ):
        raise BadInputError(
            f"{what} {version.url} has another architecture than model config {spec.name!r}"
        )
    meta = version.meta
    if not (meta.get("base") or meta.get("baseline") or meta.get("head_trained") is False):
        raise BadInputError(
            f"{what} {version.url} has a relevance head trained on features "
            f"{_named(version.spec.features)}, and the data declares "
            f"{_named(spec.features)}: declare the same features in the same order (the "
            "config's features or the data set's dataset.json), or start a new head from "
            "the base weights (--set init=base); docs/DATA.md"
        )
    encoder = {k: v for k, v in version.weights.items() if not k.startswith("head.")}
    missing, unexpected = model.load_state_dict(encoder, strict=False)
    assert not unexpected and all(k.startswith("head.") for k in missing), (missing, unexpected)


def _named(features: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{name} ({how})" for name, how in features) or "none (text-only)"


def resolve_init(cfg: TrainConfig, store: ArtifactStore, model: RelevanceModel) -> dict[str, Any]:
    """Load the starting weights into ``model``; returns where they came from.

    ``init=version``: the pinned ``init_version``; ``production``: the registry's
    production version (required); ``auto``: production if there is one, else base;
    ``base``: the model config's base weights.

    :raises BadInputError: the version is missing, uncommitted or of another
        architecture, or ``init=production`` with no production version yet.
    """
    if cfg.init == "version":
        pinned = cfg.init_version
        if versions.is_committed(store, cfg.model, pinned) is None:
            raise BadInputError(
                f"init_version {pinned} of {cfg.model} is not a committed model version"
            )
        version = versions.load(store, cfg.model, pinned)
        load_start(model, version, "init_version")
        return {"source": "version", "version": pinned, "url": version.url}
    production = None
    if cfg.init in ("auto", "production"):
        production = Registry(store, cfg.model).production_version()
        if production is None and cfg.init == "production":
            raise BadInputError(
                f"init=production but {store.url(layout.registry(cfg.model))} has no "
                "production version yet (use init=auto or init=base)"
            )
    if production is not None:
        version = versions.load(store, cfg.model, production)
        load_start(model, version, "production version")
        return {"source": "production", "version": production, "url": version.url}
    return {"source": "base", "weights": versions.load_base_weights(model)}


def set_dropout(model: torch.nn.Module, p: float) -> None:
    """Set every dropout probability of ``model`` to ``p`` (``TrainConfig.dropout``)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = p
        if hasattr(module, "dropout_p"):  # attention dropout inside SDPA
            module.dropout_p = p


def prepare_compile(cfg: TrainConfig, backend_name: str) -> dict[str, Any]:
    """Before the backend starts: Neuron's compile environment (the one the compile job
    gave its trial), or the torch.compile cache entry restored. Returns the report's
    ``compile`` section."""
    mode = resolve_mode(cfg.compile, backend_name, cfg.model, cfg.parallelism)
    info: dict[str, Any] = {"mode": mode}
    if mode == modes.NEURON_PARALLEL_COMPILE:
        env = neuron_env(cfg)
        os.environ.update(env)
        info["env"] = env
    elif mode == modes.TORCH_COMPILE:
        key = cache_key(cfg, backend_name, mode)  # this launch's world size, as compile's
        info["cache"] = torch_cache.restore(cache_root(cfg), backend_name, key)
    return info
