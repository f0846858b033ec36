"""Verdicts of the quality gate: PASS, FAIL or INCONCLUSIVE from paired bootstrap intervals.

Every metric is compared through its relative difference d = (m_cand - m_ref) / m_ref and
the paired bootstrap interval of d (:func:`embedfresh.ml.gate.stats.paired_bootstrap`). With
g = d where higher is better and g = -d otherwise (g < 0 means the candidate is worse) and a
tolerance t (0.001, the 0.1% SLA):

- ``no_regression`` (a refresh against production, one-sided): PASS when the interval of g
  lies at or above -t, FAIL when it lies entirely below -t, INCONCLUSIVE otherwise.
  Improvements pass.
- ``parity`` (two backends from the same checkpoint, two-sided): PASS when the interval of d
  lies inside (-t, t), FAIL when it lies entirely above t or entirely below -t,
  INCONCLUSIVE otherwise.

Metrics combine as: any FAIL fails, else any INCONCLUSIVE is inconclusive, else PASS. Only
PASS promotes. An INCONCLUSIVE verdict comes with ``n_needed``, the eval-set size at which
an interval as wide as this one, shrunk as 1/sqrt(n) around the same estimate, would clear
the tolerance edge: a request for a larger eval set rather than a guess. It assumes the
estimate stays put, so treat it as a floor and ask for a margin above it.

Over a training curve (:func:`gate_curve`) each evaluation point is gated on its own at the
stated confidence; no multiplicity correction is applied, so with many points a FAIL is only
as rare as (1 - confidence) / 2 per point and metric when the true difference sits on the
tolerance edge, and far rarer when it sits well inside.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from embedfresh.core.exit_codes import BadInputError
from embedfresh.ml.gate.stats import (
    BootstrapResult,
    Outcomes,
    check_side,
    paired_bootstrap,
    required_keys,
)

DEFAULT_TOLERANCE = 0.001
HIGHER_IS_BETTER: dict[str, bool] = {
    "accuracy": True,
    "auc": True,
    "ndcg_at_10": True,
    "recall_at_10": True,
    "recall_at_100": True,
    "mrr_at_10": True,
    "log_loss": False,
}
# Beyond this many examples an eval set is not a practical request: the estimate sits (almost)
# on the tolerance edge and no affordable n would decide.
PRACTICAL_N_CAP = 100_000_000


class Verdict(enum.StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"


class Mode(enum.StrEnum):
    NO_REGRESSION = "no_regression"
    PARITY = "parity"


@dataclass(frozen=True)
class MetricGate:
    """One metric's verdict; ``bootstrap`` is None when the metric is missing from a side."""

    metric: str
    verdict: Verdict
    reason: str
    higher_is_better: bool
    bootstrap: BootstrapResult | None = None
    n_needed: int | None = None
    n_needed_capped: bool = False

    def to_dict(self) -> dict[str, Any]:
        fields = BootstrapResult.__dataclass_fields__
        stats = self.bootstrap.to_dict() if self.bootstrap else dict.fromkeys(fields)
        stats.pop("metric", None)
        return _json_safe(
            {
                "metric": self.metric,
                "verdict": self.verdict,
                "reason": self.reason,
                "higher_is_better": self.higher_is_better,
                **stats,
                "n_needed": self.n_needed,
                "n_needed_capped": self.n_needed_capped,
            }
        )


@dataclass(frozen=True)
class GateResult:
    """The gate's decision on one candidate/reference pair, with every metric's interval."""

    verdict: Verdict
    mode: Mode
    tolerance: float
    confidence: float
    resamples: int
    seed: int
    metrics: tuple[MetricGate, ...]
    reason: str
    n_needed: int | None = None
    n_needed_capped: bool = False

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.PASS

    def metric(self, name: str) -> MetricGate:
        for m in self.metrics:
            if m.metric == name:
                return m
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(
            {
                "verdict": self.verdict,
                "mode": self.mode,
                "tolerance": self.tolerance,
                "confidence": self.confidence,
                "resamples": self.resamples,
                "seed": self.seed,
                "reason": self.reason,
                "n_needed": self.n_needed,
                "n_needed_capped": self.n_needed_capped,
                "metrics": [m.to_dict() for m in self.metrics],
            }
        )


@dataclass(frozen=True)
class CurvePoint:
    step: int
    result: GateResult


