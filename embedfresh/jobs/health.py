"""The health job: ``python -m embedfresh.jobs.health [--config F] [--set key=value ...]``, alone
or under ``torchrun --nproc-per-node N -m embedfresh.jobs.health``.

The story: the Neuron tools first (on each node's local rank 0, before it touches a
NeuronCore; see docs/HEALTH.md for running them alone), then the backend's device, the tensor checks, the
collectives across ranks; rank 0 gathers every rank's results, writes
``reports/health.json`` and tells every rank the verdict. Any failed check ends every
rank with exit code 4 (:class:`~embedfresh.core.exit_codes.UnhealthyError`) after the report is
written; the error line names the failing checks.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from embedfresh.core import layout, run_index
from embedfresh.core.cli import main_for
from embedfresh.core.config import HealthConfig
from embedfresh.core.exit_codes import BadInputError, UnhealthyError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.backends import Backend, get_backend, resolve_name
from embedfresh.ml.health import collectives, neuron_tools, report, tensor_checks
from embedfresh.ml.health.collectives import DistContext

log = logging.getLogger("embedfresh.jobs.health")


def health(cfg: HealthConfig) -> dict[str, Any]:
    """Check devices, tensor arithmetic and collectives; write ``reports/health.json``."""
    started = time.perf_counter()
    store = ArtifactStore(cfg.artifact_root)
    report_rel = layout.report(cfg.model, cfg.run_id, "health")
    name = resolve_name(cfg.backend)
    env = collectives.launched_env()
    rank, local_rank = (env[0], env[2]) if env else (0, 0)

    tool_checks: list[report.Check] = []
    tool_output: dict[str, Any] = {}
    if local_rank == 0 and cfg.run_neuron_tools(name):
        tool_checks, tool_output = neuron_tools.run(cfg)

    backend = _backend(name, local_rank)
    if backend is None:  # the device the config names is not there: unhealthy, not bad input
        message = f"health check failed: device_count (no {name} device visible)"
        if rank == 0:  # the other ranks cannot reach rank 0 without a device group
            entry = _rank_entry(DistContext(), None, [_missing_device(name)], tool_checks)
            message = _failure_message(
                _finish(cfg, store, report_rel, name, 1, [entry], [], [], started)
            )
        raise UnhealthyError(message)

    ctx = collectives.init(backend, cfg.dist_timeout_s, one_rank_group=cfg.collectives)
    try:
        return _check_and_report(
            cfg, store, report_rel, backend, ctx, tool_checks, tool_output, started
        )
    finally:
        ctx.close()


def _check_and_report(
    cfg: HealthConfig,
    store: ArtifactStore,
    report_rel: str,
    backend: Backend,
    ctx: DistContext,
    tool_checks: list[report.Check],
    tool_output: dict[str, Any],
    started: float,
) -> dict[str, Any]:
    checks = [report.guarded("device_count", lambda: tensor_checks.check_devices(
        backend, cfg.expected_devices))]  # fmt: skip
    checks += tensor_checks.run_all(
        backend, cfg.tensor_size, cfg.rtol(backend.name), cfg.memory_bytes
    )
    records = []
    if cfg.collectives:
        records = collectives.run_all(
            cfg.collective_ops, cfg.collective_sizes, ctx, backend, cfg.collective_iters
        )
    entry = _rank_entry(ctx, backend, checks + [r["check"] for r in records], tool_checks)
    entry["neuron_tools"] = tool_output or None
    job_checks: list[report.Check] = []
    if not ctx.connected and ctx.group:
        problem = (
            f"torchrun started {ctx.world_size} ranks but the {backend.name} process group "
            f"holds {ctx.group_size}: the ranks cannot reach each other"
        )
        if ctx.rank != 0:
            raise UnhealthyError(f"health check failed: process_group ({problem})")
        job_checks.append(report.check("process_group", False, problem))
    try:
        gathered = ctx.gather({"entry": entry, "records": records})
    except Exception as e:  # noqa: BLE001 - a dead peer: report what this rank knows
        log.error("gathering the ranks' results failed: %s", e)
        gathered = [{"entry": entry, "records": records}] if ctx.rank == 0 else None
        job_checks.append(report.check("gather", False, f"rank {ctx.rank}: {e}"))
        if ctx.rank != 0:
            raise UnhealthyError(f"rank {ctx.rank} could not reach rank 0: {e}") from e

    result = None
    if ctx.rank == 0:
        missing = [r for r, g in enumerate(gathered) if g is None]
        if missing:
            job_checks.append(report.check("gather", False, f"no results from ranks {missing}"))
        gathered = [g for g in gathered if g is not None]
        entries = [g["entry"] for g in gathered]
        per_rank = [g["records"] for g in gathered]
        coll = []
        if records and len(per_rank) == ctx.world_size:
            coll = collectives.aggregate(
                per_rank, ctx.world_size, cfg.min_busbw_gbps, cfg.busbw_min_size_bytes
            )
        job_checks.insert(0, _world_size_check(ctx.world_size, cfg.expected_world_size))
        result = _finish(
            cfg, store, report_rel, backend.name, ctx.world_size, entries, coll, job_checks, started
        )
    try:
        result = ctx.broadcast(result)
    except Exception as e:  # noqa: BLE001
        if ctx.rank != 0:
            raise UnhealthyError(f"rank {ctx.rank} lost rank 0's verdict: {e}") from e
    if ctx.rank == 0:  # the web UI's index of runs; derived data, never fails the job
        run_index.record(store, cfg.model, cfg.run_id)
    if result["verdict"] != "PASS":
        raise UnhealthyError(_failure_message(result))
    return result


def _backend(name: str, local_rank: int) -> Backend | None:
    """The backend, or None when its device is missing on this host."""
    if name == "cuda":
        if not torch.cuda.is_available():
            return None
        torch.cuda.set_device(local_rank)
    try:
        return get_backend(name)
    except BadInputError:
        if name in ("xla", "neuron"):
            return None
        raise


def _missing_device(name: str) -> report.Check:
    return report.check(
        "device_count", False, f"backend {name!r} requested but no {name} device is visible",
        count=0,
    )  # fmt: skip


def _world_size_check(world_size: int, expected: int | None) -> report.Check:
    ok = expected is None or world_size == expected
    want = "any" if expected is None else str(expected)
    return report.check(
        "world_size", ok, f"{world_size} rank(s), expected {want}", world_size=world_size
    )


def _rank_entry(
    ctx: DistContext,
    backend: Backend | None,
    checks: list[report.Check],
    tool_checks: list[report.Check],
) -> dict[str, Any]:
    return {
        "rank": ctx.rank,
        "local_rank": ctx.local_rank,
        "host": ctx.host,
        "device": str(backend.device) if backend else None,
        "backend": backend.metadata() if backend else None,
        "passed": all(c["passed"] for c in checks + tool_checks),
        "checks": checks + tool_checks,
    }


def _finish(
    cfg: HealthConfig,
    store: ArtifactStore,
    report_rel: str,
    backend: str,
    world_size: int,
    entries: list[dict[str, Any]],
    coll: list[dict[str, Any]],
    job_checks: list[report.Check],
    started: float,
) -> dict[str, Any]:
    """Build and write the report (rank 0); returns the summary every rank gets. Its
    ``wall_seconds`` is the job's own clock, from its start to this write."""
    tools = [
        {"rank": e["rank"], "host": e["host"], **(e.pop("neuron_tools", None) or {})}
        for e in entries
        if any(c["name"].startswith(("neuron_ls", "nccom_test")) for c in e["checks"])
    ]
    full = report.build(
        backend=backend,
        world_size=world_size,
        ranks=entries,
        collectives=coll,
        job_checks=job_checks,
        neuron_tools=tools,
        settings=cfg.model_dump(mode="json", exclude={"artifact_root"}),
        extra={
            "model": cfg.model,
            "run_id": cfg.run_id,
            "tensor_rtol": cfg.rtol(backend),
            "collectives_trivial": world_size == 1,
            "bandwidth_unit": "GB/s = 1e9 bytes/s (nccom-test figures: GiB/s)",
            "wall_seconds": round(time.perf_counter() - started, 3),
        },
    )
    for e in entries:
        e.pop("neuron_tools", None)
    store.write_json(report_rel, full)
    url = store.url(report_rel)
    log.info("health %s (%d check(s) failed): %s", full["verdict"], len(full["failed"]), url)
    return report.summary(full, url)


def _failure_message(result: dict[str, Any]) -> str:
    failed = result["failed"]
    shown = ", ".join(failed[:6]) + (f" and {len(failed) - 6} more" if len(failed) > 6 else "")
    return f"health check failed: {shown}; report {result['report']}"


if __name__ == "__main__":
    main_for("health", HealthConfig, health)
