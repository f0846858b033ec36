"""The registry's production pointer, read from the worker without the jobs' model code."""

from __future__ import annotations

import json

from airflow.sdk.exceptions import AirflowFailException


def production_version(artifact_root: str, model: str) -> str:
    """The registry's production version of ``model``, read directly (torch-free).

    :raises AirflowFailException: no registry, no production version, or a registry
        that does not parse.
    """
    from jobs import layout
    from jobs.storage import ArtifactStore

    store = ArtifactStore(artifact_root)
    rel = layout.registry(model)
    if not store.exists(rel):
        raise AirflowFailException(
            f"model {model!r} has no registry at {store.url(rel)}: nothing was promoted yet; "
            "promote a version first or name one explicitly"
        )
    try:
        doc = json.loads(store.read_bytes(rel))
        version = doc["production"]["version"]
    except (ValueError, KeyError, TypeError) as e:
        raise AirflowFailException(
            f"registry {store.url(rel)} names no production version ({e!r})"
        ) from e
    if not isinstance(version, str) or not version:
        raise AirflowFailException(f"registry {store.url(rel)} names no production version")
    return version
