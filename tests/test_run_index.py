"""The run index (runs/{model}/_index.json): one read per page load whatever the number
of runs, repaired from the reports, never failing its job.

Runs are made from the real reports of tests/plugin_fixtures/store (gate.json written by
the gate job, health and compile reports in the jobs' shapes), each under its own run id,
and indexed by the real writer (:func:`embedfresh.core.run_index.update`, what the gate,
release and rollback jobs call). Store reads are counted on a real ArtifactStore over a
file:// root.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import logging
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from embedfresh.core import layout, markers, run_index
from embedfresh.core.exit_codes import ConflictError
from embedfresh.core.storage import ArtifactStore
from embedfresh.jobs import index_runs
from tests.releasing import bare_release
from tests.test_plugin_api import FIXTURE_STORE

MODEL = "tiny"
GATE = FIXTURE_STORE / "runs/tiny/manual__2026-01-02T00:00:00+00:00/reports/gate.json"
HEALTH = FIXTURE_STORE / "runs/tiny/health-a/reports/health.json"
COMPILE = FIXTURE_STORE / "runs/tiny/compile-1/reports/compile.json"
READS = ("read_bytes", "exists", "listdir", "etag", "size", "open_read", "get_file")


class CountingStore(ArtifactStore):
    """A real store that counts its read requests."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattribute__(self, name: str):
        if name in READS:
            object.__getattribute__(self, "calls")[name] += 1
        return object.__getattribute__(self, name)


def _day(i: int) -> str:
    return (dt.date(2026, 1, 1) + dt.timedelta(days=i)).isoformat()


def _run_id(i: int) -> str:
    return f"scheduled__{_day(i)}T00:00:00+00:00"


def add_run(root: Path, i: int) -> str:
    """One daily refresh run's reports: health, compile and the gate's decision."""
    run_id = _run_id(i)
    reports = root / "runs" / MODEL / run_id / "reports"
    reports.mkdir(parents=True)
    for src, kind in ((HEALTH, "health"), (COMPILE, "compile"), (GATE, "gate")):
        doc = json.loads(src.read_text())
        doc["created_at"] = f"{_day(i)}T01:00:00+00:00"
        if kind == "gate":
            doc["run_id"] = run_id
            doc["verdict"] = "FAIL" if i % 3 else "PASS"
        (reports / f"{kind}.json").write_text(json.dumps(doc))
    return run_id


@pytest.fixture
def root(tmp_path: Path) -> Path:
    dest = tmp_path / "store"
    (dest / "models" / MODEL).mkdir(parents=True)
    shutil.copy(FIXTURE_STORE / "models/tiny/registry.json", dest / "models/tiny/registry.json")
    return dest


def _client(store: ArtifactStore) -> TestClient:
    from embedfresh.plugins.model_quality import create_app
    from embedfresh.plugins.model_quality.app import _store, authorized_user

    app = create_app(store.root)
    app.dependency_overrides[authorized_user] = lambda: None
    app.dependency_overrides[_store] = lambda: store
    return TestClient(app, raise_server_exceptions=False)


def _reads_per_page(root: Path) -> int:
    store = CountingStore(f"file://{root}")
    r = _client(store).get(f"/?model={MODEL}")
    assert r.status_code == 200, r.text
    return sum(store.calls.values())


def test_page_reads_stay_constant_from_10_to_365_runs(root: Path):
    store = ArtifactStore(f"file://{root}")
    for i in range(10):
        add_run(root, i)
    run_index.update(store, MODEL, [_run_id(9)])
    at_10 = _reads_per_page(root)
    for i in range(10, 365):
        add_run(root, i)
    run_index.update(store, MODEL, [_run_id(364)])  # the newest run's gate; repairs the rest
    at_365 = _reads_per_page(root)
    assert at_365 == at_10, (at_10, at_365)
    # Without the index, the page reads every run's reports: the count does grow.
    (root / "runs" / MODEL / "_index.json").unlink()
    assert _reads_per_page(root) > at_10 + 3 * 355


def test_sections_from_the_index_equal_the_sections_from_the_reports(root: Path):
    from embedfresh.plugins.model_quality import reports

    store = ArtifactStore(f"file://{root}")
    for i in range(12):
        add_run(root, i)
    without = {k: s.as_dict() for k, s in reports.overview(store, MODEL).items()}
    assert reports.runs_of(store, MODEL).source == "reports"
    run_index.update(store, MODEL)
    assert reports.runs_of(store, MODEL).source == "index"
    with_index = {k: s.as_dict() for k, s in reports.overview(store, MODEL).items()}
    assert with_index == without
    assert len(with_index["decisions"]["data"]) == 12
    assert with_index["decisions"]["data"][0]["run_id"] == _run_id(11)  # newest first


