"""The README's demo, end to end through Airflow: three days of embedding_model_refresh
under ``dag.test()`` (small sizes here; ``make demo`` runs two, docs/GATE.md's week
eight), each day training from the production the previous ones left, and each day
decided: a release, or a FAIL that says why, never an INCONCLUSIVE; then the summary
with a query searched through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA, ROOT, job_env

pytestmark = pytest.mark.slow


def test_demo_runs_the_dag_day_after_day_and_every_day_decides(tmp_path: Path):
    folder, home = tmp_path / "demo", tmp_path / "airflow-home"
    sizes = {
        "--train-rows": DATA["train_rows"],
        "--eval-rows": DATA["eval_rows"],
        "--corpus-rows": DATA["corpus_rows"],
        "--corpus-shard-rows": DATA["corpus_shard_rows"],
        "--judged-queries": DATA["judged_queries"],
        "--days": 3,
        "--figures": tmp_path / "days.json",
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

    # Every day decides: released (gate and search check PASS), or a FAIL of one of them
    # with production staying where it was; never an INCONCLUSIVE (the looks grow the
    # evaluation until it decides). The summary says which, with the reason.
    days = json.loads((tmp_path / "days.json").read_text())
    print("\n".join(json.dumps(d) for d in days))
    assert [d["day"] for d in days] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    production = None
    for day in days:
        assert "INCONCLUSIVE" not in (day["gate"], day["search_check"]), day
        decided = [day["gate"]] + ([day["search_check"]] if day["search_check"] else [])
        assert day["released"] == (set(decided) == {"PASS"}), day
        assert day["state"] == ("failed" if day["search_check"] == "FAIL" else "success"), day
        if production is not None:
            assert f"gate: {day['gate']} vs {production} (production)" in proc.stdout
        production = day["run_id"] if day["released"] else production
    assert sum(d["released"] for d in days) >= 2, days  # day 1, and days that improve
    registry = json.loads((folder / "models" / "tiny" / "registry.json").read_text())
    assert registry["production"]["release"] == registry["production"]["version"] == production
    assert f"production: tiny {production}, release {production}" in proc.stdout
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
    assert "nDCG@10 through the index" in proc.stdout
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
