"""SIGTERM during training: stop at the step boundary, checkpoint that step, exit 75.

AWS Batch (a job terminated, timed out or its Spot host reclaimed), ECS and Airflow's
``on_kill`` (the local runner) all stop a job the same way: SIGTERM, a grace period,
then SIGKILL. While :class:`Preemption` is installed (:class:`~embedfresh.ml.training.loop.Trainer`
installs it for its loop), SIGTERM does not end the process: the handler only notes
when it came. At the end of the step in progress the loop asks :meth:`Preemption.decide`;
every rank stops at that same step, a normal committed checkpoint of it is written (the
checkpoint manager's own path: weights, optimizer, schedule, every rank's RNG state)
when the grace period leaves room for one, and the job exits 75 (``TransientError``) so
the orchestrator's retry resumes from that very step.

The grace period is ``EMBEDFRESH_SIGTERM_GRACE_S`` seconds (default 30: AWS Batch and
ECS send SIGKILL 30 s after SIGTERM). The checkpoint is written when the seconds
already spent since the SIGTERM plus twice the slowest checkpoint write of this attempt
fit in it (no write measured yet: it is tried); otherwise the job exits 75 at once and
the retry resumes from the last interval checkpoint. A write cut short by SIGKILL
leaves a folder without its ``COMMIT`` marker, which loading ignores.

A second SIGTERM (the local runner signals the whole process tree, and torchrun
forwards its own, so a worker often gets two) is counted and otherwise ignored: the
stop is already under way, and SIGKILL remains the hard stop. SIGINT is left alone.

Data parallel: the decision is taken on what every rank saw, gathered at each step
boundary (:meth:`Backend.gather`, one small collective a step on gloo/nccl), so a
SIGTERM that reached one rank stops them all at the same step. A backend whose
``gather`` cannot see the other ranks (torch-xla data parallel) gets no handler: there
SIGTERM ends the process as before and the retry resumes from the last interval
checkpoint.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

from embedfresh.core.exit_codes import BadInputError

#: Seconds between SIGTERM and SIGKILL the job can count on.
GRACE_ENV = "EMBEDFRESH_SIGTERM_GRACE_S"
#: AWS Batch and ECS (``stopTimeout``'s default): SIGKILL 30 s after SIGTERM.
DEFAULT_GRACE_S = 30.0
#: A checkpoint is written when the time spent since SIGTERM plus this many times the
#: slowest checkpoint write of the attempt fits in the grace period.
WRITE_SAFETY = 2.0


def grace_seconds(env: Mapping[str, str] | None = None) -> float:
    """The grace period (``EMBEDFRESH_SIGTERM_GRACE_S``, default :data:`DEFAULT_GRACE_S`).

    :raises BadInputError: not a finite number >= 0.
    """
    raw = (os.environ if env is None else env).get(GRACE_ENV, "").strip()
    if not raw:
        return DEFAULT_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise BadInputError(f"{GRACE_ENV} must be a number of seconds >= 0, not {raw!r}")
    return value


@dataclass(frozen=True)
class Stop:
    """Every rank's decision at a step boundary after a SIGTERM.

    :param waited: seconds since the earliest SIGTERM any rank noted (the longest wait).
    :param slowest_write: the slowest checkpoint write of this attempt (0: none yet).
    :param grace: the grace period (rank 0's setting).
    :param signals: SIGTERMs received, over all ranks.
    """

    waited: float
    slowest_write: float
    grace: float
    signals: int

    @property
    def checkpoint(self) -> bool:
        """Whether the grace period leaves room for a checkpoint of this step."""
        return self.waited + WRITE_SAFETY * self.slowest_write <= self.grace


class Preemption:
    """Catches SIGTERM while installed (a context manager) and decides, at each step
    boundary, whether training stops there.

    :param grace: the grace period in seconds (:func:`grace_seconds`).
    :param clock: monotonic seconds (a parameter for tests).
    """

    def __init__(self, grace: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace = grace
        self.clock = clock
        self.received_at: float | None = None
        self.signals = 0
        self.slowest_write = 0.0
        self.installed = False
        self._previous: Any = None

    def install(self) -> bool:
        """Take over SIGTERM (main thread only: Python delivers signals there); False
        when it cannot, and then SIGTERM keeps its previous disposition."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self.installed = True
        return True

    def uninstall(self) -> None:
        """Give SIGTERM back its previous disposition."""
        if self.installed:
            signal.signal(signal.SIGTERM, self._previous)
            self.installed = False

    def __enter__(self) -> Preemption:
        self.install()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only note it: the step in progress ends normally, the loop decides at its end.
        self.request()

    def request(self) -> None:
        """What a SIGTERM does: note the first one's time, count them all."""
        self.signals += 1
        if self.received_at is None:
            self.received_at = self.clock()

    @property
    def requested(self) -> bool:
        return self.received_at is not None

    def wrote_checkpoint(self, seconds: float) -> None:
        """Record one checkpoint write's duration (the estimate for a last one)."""
        self.slowest_write = max(self.slowest_write, seconds)

    def decide(self, gather: Callable[[Any], list[Any]] | None = None) -> Stop | None:
        """At a step boundary: a :class:`Stop` when a SIGTERM reached any rank, else None.

        :param gather: ``Backend.gather`` under data parallel (every rank must call this
            at every step boundary, as each call is a collective); None on one process.
            Every rank decides from the same gathered values, so all stop at one step
            and agree on writing the checkpoint (itself a collective).
        """
        waited = None if self.received_at is None else self.clock() - self.received_at
        mine = (waited, self.slowest_write, self.grace, self.signals)
        views = [mine] if gather is None else gather(mine)
        waits = [view[0] for view in views if view[0] is not None]
        if not waits:
            return None
        return Stop(
            waited=max(waits),
            slowest_write=max(view[1] for view in views),
            grace=views[0][2],
            signals=sum(view[3] for view in views),
        )