def test_a_run_missing_or_lagging_is_repaired_by_the_next_write(root: Path):
    store = ArtifactStore(f"file://{root}")
    first, second = add_run(root, 0), add_run(root, 1)
    # A run whose job died between its reports and the index: no entry. Another whose
    # entry was taken before its gate reported (only its evaluation then).
    lagging = _run_id(2)
    reports = root / "runs" / MODEL / lagging / "reports"
    reports.mkdir(parents=True)
    (reports / "eval.json").write_text("{}")
    run_index.update(store, MODEL, [first])
    index = run_index.read(store, MODEL)
    assert index["runs"][lagging]["gate"] is None
    (root / "runs" / MODEL / second).rename(root / "runs" / MODEL / "moved")
    run_index.update(store, MODEL, [first])
    (root / "runs" / MODEL / "moved").rename(root / "runs" / MODEL / second)
    assert second not in run_index.read(store, MODEL)["runs"]
    shutil.copy(GATE, reports / "gate.json")  # the gate reported, then was killed

    done = run_index.update(store, MODEL, [first])  # someone else's next write
    runs = run_index.read(store, MODEL)["runs"]
    assert done["reindexed"] == 3 and done["written"]  # its own run, and the two repaired
    assert runs[second]["gate"]["verdict"] == "FAIL"
    assert runs[lagging]["gate"]["verdict"] == json.loads(GATE.read_text())["verdict"]
    # An index that is up to date is not written again.
    assert run_index.update(store, MODEL, [])["written"] is False


#: What registry entries written before releases lack.
RELEASE_KEYS = ("release", "release_url", "corpora", "previous_release", "action")


def test_promotions_come_from_the_registry(root: Path):
    """Moves from a registry written before releases (bare version pointers) and from
    the release that moves on from it are indexed alike, by the run that made them."""
    store = ArtifactStore(f"file://{root}")
    path = root / "models/tiny/registry.json"
    registry = json.loads(path.read_text())
    for entry in [registry["production"], *registry["history"]]:
        for key in RELEASE_KEYS:
            entry.pop(key, None)
    path.write_text(json.dumps(registry))
    promoted = [h["run_id"] for h in registry["history"] if h.get("run_id")]
    assert promoted
    before = registry["production"]["version"]
    markers.publish(store, layout.model_version(MODEL, "v2"), {"weights.bin": b"v2" * 100}, meta={})
    bare_release(store, MODEL, "v2", "next-run", expected_version=before)
    for run_id in [*promoted, "next-run"]:
        (root / "runs" / MODEL / run_id / "reports").mkdir(parents=True)
    run_index.update(store, MODEL)
    runs = run_index.read(store, MODEL)["runs"]
    for run_id in promoted:
        moves = runs[run_id]["promotions"]
        assert moves and moves[0]["action"] == "promote" and moves[0]["version"]
    (move,) = runs["next-run"]["promotions"]
    assert move["action"] == "promote" and move["version"] == "v2"
    assert move["previous"] == before and move["verdict"] == "PASS"


def test_a_lost_swap_is_retried_and_keeps_the_other_writers_entry(root: Path, monkeypatch):
    store = ArtifactStore(f"file://{root}")
    mine = add_run(root, 0)
    real = ArtifactStore.write_if_match
    calls = []

    def other_writer_first(self, rel, data, etag):
        calls.append(rel)
        if len(calls) == 1:  # another job's update lands between our read and our write
            theirs = add_run(root, 1)
            monkeypatch.setattr(ArtifactStore, "write_if_match", real)
            run_index.update(ArtifactStore(self.root), MODEL, [theirs])
            monkeypatch.setattr(ArtifactStore, "write_if_match", other_writer_first)
        return real(self, rel, data, etag)

    monkeypatch.setattr(ArtifactStore, "write_if_match", other_writer_first)
    run_index.update(store, MODEL, [mine])
    # Our swap lost; the retry found the other writer's index already holding our run
    # (its update repaired it) and had nothing left to write.
    assert set(run_index.read(store, MODEL)["runs"]) == {mine, _run_id(1)}
    assert calls == ["runs/tiny/_index.json"]


def test_an_index_write_that_fails_never_fails_the_job(root: Path, monkeypatch, caplog):
    store = ArtifactStore(f"file://{root}")
    run_id = add_run(root, 0)

    def refused(self, rel, data, etag):
        raise ConflictError(f"{rel} changed")

    monkeypatch.setattr(ArtifactStore, "write_if_match", refused)
    with caplog.at_level(logging.WARNING, logger="embedfresh.core.run_index"):
        run_index.record(store, MODEL, run_id)  # no exception
    assert "python -m embedfresh.jobs.index_runs --root" in caplog.text
    assert run_index.read(store, MODEL) is None


def test_a_corrupted_index_is_named_and_the_reports_are_read(root: Path):
    from embedfresh.plugins.model_quality import reports

    store = ArtifactStore(f"file://{root}")
    add_run(root, 0)
    (root / "runs" / MODEL / "_index.json").write_text("{not json")
    section = reports.decisions(store, MODEL)
    assert section.available and "_index.json is not valid JSON" in section.problems[0]
    run_index.update(store, MODEL)  # the next write replaces it
    assert reports.runs_of(store, MODEL).source == "index"


def test_rebuild_command(root: Path, capsys):
    for i in range(3):
        add_run(root, i)
    assert index_runs.main(["--root", f"file://{root}", "--model", MODEL]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["runs"] == 3 and summary["written"]
    assert index_runs.main(["--root", f"file://{root}", "--model", "tiny\n"]) == 2
    assert "invalid model name" in capsys.readouterr().err
    assert layout.run_index(MODEL) == "runs/tiny/_index.json"
