"""Size torch's thread pools for this job, once a process, from
:func:`embedfresh.core.threads.thread_plan` (the CPUs the job is given, or the setting
that overrides it). :func:`embedfresh.ml.backends.get_backend` calls :func:`apply`: every
job that runs torch builds a backend before its first op."""

from __future__ import annotations

import functools
import logging

import torch

from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.threads import ThreadPlan, thread_plan

log = logging.getLogger("embedfresh.threads")


@functools.cache
def apply() -> ThreadPlan:
    """Set torch's intra-op and inter-op threads (torch read ``OMP_NUM_THREADS`` itself
    when it is set); log the choice. The inter-op pool can be sized only before its first
    use: if something in the process used it already, it stays as it is.

    :raises BadInputError: ``OMP_NUM_THREADS`` or ``EMBEDFRESH_THREADS`` is not a count.
    """
    try:
        plan = thread_plan()
    except ValueError as e:
        raise BadInputError(str(e)) from None
    if torch.get_num_threads() != plan.intra_op:
        torch.set_num_threads(plan.intra_op)
    try:
        if torch.get_num_interop_threads() != plan.inter_op:
            torch.set_num_interop_threads(plan.inter_op)
    except RuntimeError:  # the pool started already (a test process, an earlier job)
        pass
    log.info(
        "threads: %d intra-op, %d inter-op (%s; %d CPUs in affinity, cgroup quota %s)",
        torch.get_num_threads(),
        torch.get_num_interop_threads(),
        plan.source,
        plan.affinity,
        "none" if plan.quota is None else f"{plan.quota:g} CPUs",
    )
    return plan
