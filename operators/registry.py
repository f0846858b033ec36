"""The registry's production pointer, read in the worker through the jobs' own parser."""

from __future__ import annotations

from airflow.sdk.exceptions import AirflowFailException


def production_version(artifact_root: str, model: str) -> str:
    """The registry's production version of ``model``
    (:meth:`embedfresh.core.registry.Registry.production_version`, torch-free).

    :raises AirflowFailException: no registry, no production version, or a registry
        that is not valid (the same checks as the jobs').
    """
    from embedfresh.core.exit_codes import BadInputError
    from embedfresh.core.registry import Registry
    from embedfresh.core.storage import ArtifactStore

    registry = Registry(ArtifactStore(artifact_root), model)
    try:
        version = registry.production_version()
    except BadInputError as e:
        raise AirflowFailException(str(e)) from e
    if version is None:
        raise AirflowFailException(
            f"model {model!r} has no production version in {registry.url}: nothing was "
            "promoted yet; promote a version first or name one explicitly"
        )
    return version
