"""Compute-hours and an estimated cost: of a training run (every train report has them),
and of every job execution (a cost record per execution, from its runner's clock).

``compute_hours`` = nodes x devices per node x wall hours; ``estimated_cost_usd`` =
nodes x wall hours x the instance's hourly price. Prices are on-demand, Linux,
us-east-1 list prices (USD per instance-hour) as published on
https://aws.amazon.com/ec2/pricing/on-demand/ before AWS's June 2025 cut of up to 45% on
P4/P5 on-demand prices, so treat the GPU rows as an upper bound; a run overrides or
extends the table with ``TrainConfig.instance_prices``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from embedfresh.core.exit_codes import BadInputError

PRICES_USD: dict[str, float] = {
    "trn1.32xlarge": 21.50,  # 16 Trainium chips (32 NeuronCores)
    "p4d.24xlarge": 32.7726,  # 8 x A100 40 GB
    "p5.48xlarge": 98.32,  # 8 x H100 80 GB
    "cpu": 0.4032,  # m7i.2xlarge (8 vCPU, 32 GiB): a general-purpose CPU worker
}

#: What a backend is billed as when the config names no instance type.
DEFAULT_INSTANCE: dict[str, str] = {
    "cpu": "cpu",
    "xla": "cpu",
    "cuda": "p4d.24xlarge",
    "neuron": "trn1.32xlarge",
}


def topology(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(nodes, devices per node)`` of this run from torchrun's environment
    (``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``); ``(1, 1)`` outside torchrun."""
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1") or 1)
    local = int(env.get("LOCAL_WORLD_SIZE", str(world)) or world)
    local = max(1, min(local, world))
    return max(1, world // local), local


def price_per_hour(instance_type: str, overrides: Mapping[str, float] | None = None) -> float:
    """USD per instance-hour of ``instance_type``.

    :raises BadInputError: the type is in neither the table nor the overrides.
    """
    prices = {**PRICES_USD, **(overrides or {})}
    if instance_type not in prices:
        raise BadInputError(
            f"no price for instance type {instance_type!r}: known {', '.join(sorted(prices))}"
            " (add it with --set instance_prices='{\"<type>\": <usd per hour>}')"
        )
    return float(prices[instance_type])


def run_cost(
    backend: str,
    wall_seconds: float,
    instance_type: str | None = None,
    overrides: Mapping[str, float] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The report's cost fields for a run of ``wall_seconds`` on ``backend``."""
    instance = instance_type or DEFAULT_INSTANCE.get(backend, "cpu")
    price = price_per_hour(instance, overrides)
    nodes, devices = topology(env)
    hours = wall_seconds / 3600.0
    return {
        "instance_type": instance,
        "price_per_hour_usd": price,
        "nodes": nodes,
        "devices_per_node": devices,
        "compute_hours": round(nodes * devices * hours, 6),
        "estimated_cost_usd": round(nodes * hours * price, 6),
    }


def cost_record(
    attempts: list[dict[str, Any]],
    *,
    instance_type: str,
    nodes: int = 1,
    **identity: Any,
) -> dict[str, Any]:
    """One execution's cost record: every attempt it took, priced as ``instance_type``.

    Each attempt has ``seconds`` (its wall time on the runner's own clock: the local
    process's, or AWS Batch's ``startedAt``/``stoppedAt``) and ``exit_code`` (``None``
    when it never exited, a lost host); a failed attempt costs as much as any.
    ``identity`` (runner, job, task, Batch job id...) is kept as given.

    :raises BadInputError: no price for ``instance_type``.
    """
    price = price_per_hour(instance_type)
    seconds = sum(float(a.get("seconds") or 0.0) for a in attempts)
    instance_hours = nodes * seconds / 3600.0
    return {
        **identity,
        "instance_type": instance_type,
        "price_per_hour_usd": price,
        "nodes": nodes,
        "attempts": attempts,
        "failed_attempts": sum(1 for a in attempts if a.get("exit_code") != 0),
        "seconds": round(seconds, 3),
        "instance_hours": round(instance_hours, 6),
        "estimated_cost_usd": round(instance_hours * price, 6),
    }


def run_cost_total(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run's executions cost together: jobs, attempts, failed attempts, seconds,
    instance-hours and dollars."""
    return {
        "executions": len(records),
        "attempts": sum(len(r.get("attempts") or []) for r in records),
        "failed_attempts": sum(int(r.get("failed_attempts") or 0) for r in records),
        "seconds": round(sum(float(r.get("seconds") or 0) for r in records), 3),
        "instance_hours": round(sum(float(r.get("instance_hours") or 0) for r in records), 6),
        "estimated_cost_usd": round(
            sum(float(r.get("estimated_cost_usd") or 0) for r in records), 6
        ),
    }


def read_run_costs(store: Any, model: str, run_id: str) -> list[dict[str, Any]]:
    """Every cost record of a run (``store``: an :class:`~embedfresh.core.storage.ArtifactStore`),
    by task then attempt id; ``[]`` when it has none."""
    from embedfresh.core import layout

    folder = layout.costs(model, run_id)
    records = []
    for task in sorted(store.listdir(folder)):
        for name in sorted(store.listdir(f"{folder}/{task}")):
            if name.endswith(".json"):
                records.append(store.read_json(f"{folder}/{task}/{name}"))
    return records
