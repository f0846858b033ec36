"""The README's demo, end to end through Airflow: two days of embedding_model_refresh under
``dag.test()`` (small sizes here), the second training from the model the first released,
each day ending with a release in the embedded vector index, and the summary with a
query searched through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA, ROOT, job_env

pytestmark = pytest.mark.slow


def test_demo_runs_the_dag_for_two_days_and_day_two_trains_incrementally(tmp_path: Path):
    folder, home = tmp_path / "demo", tmp_path / "airflow-home"
    sizes = {
        "--train-rows": DATA["train_rows"],
        "--eval-rows": DATA["eval_rows"],
        "--corpus-rows": DATA["corpus_rows"],
        "--corpus-shard-rows": DATA["corpus_shard_rows"],
    }
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/demo.py",
            "--root",
            str(folder),
            "--airflow-home",
            str(home),
            *(str(x) for kv in sizes.items() for x in kv),
        ],
        cwd=ROOT,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = proc.stdout[-4000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, output
    assert "=== embedded demo: summary ===" in proc.stdout

    day1, day2 = (
        json.loads((home / "demo-logs" / f"2026-01-0{d}.json").read_text()) for d in (1, 2)
    )
    assert day1["state"] == "success", output
    runs = folder / "runs" / "tiny"
    # Each run is given its day (a manual run never trains on its data interval): day 1
    # trains on dt=2026-01-01 although the store already holds dt=2026-01-02.
    train1 = json.loads((runs / day1["run_id"] / "reports" / "train.json").read_text())
    assert train1["data_interval"] == ["2026-01-01", "2026-01-02"]
    train2 = json.loads((runs / day2["run_id"] / "reports" / "train.json").read_text())
    assert train2["init"]["source"] == "production"
    assert train2["init"]["version"] == day1["run_id"]
    assert train2["data_interval"] == ["2026-01-02", "2026-01-03"]

    # Day 2 either passed its gate and search check and was released, or it was not and
    # the live release stayed day 1's; the summary says which, with the reason.
    gate2 = json.loads((runs / day2["run_id"] / "reports" / "gate.json").read_text())
    registry = json.loads((folder / "models" / "tiny" / "registry.json").read_text())
    released2 = (folder / "models" / "tiny" / "releases" / f"{day2['run_id']}.json").exists()
    expected = day2["run_id"] if released2 else day1["run_id"]
    assert registry["production"]["release"] == registry["production"]["version"] == expected
    # A gate that did not PASS is a decision (the run is green, nothing released); a
    # search check that refused fails the run.
    declined = gate2["verdict"] != "PASS"
    assert day2["state"] == ("success" if released2 or declined else "failed")
    assert (gate2["verdict"] == "PASS") or not released2
    assert f"gate: {gate2['verdict']} vs {day1['run_id']} (production)" in proc.stdout
    assert f"production: tiny {expected}, release {expected}" in proc.stdout
    # Day 1's release: its products, loaded in the embedded index under the demo store,
    # its search check in the summary, and a query searched through the CLI at the end.
    release1 = json.loads(
        (folder / "models" / "tiny" / "releases" / f"{day1['run_id']}.json").read_text()
    )
    products = release1["corpora"]["products"]
    manifest = folder / "embeddings" / "tiny" / day1["run_id"] / "products" / "_MANIFEST.json"
    assert products["embeddings"]["manifest"] == f"file://{manifest}"
    assert products["index"]["location"] == f"embedded:{folder / '.index' / 'postgres'}"
    assert "search check: PASS: ANN recall@10" in proc.stdout
    assert f"products -> {products['index']['table']} ({DATA['corpus_rows']} rows)" in proc.stdout
    assert "$ python -m embedfresh.jobs.search" in proc.stdout
    assert "  1  " in proc.stdout.split("$ python -m embedfresh.jobs.search")[1]
    assert "compute-hours" in proc.stdout
    # Every job execution of day 1 left a cost record on its runner's clock; the summary
    # adds them up (the demo's runner is local: one attempt each).
    day1_costs = sorted((runs / day1["run_id"] / "reports" / "cost").glob("*/*.json"))
    assert day1_costs, "day 1 left no cost record"
    n = len(day1_costs)
    assert f"cost: {n} job executions, {n} attempts (0 failed)" in proc.stdout
