"""Which of the two human overrides (promote anyway, roll back) the page offers a user.

The page changes no state: each override is a run of its own DAG
(:data:`~embedfresh.plugins.model_quality.settings.OVERRIDE_DAG_IDS`), so the button is
a link to that DAG in the Airflow UI, where the user triggers it with its Params (promote
anyway: ``version`` and ``corpora``; roll back: ``release``) and a reason; the page shows
the values it knows beside each link. Airflow decides who may: the link is shown only to a user the auth manager lets
trigger the DAG (``POST`` on its runs), and the api-server refuses anyone else's trigger
whatever the page shows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from embedfresh.plugins.model_quality.settings import OVERRIDE_DAG_IDS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Override:
    """One override the page may offer: the DAG to trigger and what the button says."""

    action: str
    dag_id: str
    label: str
    hint: str


OVERRIDES = (
    Override(
        "promote_anyway",
        OVERRIDE_DAG_IDS["promote_anyway"],
        "Promote anyway…",
        "release a version the gate did not pass (its corpora embedded, loaded and "
        "search-checked first); Params version, corpora and a reason",
    ),
    Override(
        "rollback",
        OVERRIDE_DAG_IDS["rollback"],
        "Roll back…",
        "make an earlier release that retention keeps live again, with its embeddings "
        "and index tables; Params release and a reason",
    ),
)


def permitted(user: Any) -> list[Override]:
    """The overrides ``user`` may trigger, asked of the api-server's auth manager (none
    without a user or outside an api-server)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )

    if user is None:
        return []
    try:
        manager = get_auth_manager()
    except RuntimeError as e:  # not inside an api-server: nobody may act from here
        log.warning("no override offered: %s", e)
        return []
    return [
        o
        for o in OVERRIDES
        if manager.is_authorized_dag(
            method="POST",
            access_entity=DagAccessEntity.RUN,
            details=DagDetails(id=o.dag_id),
            user=user,
        )
    ]
