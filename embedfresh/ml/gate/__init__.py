"""The quality gate: paired bootstrap intervals on relative metric differences, and verdicts.

:mod:`embedfresh.ml.gate.stats` evaluates metrics on the held-out outcomes and bootstraps the relative
difference d = (m_cand - m_ref) / m_ref over the same examples; :mod:`embedfresh.ml.gate.decision`
turns the intervals into PASS / FAIL / INCONCLUSIVE for the ``no_regression`` and ``parity``
modes, per evaluation point or over a whole training curve. Pure numpy.
"""
