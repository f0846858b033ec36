"""Compute-hours and estimated cost in every train report (nodes x devices x wall time,
priced from the instance table or the run's overrides)."""

from __future__ import annotations

import json

import pytest

from embedfresh.core.cost import PRICES_USD, price_per_hour, run_cost, topology
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from tests.conftest import run_job


def test_topology_from_torchrun_environment() -> None:
    assert topology({}) == (1, 1)
    assert topology({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}) == (1, 2)
    assert topology({"WORLD_SIZE": "64", "LOCAL_WORLD_SIZE": "32"}) == (2, 32)


def test_cost_is_nodes_times_hours_times_price() -> None:
    env = {"WORLD_SIZE": "64", "LOCAL_WORLD_SIZE": "32"}  # 2 trn1.32xlarge, 32 cores each
    cost = run_cost("neuron", 1800.0, env=env)
    assert cost["instance_type"] == "trn1.32xlarge"
    assert cost["compute_hours"] == pytest.approx(2 * 32 * 0.5)
    assert cost["estimated_cost_usd"] == pytest.approx(2 * 0.5 * PRICES_USD["trn1.32xlarge"])
    assert run_cost("cuda", 3600.0, env={})["instance_type"] == "p4d.24xlarge"
    assert run_cost("cpu", 3600.0, "p5.48xlarge", {"p5.48xlarge": 55.0}, env={})[
        "estimated_cost_usd"
    ] == pytest.approx(55.0)


def test_unknown_instance_type_is_bad_input() -> None:
    with pytest.raises(BadInputError, match="no price for instance type 'x1.weird'"):
        price_per_hour("x1.weird")


def test_train_report_and_summary_carry_cost(root: str) -> None:
    done = run_job(
        "train",
        f"artifact_root={root}",
        "run_id=priced",
        "data_interval_start=2026-01-01",
        "max_steps=3",
        "instance_type=my.box",
        'instance_prices={"my.box": 3600.0}',
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    report = ArtifactStore(root).read_json("runs/tiny/priced/reports/train.json")
    assert report["instance_type"] == "my.box" and report["price_per_hour_usd"] == 3600.0
    assert (report["nodes"], report["devices_per_node"]) == (1, 1)
    # 3600 USD/hour is 1 USD/second: the cost is the wall time in seconds
    assert report["estimated_cost_usd"] == pytest.approx(report["wall_seconds"], rel=1e-3)
    # rounded to 6 decimals in the report (3.6 ms of compute): compare at that resolution
    assert report["compute_hours"] == pytest.approx(report["wall_seconds"] / 3600, abs=1e-6)
    assert summary["estimated_cost_usd"] == report["estimated_cost_usd"]
    assert summary["compute_hours"] == report["compute_hours"]


def test_unpriced_instance_fails_before_training(root: str) -> None:
    done = run_job(
        "train",
        f"artifact_root={root}",
        "run_id=unpriced",
        "data_interval_start=2026-01-01",
        "instance_type=x1.weird",
    )
    assert done.returncode == 2
    assert "no price for instance type 'x1.weird'" in done.stderr
    assert not ArtifactStore(root).exists("runs/tiny/unpriced")