@dataclass(frozen=True)
class CurveResult:
    """Parity over every evaluation point of a training curve."""

    verdict: Verdict
    mode: Mode
    tolerance: float
    points: tuple[CurvePoint, ...]
    max_abs_d: float | None
    max_abs_d_step: int | None
    max_abs_d_metric: str | None
    reason: str
    n_needed: int | None = None
    n_needed_capped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(
            {
                "verdict": self.verdict,
                "mode": self.mode,
                "tolerance": self.tolerance,
                "reason": self.reason,
                "max_abs_d": self.max_abs_d,
                "max_abs_d_step": self.max_abs_d_step,
                "max_abs_d_metric": self.max_abs_d_metric,
                "n_needed": self.n_needed,
                "n_needed_capped": self.n_needed_capped,
                "points": [{"step": p.step, **p.result.to_dict()} for p in self.points],
            }
        )


def gate(
    cand: Outcomes,
    ref: Outcomes,
    metrics: Sequence[str],
    mode: Mode | str,
    tolerance: float = DEFAULT_TOLERANCE,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    higher_is_better: Mapping[str, bool] | None = None,
    min_pass_n: int = 1,
) -> GateResult:
    """Gate a candidate against a reference on ``metrics``.

    :param cand: the candidate's outcome arrays ('label', 'prob', 'recall_at_10', ...), aligned
        with the reference's, either flat or grouped by metric family
        (``{"relevance": {"label": ..., "prob": ...}, "retrieval": {"recall_at_10": ...}}``);
        a metric whose arrays are absent on a side FAILs as missing.
    :param mode: ``no_regression`` or ``parity``.
    :param tolerance: the relative tolerance t (0.001 = 0.1%).
    :param higher_is_better: overrides of :data:`HIGHER_IS_BETTER` per metric.
    :param min_pass_n: the fewest examples a metric's PASS rests on; on fewer, an
        interval that clears the margin is INCONCLUSIVE (asking for ``min_pass_n``).
    :raises BadInputError: bad parameters, or outcomes that are malformed or misaligned.
    """
    mode, names = check_parameters(metrics, mode, tolerance)
    directions = {**HIGHER_IS_BETTER, **(higher_is_better or {})}
    cand, ref = _flatten(cand, "candidate"), _flatten(ref, "reference")

    results = []
    for name in names:
        if name not in directions:
            raise BadInputError(f"metric {name!r} has no direction; pass higher_is_better")
        hib = bool(directions[name])
        sides = [s for s, o in (("candidate", cand), ("reference", ref)) if _lacks(name, o)]
        if sides:
            reason = f"metric {name} missing from {' and '.join(sides)}"
            results.append(MetricGate(name, Verdict.FAIL, reason, hib))
            continue
        boot = paired_bootstrap(name, cand, ref, resamples, confidence, seed)
        results.append(_too_few(_judge(boot, mode, tolerance, hib), min_pass_n))

    verdict = _combine([r.verdict for r in results])
    n_needed, capped = _overall_n(results)
    return GateResult(
        verdict=verdict,
        mode=mode,
        tolerance=float(tolerance),
        confidence=float(confidence),
        resamples=int(resamples),
        seed=int(seed),
        metrics=tuple(results),
        reason=_summary(verdict, results),
        n_needed=n_needed,
        n_needed_capped=capped,
    )


def check_parameters(
    metrics: Sequence[str], mode: Mode | str, tolerance: float
) -> tuple[Mode, list[str]]:
    """The mode and metric names of a gate, checked (before anything is evaluated).

    :raises BadInputError: an unknown mode or metric, no metric, a repeated one, or a
        tolerance that is not a finite number >= 0.
    """
    mode = _mode(mode)
    names = _metric_names(metrics)
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise BadInputError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    return mode, names


def check_candidate(cand: Outcomes, metrics: Sequence[str]) -> None:
    """Check the candidate's own outcome arrays for every metric it has, so a bad
    candidate is refused before the reference is evaluated (and its report written).

    :raises BadInputError: malformed arrays or no rows.
    """
    flat = _flatten(cand, "candidate")
    for name in _metric_names(metrics):
        if not _lacks(name, flat):  # a missing metric is a FAIL of the gate, not an error
            check_side(name, flat, "candidate")


