"""A candidate that fails the quality gate stops ``embedding_model_refresh`` at the gate,
under the real scheduler: the gate task fails on its first try with no retry, the
candidate's embedding, index load, search check and release never run, and the
production pointer (registry.json) keeps its exact bytes.

The candidate is made worse the way it happens in production: a bad data partition.
Production is a model trained on day 1; the run's partition (day 2) has every label
flipped, so fine-tuning on it wrecks accuracy on the fixed held-out set (measured: about
-45% accuracy, -11% AUC relative to production: a FAIL, not INCONCLUSIVE).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from embedfresh.core import layout
from embedfresh.core.storage import ArtifactStore
from tests.airflow.server import REFRESH, AirflowServer, task_states
from tests.conftest import DAY1, DAY2, run_job
from tests.releasing import bare_release

pytestmark = pytest.mark.slow


def flip_labels(store: ArtifactStore, day) -> None:
    """Turn every positive of the day's training partition into a negative and back."""
    path = Path(
        store.url(layout.dataset_partition("products", "train", day)).removeprefix("file://")
    )
    (part,) = path.glob("*.parquet")
    table = pq.read_table(part)
    i = table.schema.get_field_index("label")
    flipped = pc.subtract(pa.scalar(1, pa.int8()), table.column("label"))
    pq.write_table(table.set_column(i, table.schema.field(i), flipped.cast(pa.int8())), part)


def test_failed_gate_stops_the_run_and_leaves_production_untouched(
    refresh_dag: AirflowServer, root: str
):
    server = refresh_dag
    store = ArtifactStore(root)
    trained = run_job(
        "train",
        f"artifact_root={root}",
        "run_id=production-run",
        f"data_interval_start={DAY1}",
        "epochs=3",
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    bare_release(store, "tiny", "production-run")
    registry_before = store.read_bytes(layout.registry("tiny"))
    flip_labels(store, DAY2)

    run_id = "bad-partition"
    # A manual run trains on its conf's day: 2026-01-02, the flipped partition.
    server.trigger(
        REFRESH, run_id, "2026-01-03T00:00:00Z", {"artifact_root": root, "day": str(DAY2)}
    )
    run = server.wait_for_run(REFRESH, run_id)
    tis = server.task_instances(REFRESH, run_id)
    states = task_states(tis)
    assert run["state"] == "failed", server.explain(REFRESH, run_id)

    assert states["train"] == states["evaluate"] == "success", server.explain(REFRESH, run_id)
    assert states["gate"] == "failed", states
    after_gate = (
        "corpora", "list_shards", "embed", "verify", "load_index", "search_check", "release",
    )  # fmt: skip
    assert {states[t] for t in after_gate} == {"upstream_failed"}, states
    (gate_ti,) = [ti for ti in tis if ti["task_id"] == "gate"]
    assert gate_ti["try_number"] == 1
    tries = server.api("GET", f"/dags/{REFRESH}/dagRuns/{run_id}/taskInstances/gate/tries")
    assert [t["try_number"] for t in tries["task_instances"]] == [1]
    # The gate job exited 3 and the operator failed the task for good (no retry).
    log = server.task_log(REFRESH, run_id, "gate", 1)
    refused = "embedfresh.jobs.gate failed with exit code 3 (quality gate refused the model), not retrying"
    assert f"AirflowFailException: {refused}" in log, log

    train = store.read_json(layout.report("tiny", run_id, "train"))
    assert train["data_interval"] == [str(DAY2), "2026-01-03"]
    gate = store.read_json(layout.report("tiny", run_id, "gate"))
    assert gate["verdict"] == "FAIL"
    assert gate["reference"]["version"] == "production-run"
    assert store.read_bytes(layout.registry("tiny")) == registry_before
    assert not store.exists(f"embeddings/tiny/{run_id}")
