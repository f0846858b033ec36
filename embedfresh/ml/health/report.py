"""The health report: one record per check, per rank and host, and one verdict.

``runs/{model}/{run_id}/reports/health.json`` (written by rank 0)::

    {"verdict": "PASS" | "FAIL", "backend", "world_size", "created_at" (ISO UTC),
     "ranks": [{"rank", "host", "device", "checks": [{"name", "passed", "detail", ...}]}],
     "collectives": [{"op", "size_bytes", "algbw_gbps", "busbw_gbps", "passed", ...}],
     "neuron_tools": [{"rank", "host", "neuron_ls", "nccom_test"}], "failed": [names]}

A check is a plain dict so that figures ride along with it (``rel_err``,
``tolerance``, ``seconds``...). ``failed`` names each failing check once, prefixed by
its rank when it is a per-rank check (``rank1/tensor.matmul``).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

log = logging.getLogger("embedfresh.jobs.health")

Check = dict[str, Any]


def check(name: str, passed: bool, detail: str, **figures: Any) -> Check:
    """One check's record: name, verdict, a sentence a person can act on, figures."""
    return {"name": name, "passed": bool(passed), "detail": detail, **figures}


def guarded(name: str, fn: Callable[[], Check]) -> Check:
    """Run one check; an exception (a device error, a timed-out link) fails the check
    instead of ending the job, so the report still names every other result."""
    started = time.perf_counter()
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 - a faulty device may raise anything
        log.warning("check %s raised: %s", name, traceback.format_exc(limit=3))
        result = check(name, False, f"raised {type(e).__name__}: {e}")
    result.setdefault("seconds", round(time.perf_counter() - started, 6))
    status = "ok" if result["passed"] else "FAILED"
    log.info("check %s %s: %s", name, status, result["detail"])
    return result


def failed_names(ranks: list[dict[str, Any]], *sections: list[Check]) -> list[str]:
    """Every failing check, per-rank ones as ``rank{r}/{name}``, in report order."""
    names = [f"rank{r['rank']}/{c['name']}" for r in ranks for c in r["checks"] if not c["passed"]]
    names += [c["name"] for section in sections for c in section if not c["passed"]]
    return names


def build(
    *,
    backend: str,
    world_size: int,
    ranks: list[dict[str, Any]],
    collectives: list[dict[str, Any]],
    job_checks: list[Check],
    neuron_tools: list[dict[str, Any]],
    settings: dict[str, Any],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The whole report; the verdict is PASS only when no check anywhere failed."""
    failed = failed_names(ranks, job_checks, collectives)
    return {
        "verdict": "FAIL" if failed else "PASS",
        "failed": failed,
        "backend": backend,
        "world_size": world_size,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "hosts": sorted({r["host"] for r in ranks}),
        "ranks": ranks,
        "checks": job_checks,
        "collectives": collectives,
        "neuron_tools": neuron_tools,
        "settings": settings,
        **extra,
    }


def summary(report: dict[str, Any], url: str) -> dict[str, Any]:
    """The small JSON line printed on stdout: verdict, failures, where the report is,
    and the bus bandwidth of each op at its largest size."""
    largest: dict[str, dict[str, Any]] = {}
    for c in report["collectives"]:
        if c["size_bytes"] >= largest.get(c["op"], {}).get("size_bytes", -1):
            largest[c["op"]] = c
    return {
        "status": "ok" if report["verdict"] == "PASS" else "unhealthy",
        "verdict": report["verdict"],
        "failed": report["failed"],
        "report": url,
        "backend": report["backend"],
        "world_size": report["world_size"],
        "busbw_gbps": {op: c["busbw_gbps"] for op, c in sorted(largest.items())},
    }
