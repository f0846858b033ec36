"""Publish a team's own model as a version:
``python -m embedfresh.jobs.publish_model --set model=acme --set source=/models/acme-st``.

Reads a sentence-transformers (or Hugging Face transformers) directory from a local
path, ``file://`` or ``s3://`` (:mod:`embedfresh.ml.model.sources`: pooling, normalisation
and ``max_seq_length`` from its own configs; remote code, pickle weights and anything
this project would embed differently refused), and publishes
``models/{model}/versions/{version}/`` with its encoder weights, its own tokenizer, a
seeded relevance head and its spec, ``COMMIT`` last. Unless told otherwise it then makes
the version the model's first release when it has none yet: a release named after the
version, without corpus embeddings (compare-and-swap on "no production", recorded in the
registry's history), so the first refresh of ``model`` trains from it, the quality gate
compares against it, and that refresh makes the first release with document vectors. Everything is validated
before the first write; a re-run with the same source and settings finds the version
published and exits 0; another source under the same version name is refused.
"""

from __future__ import annotations

import datetime as dt
import getpass
import hashlib
import logging
from typing import TYPE_CHECKING, Any

from embedfresh.core.cli import main_for
from embedfresh.core.config import PublishModelConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.registry import PROMOTE, Registry
from embedfresh.core.releases import release_doc, write_release
from embedfresh.core.storage import ArtifactStore

if TYPE_CHECKING:
    from embedfresh.ml.model.presets import ModelSpec
    from embedfresh.ml.model.sources import SourceModel

log = logging.getLogger("embedfresh.jobs.publish_model")


def publish_model(cfg: PublishModelConfig) -> dict[str, Any]:
    """Publish the model directory ``source`` as version ``version`` of ``model``."""
    from embedfresh.ml.model import presets, sources, versions

    if cfg.model in presets.PRESET_NAMES:
        raise BadInputError(
            f"{cfg.model!r} is a built-in preset; publish your model under its own name "
            "(--set model=<name>)"
        )
    store = ArtifactStore(cfg.artifact_root)
    source = sources.read_source(cfg.source)
    if source.kind == "transformers" and source.pooling == "lasttoken":
        log.info(
            "%s is a transformers decoder directory without sentence-transformers files: "
            "embedded by last-token pooling (its EOS token), what decoder embedding models "
            "are trained for (sentence-transformers would mean-pool such a directory)",
            source.url,
        )
    spec = versions.spec_from_source(
        source,
        cfg.model,
        max_length=cfg.max_length or min(source.max_seq_length, 128),
        head_hidden=cfg.head_hidden,
        default_batch_size=cfg.batch_size,
        encoder_learning_rate=cfg.encoder_learning_rate,
        head_learning_rate=cfg.head_learning_rate,
    )
    url = _version(store, cfg, source, spec)
    production = Registry(store, cfg.model).production_version()
    if cfg.production and production is None:
        production = _base_release(store, cfg, url, source.url)
    elif production != cfg.version:
        log.info("production of %s stays %s", cfg.model, production)
    return {
        "status": "ok",
        "model": cfg.model,
        "version": cfg.version,
        "url": url,
        "max_seq_length": spec.embedding_max_length,
        "training_max_length": spec.max_length,
        "production": production,
    }


def _version(
    store: ArtifactStore, cfg: PublishModelConfig, source: SourceModel, spec: ModelSpec
) -> str:
    """The version's URL: published now, or found published from the same source and
    settings (another source under its name is refused: versions are immutable)."""
    from embedfresh.ml.model import versions

    # What was published, not where from: the same model mounted elsewhere is the same.
    fingerprint = {
        "source_weights_sha256": hashlib.sha256(source.weights).hexdigest(),
        "spec": spec.model_dump(mode="json"),
        "tokenizer_sha256": hashlib.sha256(source.tokenizer_json).hexdigest(),
        "dense_sha256": [hashlib.sha256(data).hexdigest() for _, data in source.dense],
        "seed": cfg.seed,
    }
    published = versions.is_committed(store, cfg.model, cfg.version)
    if published is not None:
        if published.get("config_hash") != _hash(fingerprint):
            raise BadInputError(
                f"version {cfg.version} of {cfg.model!r} already exists from another source "
                "or settings; versions are immutable (choose another --set version=...)"
            )
        log.info("version %s of %s already published from %s", cfg.version, cfg.model, source.url)
        return store.url(f"models/{cfg.model}/versions/{cfg.version}")
    weights = versions.source_weights(source, spec, cfg.seed)
    if not source.normalize:
        log.warning(
            "%s has no Normalize module: this project's embeddings are unit length, so "
            "they equal sentence-transformers' vectors divided by their norm",
            source.url,
        )
    url = versions.publish(
        store,
        spec,
        cfg.version,
        weights,
        {
            "base": True,
            "source": source.url,
            "source_kind": source.kind,
            "config_hash": _hash(fingerprint),
            "normalize_added": not source.normalize,
            "model_config": source.config,
        },
        tokenizer_json=source.tokenizer_json,
    )
    log.info("published %s (max_seq_length %d)", url, source.max_seq_length)
    return url


def _base_release(store: ArtifactStore, cfg: PublishModelConfig, url: str, source_url: str) -> str:
    """A release of the base version without corpora, named after it (compare-and-swap
    on "no production"): the first refresh gates against it and makes the first
    release with document vectors. Returns the production version."""
    base, _ = write_release(
        store,
        release_doc(
            model=cfg.model,
            release=cfg.version,
            version=cfg.version,
            version_url=url,
            run_id=cfg.run_id,
            action=PROMOTE,
            corpora={},
            gate={"verdict": "BASE", "report": None, "reason": f"base model from {source_url}"},
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        ),
    )
    Registry(store, cfg.model).release(
        base,
        details={
            "run_id": cfg.run_id,
            "verdict": "BASE",
            "reason": f"base model published from {source_url}",
            "user": getpass.getuser(),
        },
        expected_version=None,
        expected_release=None,
    )
    log.info("%s is now production of %s (release %s, no corpus embeddings yet)",
             cfg.version, cfg.model, cfg.version)  # fmt: skip
    return cfg.version


def _hash(obj: dict[str, Any]) -> str:
    import json

    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


if __name__ == "__main__":
    main_for("publish_model", PublishModelConfig, publish_model)