def gate_curve(
    points: Sequence[tuple[int, Outcomes, Outcomes]],
    metrics: Sequence[str],
    mode: Mode | str = Mode.PARITY,
    tolerance: float = DEFAULT_TOLERANCE,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    higher_is_better: Mapping[str, bool] | None = None,
) -> CurveResult:
    """Gate every evaluation point ``(step, cand, ref)`` of a training curve (parity by default).

    FAIL if any point fails, INCONCLUSIVE if any is inconclusive, PASS otherwise.
    """
    if not points:
        raise BadInputError("a curve needs at least one evaluation point")
    steps = [int(p[0]) for p in points]
    if len(set(steps)) != len(steps):
        raise BadInputError(f"evaluation steps repeat: {steps}")
    mode = _mode(mode)
    gated = tuple(
        CurvePoint(
            step,
            gate(c, r, metrics, mode, tolerance, resamples, confidence, seed, higher_is_better),
        )
        for step, c, r in points
    )

    worst: tuple[float, int, str] | None = None
    for p in gated:
        for m in p.result.metrics:
            if m.bootstrap is not None and (worst is None or abs(m.bootstrap.d) > worst[0]):
                worst = (abs(m.bootstrap.d), p.step, m.metric)
    verdict = _combine([p.result.verdict for p in gated])
    needed = [
        (p.result.n_needed, p.result.n_needed_capped)
        for p in gated
        if p.result.n_needed is not None
    ]
    failing = [p.step for p in gated if p.result.verdict is Verdict.FAIL]
    open_ = [p.step for p in gated if p.result.verdict is Verdict.INCONCLUSIVE]
    if failing:
        reason = f"FAIL at steps {failing}"
    elif open_:
        reason = f"INCONCLUSIVE at steps {open_}"
    else:
        reason = f"PASS at all {len(gated)} evaluation points"
    if worst is not None:
        reason += f"; max |d| = {worst[0]:.4%} ({worst[2]} at step {worst[1]})"
    return CurveResult(
        verdict=verdict,
        mode=mode,
        tolerance=float(tolerance),
        points=gated,
        max_abs_d=None if worst is None else worst[0],
        max_abs_d_step=None if worst is None else worst[1],
        max_abs_d_metric=None if worst is None else worst[2],
        reason=reason,
        n_needed=max((n for n, _ in needed), default=None),
        n_needed_capped=any(capped for _, capped in needed),
    )


# --- per-metric judgement ---------------------------------------------------------------------


def _judge(boot: BootstrapResult, mode: Mode, t: float, hib: bool) -> MetricGate:
    name, conf = boot.metric, f"{boot.confidence:.0%}"
    if mode is Mode.NO_REGRESSION:
        # Improvement-signed: g < 0 means worse, whichever way the metric points.
        if hib:
            g, lo, hi = boot.d, boot.ci_low, boot.ci_high
        else:
            # + 0.0 turns -0.0 into 0.0, so reasons never show '-0.0000%'.
            g, lo, hi = -boot.d + 0.0, -boot.ci_high + 0.0, -boot.ci_low + 0.0
        shown = f"improvement-signed d = {g:+.4%}, {conf} interval [{lo:+.4%}, {hi:+.4%}]"
        if lo >= -t:
            return MetricGate(name, Verdict.PASS, f"{shown}: not worse than -{t:.4%}", hib, boot)
        if hi < -t:
            reason = f"{shown}: worse than -{t:.4%} with {conf} confidence"
            return MetricGate(name, Verdict.FAIL, reason, hib, boot)
        edge = -t
    else:
        g, lo, hi = boot.d, boot.ci_low, boot.ci_high
        shown = f"d = {g:+.4%}, {conf} interval [{lo:+.4%}, {hi:+.4%}]"
        if -t < lo and hi < t:
            return MetricGate(name, Verdict.PASS, f"{shown}: within +/-{t:.4%}", hib, boot)
        if lo > t or hi < -t:
            reason = f"{shown}: outside +/-{t:.4%} with {conf} confidence"
            return MetricGate(name, Verdict.FAIL, reason, hib, boot)
        # The nearest edge binds: clearing it clears the farther one too.
        edge = t if g >= 0 else -t

    n_needed, capped = _n_needed(boot.n, g, lo, hi, edge)
    if capped:
        hint = (
            f"the estimate sits on the tolerance edge {edge:+.4%}: no practical eval set "
            f"decides (n_needed capped at {n_needed:,})"
        )
    else:
        hint = f"about {n_needed:,} examples (now {boot.n:,}) would decide"
    reason = f"{shown}: straddles the tolerance edge {edge:+.4%}; {hint}"
    return MetricGate(name, Verdict.INCONCLUSIVE, reason, hib, boot, n_needed, capped)


