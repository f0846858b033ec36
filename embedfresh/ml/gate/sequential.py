"""Looks at a growing evaluation whose error rate holds over all of them.

When a decision is open and the pool of judged queries has more, the gate evaluates
more and looks again. Looking again at 95% each time would make a false PASS far more
likely than 2.5% (every look is another chance), so the looks follow a group-sequential
design fixed before the first one:

- **Looks**: the first look's queries, then twice as many each time, up to the pool
  (or ``max_queries``): n_1, 2 n_1, 4 n_1, ..., n_max. Doubling keeps the number of
  looks small (each costs alpha) while the interval narrows by sqrt(2) a look.
- **Alpha spending** (Lan & DeMets 1983) with the Pocock-type function
  ``alpha(t) = alpha * ln(1 + (e - 1) t)``, ``t = n_k / n_max``: look k spends
  ``alpha(t_k) - alpha(t_(k-1))`` in each tail, i.e. decides with the two-sided
  bootstrap interval at confidence ``1 - 2 * spent_k``. Pocock's shape spends early,
  when most days decide; O'Brien-Fleming's would save it for the last look.
- **Error rate**: a false PASS (or FAIL) needs one look's interval to miss on its side;
  by the union bound (Bonferroni) that happens with probability at most the sum of what
  the looks spent, ``alpha``, whatever the correlation between looks. Conservative: the
  exact boundaries for the looks' correlation would be somewhat narrower.

A design with one look (``n_1 == n_max``) is the plain fixed-size gate at ``confidence``.
The coverage is tested by simulation in ``tests/test_gate_stats.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Each tail of a look's bootstrap interval holds at least this many resamples, so a
#: look with a small alpha still reads its percentile from enough of them.
TAIL_RESAMPLES = 50


def spending(t: float, alpha: float) -> float:
    """Alpha spent by information fraction ``t`` (Pocock-type, Lan & DeMets)."""
    return alpha * math.log1p((math.e - 1.0) * min(max(t, 0.0), 1.0))


@dataclass(frozen=True)
class Look:
    """One planned look: how many queries, and the two-sided confidence it decides at."""

    n: int
    confidence: float

    def resamples(self, base: int) -> int:
        """Bootstrap resamples for this look: ``base``, or enough to fill each tail."""
        tail = (1.0 - self.confidence) / 2.0
        return max(int(base), math.ceil(TAIL_RESAMPLES / tail))


def plan_looks(first: int, n_max: int, confidence: float) -> list[Look]:
    """The looks of a gate whose first look has ``first`` queries and which may grow to
    ``n_max``, at overall two-sided ``confidence`` (each tail ``(1 - confidence) / 2``)."""
    if first < 1 or n_max < 1:
        raise ValueError("a look needs at least one query")
    first = min(first, n_max)
    sizes = [first]
    while sizes[-1] < n_max:
        sizes.append(min(2 * sizes[-1], n_max))
    alpha = (1.0 - confidence) / 2.0
    looks, spent = [], 0.0
    for n in sizes:
        now = spending(n / n_max, alpha)
        looks.append(Look(n, 1.0 - 2.0 * (now - spent)))
        spent = now
    return looks
