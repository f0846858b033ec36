"""Errors at the door: what a run reads (its model, a version, a corpus) checked before
its first task does any work, each refusal naming what the store does hold. Torch-free,
so the control plane runs it in the worker (the refresh DAG's first task, the corpus
DAG's version resolution)."""

from __future__ import annotations

from embedfresh.core import layout, markers
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.registry import Registry
from embedfresh.core.settings import MODEL_PRESETS
from embedfresh.core.shards import corpus_shards
from embedfresh.core.storage import ArtifactStore


def _named(names: list[str]) -> str:
    """At most 20 names, comma-separated."""
    return ", ".join(names[:20]) + (f" (and {len(names) - 20} more)" if len(names) > 20 else "")


def committed_versions(store: ArtifactStore, model: str) -> list[str]:
    """Names of the committed versions of ``model``, sorted."""
    parent = layout.model_versions(model)
    return sorted(
        name for name in store.listdir(parent) if store.exists(f"{parent}/{name}/{markers.COMMIT}")
    )


def check_model(store: ArtifactStore, model: str) -> None:
    """A preset, or a model with a production version (published or promoted).

    :raises BadInputError: naming the models the store holds and the publish command.
    """
    if model in MODEL_PRESETS or Registry(store, model).production_version() is not None:
        return
    known = store.listdir("models")
    raise BadInputError(
        f"model {model!r} is not a preset ({', '.join(MODEL_PRESETS)}) and has no production "
        f"version in {store.url()} (models there: {_named(known) or 'none'}); publish it "
        f"with python -m embedfresh.jobs.publish_model --set artifact_root={store.url()} "
        f"--set model={model} --set source=<its sentence-transformers directory>"
    )


def check_version(store: ArtifactStore, model: str, version: str) -> None:
    """``version`` is a committed version of ``model``.

    :raises BadInputError: naming the committed versions there are.
    """
    directory = layout.model_version(model, version)
    if store.exists(f"{directory}/{markers.COMMIT}"):
        return
    raise BadInputError(
        f"model version {version} of {model!r} does not exist ({store.url(directory)} has "
        f"no {markers.COMMIT}; committed versions: "
        f"{_named(committed_versions(store, model)) or 'none'})"
    )


def check_corpus(store: ArtifactStore, corpus: str) -> None:
    """``corpora/{corpus}/`` holds at least one ``part-NNNNN.parquet``.

    :raises BadInputError: naming the corpora there are.
    """
    corpus_shards(store, corpus)
