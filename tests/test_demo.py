"""The README's demo, end to end: data, two days of train -> evaluate -> gate -> promote.
The second day starts from the model the first promoted and is not worse."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, job_env

METRICS_HIGHER = ("accuracy", "auc", "recall_at_10")


def test_demo_runs_end_to_end_and_day_two_trains_incrementally(tmp_path: Path):
    folder = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "scripts/demo.py", "--root", str(folder)],
        cwd=ROOT,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "=== embedded demo: summary ===" in proc.stdout
    assert "registry:" in proc.stdout

    runs = folder / "runs" / "tiny"
    day1, day2 = "demo-2026-01-01", "demo-2026-01-02"
    train2 = json.loads((runs / day2 / "reports" / "train.json").read_text())
    assert train2["init"]["source"] == "production"
    assert train2["init"]["version"] == day1

    eval1 = json.loads((runs / day1 / "reports" / "eval.json").read_text())["metrics"]
    eval2 = json.loads((runs / day2 / "reports" / "eval.json").read_text())["metrics"]
    for name in METRICS_HIGHER:
        assert eval2[name] >= eval1[name], (name, eval1, eval2)
    assert eval2["log_loss"] <= eval1["log_loss"], (eval1, eval2)

    registry = json.loads((folder / "models" / "tiny" / "registry.json").read_text())
    gate2 = json.loads((runs / day2 / "reports" / "gate.json").read_text())
    expected = day2 if gate2["verdict"] == "PASS" else day1
    assert registry["production"]["version"] == expected
    assert [h["version"] for h in registry["history"]][0] == day1
