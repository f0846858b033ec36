"""The two human overrides as Airflow runs them: ``embedfresh_promote_anyway`` and
``embedfresh_rollback`` (dags/model_overrides.py) triggered through the REST API of the
real api-server + scheduler (server.py), as real users with roles.

An admin's "promote anyway" with a reason embeds, loads and checks the version's corpus
and releases it; the registry's history records the user who triggered it, the reason
and the time; the same override without a reason is refused by Airflow's Param
validation before any run exists; a viewer's trigger is refused by Airflow itself (403),
so the store is never touched; a rollback by the admin makes the earlier release live
again, recorded the same way. The index is the embedded server under the store.
"""

from __future__ import annotations

import json

import pytest

from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec
from tests.airflow.server import AirflowServer, task_states
from tests.releasing import bare_release

pytestmark = pytest.mark.slow

PROMOTE_ANYWAY = "embedfresh_promote_anyway"
ROLLBACK = "embedfresh_rollback"


@pytest.fixture(scope="module")
def overrides(airflow_server: AirflowServer) -> AirflowServer:
    """The server, once both override DAGs are parsed and unpaused."""
    for dag_id in (PROMOTE_ANYWAY, ROLLBACK):
        airflow_server.wait_for_dag(dag_id)
        assert airflow_server.unpause(dag_id)["is_paused"] is False
    return airflow_server


@pytest.fixture
def store(root: str) -> ArtifactStore:
    """The data set; tiny versions v1..v3 committed; v1 live as a bare release."""
    store = ArtifactStore(root)
    spec = get_spec("tiny")
    weights = cpu_state_dict(versions.build_model(spec, seed=0))
    for name in ("v1", "v2", "v3"):
        versions.publish(store, spec, name, weights, {})
    bare_release(store, "tiny", "v1")
    return store


def _history(store: ArtifactStore) -> list[dict]:
    return json.loads(store.read_bytes("models/tiny/registry.json"))["history"]


def test_admin_promotes_anyway_and_rolls_back_viewer_is_refused(overrides, store):
    server = overrides
    conf = {"artifact_root": store.root, "model": "tiny", "version": "v3"}
    reason = "the FAIL is an eval-set artefact (ticket 7)"

    # A viewer may look but not trigger: Airflow refuses, no run, nothing written.
    before = store.read_bytes("models/tiny/registry.json")
    body = {"logical_date": None, "conf": {**conf, "reason": reason}}
    refused = server.request("POST", f"/dags/{PROMOTE_ANYWAY}/dagRuns", user="viewer", json=body)
    assert refused.status_code == 403, refused.text
    # No reason: refused by the DAG's Params before a run exists.
    missing = server.request("POST", f"/dags/{PROMOTE_ANYWAY}/dagRuns", json={**body, "conf": conf})
    assert missing.status_code == 400 and "reason" in missing.text, missing.text
    assert server.api("GET", f"/dags/{PROMOTE_ANYWAY}/dagRuns")["total_entries"] == 0
    assert store.read_bytes("models/tiny/registry.json") == before

    # The admin, with a reason: v3 is embedded, loaded, checked and released, recorded
    # with who and why.
    run = server.api("POST", f"/dags/{PROMOTE_ANYWAY}/dagRuns", json=body)
    assert run["triggering_user_name"] == "admin"
    done = server.wait_for_run(PROMOTE_ANYWAY, run["dag_run_id"], timeout=400)
    assert done["state"] == "success", server.explain(PROMOTE_ANYWAY, run["dag_run_id"])
    entry = _history(store)[-1]
    assert entry["action"] == "promote_anyway" and entry["version"] == "v3"
    assert entry["release"] == run["dag_run_id"] and entry["corpora"] == ["products"]
    assert entry["who"] == "admin" and entry["why"] == reason and entry["previous"] == "v1"
    assert entry["run_id"] == run["dag_run_id"]
    xcom = server.api(
        "GET",
        f"/dags/{PROMOTE_ANYWAY}/dagRuns/{run['dag_run_id']}/taskInstances/release/"
        "xcomEntries/return_value",
    )
    summary = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    assert summary["production"] == "v3" and summary["verified"]["files"] == 3
    assert summary["corpora"]["products"]["rows"] == 600

    # Roll back to release v1 (what publishing v1 made live).
    body = {
        "logical_date": None,
        "conf": {
            "artifact_root": store.root, "model": "tiny", "release": "v1",
            "reason": "v3 hurts long queries",
        },
    }  # fmt: skip
    run = server.api("POST", f"/dags/{ROLLBACK}/dagRuns", json=body)
    done = server.wait_for_run(ROLLBACK, run["dag_run_id"], timeout=240)
    states = task_states(server.task_instances(ROLLBACK, run["dag_run_id"]))
    assert done["state"] == "success" and states == {"move": "success"}, server.explain(
        ROLLBACK, run["dag_run_id"]
    )
    entry = _history(store)[-1]
    assert entry["action"] == "rollback" and entry["version"] == "v1" and entry["release"] == "v1"
    assert entry["who"] == "admin" and entry["why"] == "v3 hurts long queries"
    assert Registry(store, "tiny").production_version() == "v1"