def _too_few(judged: MetricGate, min_pass_n: int) -> MetricGate:
    """A PASS on fewer than ``min_pass_n`` examples, made INCONCLUSIVE: an interval from
    so few under-covers (a FAIL stands: it keeps production where it is)."""
    if judged.verdict is not Verdict.PASS or judged.bootstrap.n >= min_pass_n:
        return judged
    n = judged.bootstrap.n
    reason = (
        f"{judged.reason}, but on {n:,} examples, fewer than the {min_pass_n:,} a PASS "
        f"rests on (min_queries)"
    )
    return replace(judged, verdict=Verdict.INCONCLUSIVE, reason=reason, n_needed=min_pass_n)


def _n_needed(n: int, est: float, lo: float, hi: float, edge: float) -> tuple[int, bool]:
    """The n at which the interval, shrunk as 1/sqrt(n) around ``est``, clears ``edge``.

    Uses the half of the interval that faces the edge (percentile intervals need not be
    symmetric). Returns (n_needed, capped).
    """
    half = (est - lo) if est >= edge else (hi - est)
    gap = abs(est - edge)
    if gap <= 1e-12 * max(1.0, abs(edge)):
        return PRACTICAL_N_CAP, True
    needed = n * (max(half, 0.0) / gap) ** 2
    if not math.isfinite(needed) or needed >= PRACTICAL_N_CAP:
        return PRACTICAL_N_CAP, True
    # The interval did not decide at n, so the request is for more than n in any case.
    return max(math.ceil(needed), n + 1), False


def _combine(verdicts: Sequence[Verdict]) -> Verdict:
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    if Verdict.INCONCLUSIVE in verdicts:
        return Verdict.INCONCLUSIVE
    return Verdict.PASS


def _overall_n(results: Sequence[MetricGate]) -> tuple[int | None, bool]:
    needed = [(r.n_needed, r.n_needed_capped) for r in results if r.n_needed is not None]
    if not needed:
        return None, False
    return max(n for n, _ in needed), any(capped for _, capped in needed)


def _summary(verdict: Verdict, results: Sequence[MetricGate]) -> str:
    deciding = [r for r in results if r.verdict is verdict] if verdict is not Verdict.PASS else []
    if not deciding:
        return f"PASS on {', '.join(r.metric for r in results)}"
    return f"{verdict.value}: " + "; ".join(f"{r.metric}: {r.reason}" for r in deciding)


# --- helpers ----------------------------------------------------------------------------------


def _mode(mode: Mode | str) -> Mode:
    try:
        return Mode(mode)
    except ValueError:
        choices = [m.value for m in Mode]
        raise BadInputError(f"unknown gate mode {mode!r}; choose from {choices}") from None


def _metric_names(metrics: Sequence[str]) -> list[str]:
    if isinstance(metrics, str):
        metrics = [metrics]
    names = list(metrics)
    if not names:
        raise BadInputError("the gate needs at least one metric")
    if len(set(names)) != len(names):
        raise BadInputError(f"metrics repeat: {names}")
    for name in names:
        required_keys(name)  # raises BadInputError on an unknown metric
    return names


def _flatten(outcomes: Outcomes, side: str) -> Outcomes:
    """Merge outcomes grouped by metric family into one flat dict of arrays."""
    if not any(isinstance(v, Mapping) for v in outcomes.values()):
        return outcomes
    flat: dict[str, Any] = {}
    for family, value in outcomes.items():
        group = value if isinstance(value, Mapping) else {family: value}
        for key, arr in group.items():
            if key in flat:
                raise BadInputError(f"{side} outcomes define {key!r} in more than one family")
            flat[key] = arr
    return flat


def _lacks(name: str, outcomes: Outcomes) -> bool:
    return any(outcomes.get(key) is None for key in required_keys(name))


def _json_safe(value: Any) -> Any:
    """Plain JSON types: enums by value, numpy scalars unwrapped, NaN and inf as None."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value
