"""Progress of long work in the task log: done/total, rate and ETA, every 30 s or 5%.

A job calls :meth:`Progress.advance` as it goes; a line is logged when 30 s have passed
since the last one or another 5% of the total is done, whichever comes first, and once
at the end. Torch-free.
"""

from __future__ import annotations

import logging
import time


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class Progress:
    """Counts ``unit`` of ``what`` towards ``total`` and logs how it goes.

    :param seconds: the most time between two lines.
    :param fraction: the most work between two lines, as a share of ``total``.
    :param clock: seconds, monotonic (tests give their own).
    """

    def __init__(
        self,
        what: str,
        total: int,
        *,
        unit: str = "rows",
        log: logging.Logger | None = None,
        seconds: float = 30.0,
        fraction: float = 0.05,
        clock=time.monotonic,
    ) -> None:
        self.what, self.total, self.unit = what, max(0, int(total)), unit
        self.log = log or logging.getLogger(__name__)
        self.seconds, self.step = seconds, max(1, int(self.total * fraction))
        self.clock = clock
        self.started = self.last_time = clock()
        self.done = self.last_done = 0
        self.logged = False

    def advance(self, n: int) -> None:
        """``n`` more units done; logs a line when one is due."""
        self.done += int(n)
        now = self.clock()
        if now - self.last_time >= self.seconds or self.done - self.last_done >= self.step:
            self._line(now)

    def finish(self) -> float:
        """Log the last line (unless the last advance just did); the seconds the work took."""
        now = self.clock()
        if self.done != self.last_done or not self.logged:
            self._line(now)
        return now - self.started

    def _line(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        left = self.total - self.done
        eta = _duration(left / rate) if rate > 0 and left > 0 else "0m00s"
        share = f" ({100 * self.done / self.total:.1f}%)" if self.total else ""
        self.log.info(
            "%s: %d of %d %s%s, %.3g %s/s, elapsed %s, ETA %s",
            self.what, self.done, self.total, self.unit, share, rate, self.unit,
            _duration(elapsed), eta,
        )  # fmt: skip
        self.last_time, self.last_done, self.logged = now, self.done, True
