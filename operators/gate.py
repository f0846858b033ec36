"""The quality gate: candidate vs reference within the 0.1% SLA, as a decision.

A gate that does not PASS is a decision, not an error: in ``no_regression`` mode the
task succeeds with the decision as its XCom (the verdict, the reason, each metric's
``d`` and interval), and what follows it skips itself (:func:`decision_passed` for a
``ShortCircuitOperator``, :class:`~embedfresh.operators.ReleaseOperator` for the
release). ``parity`` mode fails the task (exit 3, no retry) on anything but PASS: a
migration either proves parity or stops.

Reports are keyed by task, so any number of evaluations and gates of one run coexist:
:mod:`embedfresh.operators.reports` names the report a task writes, and a gate names the evaluation it
follows (``evaluation``), a release the gate it follows (``gate``), each defaulting to
the DAG's only one and refusing an ambiguous choice when the DAG file is parsed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from embedfresh.operators.base import EmbedfreshJobOperator
from embedfresh.operators.evaluate import EvaluationOperator, QueryCap
from embedfresh.operators.reports import eval_report_name, gate_report_name

log = logging.getLogger(__name__)

#: The decision that lets a candidate through.
PASS = "PASS"


def followed_task(operator: Any, named: str | None, kind: type, role: str) -> str | None:
    """The task id of the ``kind`` task that ``operator`` follows: ``named`` when given
    (checked when it is already in the DAG), else the DAG's only ``kind`` task.

    Called when the operator is built (the DAG's tasks so far: a refusal there is an
    import error of the DAG file) and again when it runs (the whole DAG). None: the
    DAG has none (yet).

    :raises ValueError: ``named`` is a task of another kind, or several ``kind`` tasks
        and none named.
    """
    dag = operator.get_dag()
    tasks = [t for t in (dag.tasks if dag is not None else []) if isinstance(t, kind)]
    if named:
        task = dag.task_dict.get(named) if dag is not None else None
        if task is not None and not isinstance(task, kind):
            raise ValueError(
                f"task {operator.task_id}: {role}={named!r} names a {type(task).__name__}, "
                f"not a {kind.__name__}"
            )
        return named
    if len(tasks) > 1:
        raise ValueError(
            f"task {operator.task_id} follows one of several {kind.__name__}s "
            f"({sorted(t.task_id for t in tasks)}): name it with {role}=<task id>"
        )
    return tasks[0].task_id if tasks else None


def decision_passed(decision: Mapping[str, Any] | None, ask: bool = False) -> bool:
    """True when a gate's decision (its XCom) is PASS: the ``python_callable`` of a
    ``ShortCircuitOperator`` after the gate, so a declined candidate is neither embedded
    nor released and the run stays green, with the decision logged. ``ask``: an
    INCONCLUSIVE decision goes on too, for a person to decide before the release
    (:mod:`embedfresh.operators.approval`)."""
    if not decision:
        raise AirflowFailException("the gate returned no decision: it did not run")
    verdict = decision.get("verdict")
    if verdict == PASS:
        log.info("gate PASS: %s", decision.get("reason"))
        return True
    if ask and verdict == "INCONCLUSIVE":
        log.warning(
            "gate INCONCLUSIVE for candidate %s (%s): it is embedded and checked, and a "
            "person is asked before any release", decision.get("candidate"), decision.get("reason"),
        )  # fmt: skip
        return True
    log.warning(
        "gate %s for candidate %s: %s. Nothing downstream runs; production and the live "
        "release stay as they are. Decision: %s",
        verdict, decision.get("candidate"), decision.get("reason"), decision.get("report"),
    )  # fmt: skip
    return False


class QualityGateOperator(QueryCap, EmbedfreshJobOperator):
    """Decides whether the run's candidate may go live (``python -m embedfresh.jobs.gate``).

    Returns the decision as XCom: ``verdict`` (PASS, FAIL, INCONCLUSIVE), ``mode``,
    ``reason``, ``candidate``, ``reference``, ``tolerance``, ``report`` (gate.json's URL)
    and ``metrics``: each metric's ``d``, interval ``ci_low``..``ci_high`` at
    ``confidence``, ``n`` and both values. In ``no_regression`` mode every decision ends
    the task successfully (follow it with :func:`decision_passed`); in ``parity`` mode
    anything but PASS exits 3: the task fails without retry, production untouched.

    :param mode: ``no_regression`` (one-sided, vs production) or ``parity`` (two-sided)
        (templated).
    :param tolerance: relative tolerance, 0.001 being the 0.1% SLA (templated).
    :param metrics: the metrics that must all pass, a list or its JSON text (templated:
        ``"{{ params.gate_metrics | tojson }}"``); None: the gate job's default.
    :param evaluation: the task id of the :class:`~embedfresh.operators.EvaluationOperator`
        whose report the gate reads; None: the DAG's only one (several: refused when the
        DAG file is parsed), or ``evaluate``'s report when the DAG has none.
    """

    job_name = "gate"
    template_fields: Sequence[str] = (
        *EmbedfreshJobOperator.template_fields,
        "mode",
        "tolerance",
        "metrics",
        "max_queries",
    )

    def __init__(
        self,
        *,
        mode: str = "no_regression",
        tolerance: float | str = 0.001,
        metrics: list[str] | str | None = None,
        evaluation: str | None = None,
        max_queries: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_queries = max_queries
        self.mode = mode
        self.tolerance = tolerance
        self.metrics = metrics
        self.evaluation = followed_task(self, evaluation, EvaluationOperator, "evaluation")
        self._map_index: int | None = None

    def use_run_context(self, context: Any) -> None:
        ti = context.get("ti") if hasattr(context, "get") else None
        self._map_index = getattr(ti, "map_index", None)
        try:
            self.evaluation = followed_task(self, self.evaluation, EvaluationOperator, "evaluation")
        except ValueError as e:
            raise AirflowFailException(str(e)) from e

    @property
    def report_name(self) -> str:
        """This gate's report, ``reports/{report_name}.json`` (:func:`gate_report_name`)."""
        return gate_report_name(self.task_id, self._map_index)

    def job_specific_settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "mode": self.mode,
            "tolerance": self.tolerance,
            "report_name": self.report_name,
            "eval_report": eval_report_name(self.evaluation or "evaluate"),
            # The decision is the outcome; parity still exits 3 on non-PASS (the job's rule).
            "refusal_exits": False,
            **self.cap_setting(),
        }
        if self.metrics is not None:
            metrics = self.metrics
            if isinstance(metrics, str):  # a rendered template: JSON text of the list
                try:
                    metrics = json.loads(metrics)
                except json.JSONDecodeError:
                    raise AirflowFailException(
                        f"metrics must be a list of metric names, got {self.metrics!r}"
                    ) from None
            settings["metrics"] = metrics
        return settings
