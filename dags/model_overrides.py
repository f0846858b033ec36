"""Two human overrides of the production pointer, each a run of a small DAG.

- ``embedfresh_promote_anyway``: make ``version`` production although no quality gate
  passed it, with a required ``reason`` (the one exception to "only PASS promotes"). The
  version must still be committed and intact: a damaged one is refused.
- ``embedfresh_rollback``: move production back to ``version``, an earlier production
  version, with a required ``reason``.

They are DAGs, not buttons that write, so Airflow's own machinery applies: only users who
may trigger the DAG can act (a viewer's trigger is refused by the api-server), every run
is in the DAG's run history and in Airflow's audit log, and the job runs with the
worker's store credentials, never the browser's. The registry's history records the
user who triggered the run (``who``), the time and the ``reason`` (``why``). The "Model
quality" page links to their Trigger forms for users who may trigger them.

Neither is scheduled; a failure (a version that is not there, never was production, or
is damaged) fails at once with the reason in the task log, and production stays.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param

from embedfresh.operators import PromoteAnywayOperator, RollbackOperator
from embedfresh.operators.params import artifact_root_param, model_param

MOVE_ARGS = {
    "artifact_root": "{{ params.artifact_root }}",
    "model": "{{ params.model }}",
    "version": "{{ params.version }}",
    "reason": "{{ params.reason }}",
}
#: A transient store error retries once; a refusal (exit 2) fails at once, production stays.
RETRIES = {"retries": 1, "retry_delay": dt.timedelta(seconds=10)}


def _params(version_description: str) -> dict[str, Param]:
    return {
        "artifact_root": artifact_root_param(),
        "model": model_param(),
        "version": Param(
            type="string",
            pattern=r"^[A-Za-z0-9._:+=-]{1,200}$",
            description=version_description,
        ),
        "reason": Param(
            type="string",
            minLength=1,
            description="Why (required): recorded in the registry's history with your user name",
        ),
    }


with DAG(
    "embedfresh_promote_anyway",
    description="Promote a version the quality gate did not pass (a person's override, "
    "with a reason)",
    doc_md=__doc__,
    schedule=None,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    params=_params("The version to make production (models/<model>/versions/<version>)"),
    tags=["embedfresh", "override"],
):
    PromoteAnywayOperator(task_id="move", **MOVE_ARGS, **RETRIES)

with DAG(
    "embedfresh_rollback",
    description="Roll production back to an earlier production version (with a reason)",
    doc_md=__doc__,
    schedule=None,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    params=_params(
        "The earlier production version to go back to (listed in the registry's history)"
    ),
    tags=["embedfresh", "override"],
):
    RollbackOperator(task_id="move", **MOVE_ARGS, **RETRIES)
