"""A candidate that fails the quality gate is a decision, not an error, under the real
scheduler: the gate task succeeds on its first try with the decision (FAIL, each
metric's d and interval) as its XCom, ``gate_passed`` skips everything after it (the
candidate's embedding, index load, search check and release never run), the run ends
green, and the production pointer (registry.json) keeps its exact bytes.

The candidate is made worse the way it happens in production: a bad data partition.
Production is a model trained on day 1, then on day 2; day 2's partition then has every
label flipped, and the run fine-tunes production on it, which loses nDCG@10 over the
corpus on the judged queries: a FAIL, not INCONCLUSIVE. (From a production that saw
only day 1, the flipped day still taught the tiny model more than it unlearned: nDCG@10
+3.1% [+1.7%, +4.5%], a PASS; search is what the gate judges.)
"""

from __future__ import annotations

import json
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


def test_failed_gate_is_a_green_run_that_releases_nothing(refresh_dag: AirflowServer, root: str):
    server = refresh_dag
    store = ArtifactStore(root)
    # Production learned both days (day 2 from day 1's model), as the refresh would have.
    for run, day in (("production-day1", DAY1), ("production-run", DAY2)):
        trained = run_job(
            "train", f"artifact_root={root}", f"run_id={run}", f"data_interval_start={day}",
            "epochs=3",
        )  # fmt: skip
        assert trained.returncode == 0, trained.stderr[-3000:]
        bare_release(store, "tiny", run)
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
    assert run["state"] == "success", server.explain(REFRESH, run_id)

    assert states["train"] == states["evaluate"] == "success", server.explain(REFRESH, run_id)
    # The decision is the gate's XCom: what a notifier, a dashboard or another DAG reads.
    xcom = server.api(
        "GET", f"/dags/{REFRESH}/dagRuns/{run_id}/taskInstances/gate/xcomEntries/return_value"
    )
    decision = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    assert decision["verdict"] == "FAIL" and decision["mode"] == "no_regression", decision
    ndcg = next(m for m in decision["metrics"] if m["metric"] == "ndcg_at_10")
    assert ndcg["verdict"] == "FAIL" and ndcg["ci_low"] <= ndcg["d"] <= ndcg["ci_high"], ndcg
    assert ndcg["ci_high"] < -0.001, ndcg  # worse beyond the 0.1% SLA
    assert decision["reference"] == "production-run" and decision["candidate"] == run_id

    assert states["gate"] == states["gate_passed"] == "success", states
    after_gate = (
        "corpora", "list_shards", "embed", "verify", "load_index", "search_check", "release",
    )  # fmt: skip
    assert {states.get(t) for t in after_gate} == {"skipped"}, states
    (gate_ti,) = [ti for ti in tis if ti["task_id"] == "gate"]
    assert gate_ti["try_number"] == 1
    log = server.task_log(REFRESH, run_id, "gate_passed", 1)
    assert "gate FAIL for candidate bad-partition" in log, log
    # People were told: the deployment's e-mail, received by a real SMTP server, with
    # the decision, each metric's interval and the page's link.
    # (The session's mailbox holds other tests' mails: another run id may contain this one.)
    mails = [m for m in server.mailbox.messages() if f" {run_id} not released" in m["Subject"]]
    assert len(mails) == 1, [m["Subject"] for m in server.mailbox.messages()]
    body = mails[0].get_body().get_content()
    assert "FAIL" in mails[0]["Subject"], mails[0]["Subject"]
    interval = f"[{ndcg['ci_low'] * 100:+.3f}%, {ndcg['ci_high'] * 100:+.3f}%]"
    assert f"ndcg_at_10: FAIL, d {ndcg['d'] * 100:+.3f}%" in body and interval in body, body
    assert "/model-quality/?model=tiny" in body, body

    train = store.read_json(layout.report("tiny", run_id, "train"))
    assert train["data_interval"] == [str(DAY2), "2026-01-03"]
    gate = store.read_json(layout.report("tiny", run_id, "gate"))
    assert gate["verdict"] == "FAIL"
    assert gate["reference"]["version"] == "production-run"
    assert store.read_bytes(layout.registry("tiny")) == registry_before
    assert not store.exists(f"embeddings/tiny/{run_id}")
