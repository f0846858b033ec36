"""Freshness (embedfresh.core.freshness): production's age in days of data, and people
told when it is stale, naming the decisions that held it.

The store is built as the jobs leave it: the production release made by the registry's
compare-and-swap (tests/releasing.py), each run's train report with the data interval it
trained on, and the later runs' gate and search-check reports. The refresh's last task
(:class:`FreshnessOperator`) measures it, and its ``stale`` notifier e-mails a real SMTP
server on 127.0.0.1.
"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from embedfresh.core import layout, run_index
from embedfresh.core.freshness import STALE_ENV, freshness, stale_after_days
from embedfresh.core.storage import ArtifactStore
from embedfresh.operators import notify
from embedfresh.operators.freshness import FreshnessOperator
from tests.mailbox import Mailbox
from tests.releasing import bare_release

MODEL = "tiny"


def _trained(store: ArtifactStore, run_id: str, day: str) -> None:
    start = dt.date.fromisoformat(day)
    store.write_json(
        layout.report(MODEL, run_id, "train"),
        {"data_interval": [day, (start + dt.timedelta(days=1)).isoformat()]},
    )


def _declined(store: ArtifactStore, run_id: str, day: str, verdict: str, check: str | None):
    _trained(store, run_id, day)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)  # after the release's move
    store.write_json(
        layout.report(MODEL, run_id, "gate"),
        {"verdict": verdict, "reason": f"{verdict} on ndcg_at_10 (run {run_id})",
         "n_queries": 16000, "created_at": later.isoformat(timespec="seconds")},
    )  # fmt: skip
    if check:
        store.write_json(
            layout.report(MODEL, run_id, "search-products"),
            {"verdict": check, "reason": f"search {check}"},
        )


@pytest.fixture
def store(tmp_path) -> ArtifactStore:
    """Production trained through 2026-01-02 (released by run d1); then three days that
    did not release: d2 gate INCONCLUSIVE, d3 gate PASS but search check FAIL, d4 gate
    FAIL."""
    from embedfresh.ml.checkpoint import cpu_state_dict
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec

    store = ArtifactStore(f"file://{tmp_path}")
    spec = get_spec(MODEL)
    versions.publish(store, spec, "d1", cpu_state_dict(versions.build_model(spec, 0)), {})
    _trained(store, "d1", "2026-01-01")
    bare_release(store, MODEL, "d1", run_id="d1")
    _declined(store, "d2", "2026-01-02", "INCONCLUSIVE", None)
    _declined(store, "d3", "2026-01-03", "PASS", "FAIL")
    _declined(store, "d4", "2026-01-04", "FAIL", None)
    run_index.record(store, MODEL, "d4")  # runs/tiny/_index.json beside the runs
    return store


def test_age_counts_the_days_of_data_production_lacks(store: ArtifactStore) -> None:
    fresh = freshness(store, MODEL, "d1", stale_after=3)
    assert fresh["age_days"] == 0 and not fresh["stale"] and fresh["held_by"] == []
    late = freshness(store, MODEL, "d4", stale_after=3)
    assert late["trained_through"] == "2026-01-02" and late["newest_data"] == "2026-01-05"
    assert late["age_days"] == 3 and late["stale"]
    assert [(r["run_id"], r["gate"]) for r in late["held_by"]] == [
        ("d2", "INCONCLUSIVE"), ("d3", "PASS"), ("d4", "FAIL"),
    ]  # fmt: skip
    assert late["held_by"][1]["search_checks"] == {"products": ["FAIL", "search FAIL"]}
    assert not freshness(store, MODEL, "d3", stale_after=3)["stale"]  # 2 days: not yet


def test_the_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STALE_ENV, raising=False)
    assert stale_after_days() == 3
    monkeypatch.setenv(STALE_ENV, "0")
    with pytest.raises(ValueError, match=STALE_ENV):
        stale_after_days()


def test_a_stale_production_is_mailed_naming_what_held_it(
    store: ArtifactStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in notify.SETTINGS_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(STALE_ENV, raising=False)
    with Mailbox() as inbox:
        for name, value in inbox.env("freshness_smtp").items():
            monkeypatch.setenv(name, value)
        task = FreshnessOperator(task_id="freshness", artifact_root=store.root, model=MODEL)
        for run_id, mails in (("d3", 0), ("d4", 1)):  # 2 days late: quiet; 3: told
            facts = task.execute({"run_id": run_id})
            ti = SimpleNamespace(
                task_id="freshness", dag_id="embedding_model_refresh", run_id=run_id,
                map_index=-1, log_url="", xcom_pull=lambda task_ids=None, facts=facts, **_: facts,
            )  # fmt: skip
            context = {"ti": ti, "run_id": run_id, "params": {"model": MODEL}}
            for notifier in notify.notifiers("stale"):
                notifier(context)
            assert len(inbox.envelopes) == mails
        (message,) = inbox.messages()
    assert message["Subject"] == "[embedfresh] STALE: tiny production is 3 days old"
    body = message.get_body(preferencelist=("html",)).get_content()
    assert "trained on data through 2026-01-02, 3 days before the newest data (2026-01-05)" in body
    for line in (
        "run d2: gate INCONCLUSIVE on 16000 queries (INCONCLUSIVE on ndcg_at_10 (run d2))",
        "run d3: gate PASS on 16000 queries",
        "search check products: FAIL (search FAIL)",
        "run d4: gate FAIL on 16000 queries",
    ):
        assert line in body, body
