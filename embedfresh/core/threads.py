"""How many CPU threads a job runs: the CPUs it is given, not the host's.

A job on a Celery worker beside another task, or in an AWS Batch container with a CPU
quota on a large host, is given fewer CPUs than ``os.cpu_count()`` reports. torch sizes
its intra-op (OpenMP) and inter-op pools from the host's cores; each surplus thread then
contends for a core another thread already holds, and OpenMP's spinning waits burn what
is left. Measured on a 2-core box under load 5: 60 training steps took 54.7-58.5 s with
torch's default threads against 12.4-12.7 s with one (docs/BENCHMARKS.md, "Threads").

:func:`thread_plan` says how many threads a job takes, and why, in this order:

1. ``OMP_NUM_THREADS`` when set: the operator's explicit choice (the bit-exact tests
   pin it); torch reads it itself.
2. ``EMBEDFRESH_THREADS`` when set: this project's setting, for a deployment that sizes
   its jobs itself.
3. The CPUs the job is given: its CPU affinity (``taskset``, cpuset cgroups, a Batch or
   Kubernetes CPU pinning), capped by its cgroup CPU quota rounded up (cgroup v2
   ``cpu.max``, v1 ``cpu.cfs_quota_us``).

The OpenMP wait policy is set passive (:data:`WAIT_POLICY`) before torch is imported by
any job process or the fork server (``embedfresh/jobs/__init__.py``): OpenMP reads it
once, when the runtime starts, so a per-job setting after the fork would be too late.

Torch-free: the numbers are applied by :func:`embedfresh.ml.threads.apply`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

THREADS_ENV = "EMBEDFRESH_THREADS"
WAIT_POLICY = ("OMP_WAIT_POLICY", "PASSIVE")
"""OpenMP threads that wait on a barrier sleep instead of spinning: a job that shares
its cores (another task, the prefetch thread, a tokenizer) does not lose them to
spinning siblings (docs/BENCHMARKS.md, "Threads")."""

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class ThreadPlan:
    """Threads for torch's intra-op and inter-op pools and where the number came from."""

    intra_op: int
    inter_op: int
    source: str
    """``OMP_NUM_THREADS``, ``EMBEDFRESH_THREADS`` or ``cpus given``."""
    affinity: int
    quota: float | None
    """The cgroup CPU quota in CPUs (None: no quota)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "intra_op": self.intra_op,
            "inter_op": self.inter_op,
            "source": self.source,
            "affinity_cpus": self.affinity,
            "cgroup_quota_cpus": self.quota,
        }


def affinity_cpus() -> int:
    """CPUs this process may run on (all of the host's where there is no affinity call)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def _own_cgroup(controller: str) -> Path | None:
    """This process's cgroup directory for ``controller`` (v1), or its unified one (v2:
    ``controller`` "")."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            mount = CGROUP_ROOT / controller if controller else CGROUP_ROOT
            # Inside a container the own path is often not mounted under its full name.
            for candidate in (mount / path.lstrip("/"), mount):
                if candidate.is_dir():
                    return candidate
    return None


def cgroup_quota_cpus() -> float | None:
    """The cgroup CPU quota in CPUs (``quota / period``), None when there is none."""
    v2 = _own_cgroup("")
    if v2 is not None and (v2 / "cpu.max").is_file():
        quota, _, period = (v2 / "cpu.max").read_text().strip().partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    v1 = _own_cgroup("cpu")
    if v1 is not None and (v1 / "cpu.cfs_quota_us").is_file():
        quota_us = int((v1 / "cpu.cfs_quota_us").read_text())
        period_us = int((v1 / "cpu.cfs_period_us").read_text())
        if quota_us > 0 and period_us > 0:
            return quota_us / period_us
    return None


def _positive(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name} must be a whole number of threads >= 1, got {raw!r}")
    return value


def thread_plan(environ: dict[str, str] | None = None) -> ThreadPlan:
    """How many threads a job takes (the module's three rules, in order).

    :raises ValueError: ``OMP_NUM_THREADS`` or ``EMBEDFRESH_THREADS`` is not a count.
    """
    env = os.environ if environ is None else environ
    affinity = affinity_cpus()
    quota = cgroup_quota_cpus()
    given = max(1, min(affinity, math.ceil(quota) if quota else affinity))
    if env.get("OMP_NUM_THREADS", "").strip():
        # OpenMP allows a list ("4,2") for nested levels: the first is the outer level.
        first = env["OMP_NUM_THREADS"].split(",")[0].strip()
        n, source = _positive("OMP_NUM_THREADS", first), "OMP_NUM_THREADS"
    elif env.get(THREADS_ENV, "").strip():
        n, source = _positive(THREADS_ENV, env[THREADS_ENV].strip()), THREADS_ENV
    else:
        n, source = given, "cpus given"
    return ThreadPlan(intra_op=n, inter_op=n, source=source, affinity=affinity, quota=quota)
