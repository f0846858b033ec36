"""The README's demo, end to end through Airflow: two days of embedding_model_refresh under
``dag.test()`` (small sizes here), the second training from the model the first promoted,
and the summary."""

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

    # Day 2 either passed its gate and was promoted, or the run failed at the gate and
    # production stayed at day 1; the summary says which, with the gate's reason.
    gate2 = json.loads((runs / day2["run_id"] / "reports" / "gate.json").read_text())
    registry = json.loads((folder / "models" / "tiny" / "registry.json").read_text())
    expected = day2["run_id"] if gate2["verdict"] == "PASS" else day1["run_id"]
    assert registry["production"]["version"] == expected
    assert day2["state"] == ("success" if gate2["verdict"] == "PASS" else "failed")
    assert f"gate: {gate2['verdict']} vs {day1['run_id']} (production)" in proc.stdout
    assert f"production: tiny {expected}" in proc.stdout
    manifest = folder / "embeddings" / "tiny" / day1["run_id"] / "products" / "_MANIFEST.json"
    assert f"file://{manifest}" in proc.stdout
    assert "compute-hours" in proc.stdout
    # Every job execution of day 1 left a cost record on its runner's clock; the summary
    # adds them up (the demo's runner is local: one attempt each).
    day1_costs = sorted((runs / day1["run_id"] / "reports" / "cost").glob("*/*.json"))
    assert day1_costs, "day 1 left no cost record"
    n = len(day1_costs)
    assert f"cost: {n} job executions, {n} attempts (0 failed)" in proc.stdout
