"""Figures the reliability suite measures while it proves its cases: per-kill resume
times and lost steps, per-run fault outcomes. Printed at the end of the session and,
when ``RELIABILITY_FIGURES`` names a file, written there as JSON (docs/RELIABILITY.md
and the benchmarks quote them)."""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

ROWS: dict[str, list[dict[str, Any]]] = {
    "kills": [],
    "faults": [],
    "fault_points": [],
    "sigterm": [],
}


def record(kind: str, **row: Any) -> None:
    ROWS[kind].append(row)


def summary_lines() -> list[str]:
    lines = []
    kills = ROWS["kills"]
    if kills:
        restart = [k["restart_to_first_step_s"] for k in kills]
        lost = [k["steps_lost"] for k in kills]
        lines.append(
            f"SIGKILLs: {len(kills)}; restart to first new step: median "
            f"{statistics.median(restart):.2f} s, max {max(restart):.2f} s; steps lost: "
            f"median {statistics.median(lost)}, max {max(lost)} "
            f"(checkpoint interval {kills[0]['checkpoint_every']})"
        )
    faults = ROWS["faults"]
    if faults:
        first = sum(1 for f in faults if f["first_attempt_exit"] == 0)
        done = sum(1 for f in faults if f["completed_correctly"])
        lines.append(
            f"S3 fault runs: {len(faults)} attempted, {done} completed correctly with "
            f"retries ({100 * done / len(faults):.1f}%), {first} on the first attempt; "
            f"faults injected: {sum(f['faults_injected'] for f in faults)}"
        )
        for f in faults:
            lines.append(f"  {json.dumps(f, sort_keys=True)}")
    for row in ROWS["sigterm"]:
        lines.append(
            f"SIGTERM ({row['workers']} worker(s)): stopped at step {row['stopped_at_step']}, "
            f"steps lost {row.get('steps_lost', '-')}, SIGTERM to exit "
            f"{row.get('sigterm_to_exit_s', '-')} s"
        )
    for row in ROWS["fault_points"]:
        # A sampled matrix (the S3 one) says of how many points, and its seed.
        sampled = f" killed of {row['of']} (sample seed {row['seed']})" if "seed" in row else ""
        lines.append(
            f"fault points of {row['job']}: {row['points']}{sampled}, "
            f"{row['points'] - row['failed']} recovered by a plain re-run ({row['seconds']} s)"
        )
    return lines


def write_json() -> None:
    path = os.environ.get("RELIABILITY_FIGURES")
    if path and any(ROWS.values()):
        with open(path, "w") as f:
            json.dump(ROWS, f, indent=2, sort_keys=True)
