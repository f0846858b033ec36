"""When nothing decides, a person does, inside the run (Airflow's human-in-the-loop).

A refresh whose gate or search check is INCONCLUSIVE (the interval straddles the SLA's
edge even over the whole pool of judged queries) would otherwise end without a
release. With ``EMBEDFRESH_APPROVAL_TIMEOUT_MINUTES`` set (a deployment setting, read
when the DAG file is parsed; unset: off, so scheduled runs stay unattended), the
refresh asks instead: :class:`ReleaseApprovalOperator` parks in Airflow 3.3's
``awaiting_input`` state (no worker, triggerer or pool slot held), showing the gate's
and the search check's figures and a link to the Model quality page, with Approve and
Reject and a ``reason`` to fill. Approve releases, recorded in the registry's history
as a person's move with who (the user who answered) and why; Reject, or no answer
before the timeout, releases nothing (fail closed: the default on timeout is Reject).
A FAIL is never asked about: it is a decision.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowSkipException

from embedfresh.operators import links

#: Minutes a person has to answer; unset or empty: no approvals (the refresh as before).
APPROVAL_ENV = "EMBEDFRESH_APPROVAL_TIMEOUT_MINUTES"
OPEN = "INCONCLUSIVE"


def approval_timeout(environ: Mapping[str, str] | None = None) -> dt.timedelta | None:
    """The approvals' timeout, or None when the deployment asks for none.

    :raises ValueError: not a positive number of minutes (the DAG file fails to import).
    """
    raw = (environ if environ is not None else os.environ).get(APPROVAL_ENV, "").strip()
    if not raw:
        return None
    try:
        minutes = float(raw)
    except ValueError:
        raise ValueError(f"{APPROVAL_ENV} must be a number of minutes, got {raw!r}") from None
    if not minutes > 0:
        raise ValueError(f"{APPROVAL_ENV} must be more than 0 minutes, got {raw!r}")
    return dt.timedelta(minutes=minutes)


def approved(answer: Any) -> dict[str, str] | None:
    """Who approved and why, from an approval task's XCom; None unless it says Approve."""
    if not isinstance(answer, Mapping) or answer.get("chosen_options") != [
        ApprovalOperator.APPROVE
    ]:
        return None
    user = answer.get("responded_by_user") or {}
    who = str(user.get("name") or user.get("id") or "").strip()
    why = str((answer.get("params_input") or {}).get("reason") or "").strip()
    return {"who": who or "unknown", "why": why or "approved without a reason"}


class ReleaseApprovalOperator(ApprovalOperator):
    """Asks a person to approve the release of a candidate whose gate or search checks
    could not decide; skips itself (nothing to ask) when they all said PASS.

    :param gate: the task id of the run's quality gate.
    :param search_check: the task id of the run's search checks (mapped: one per corpus).
    :param model: the model, for the page's link (templated).
    """

    template_fields: Sequence[str] = (*ApprovalOperator.template_fields, "model")

    def __init__(self, *, gate: str, search_check: str, model: str, **kwargs: Any) -> None:
        kwargs.setdefault("defaults", ApprovalOperator.REJECT)  # no answer: nothing released
        kwargs.setdefault(
            "params",
            {"reason": Param("", type="string", description="Why it may go live (recorded)")},
        )
        super().__init__(subject="Release a candidate the gate could not decide?", **kwargs)
        self.gate, self.search_check, self.model = gate, search_check, model

    def execute(self, context: Any) -> Any:
        ti = context["ti"]
        decision = ti.xcom_pull(task_ids=self.gate) or {}
        checks = [c for c in _as_list(ti.xcom_pull(task_ids=self.search_check)) if c]
        verdicts = [decision.get("verdict"), *(c.get("verdict") for c in checks)]
        if OPEN not in verdicts:
            raise AirflowSkipException(f"nothing to approve: {verdicts} decided")
        self.subject = (
            f"{self.model}: release candidate {decision.get('candidate')}? The gate said "
            f"{decision.get('verdict')}, the search check{'s' if len(checks) > 1 else ''} "
            f"{', '.join(str(c.get('verdict')) for c in checks) or 'nothing'}"
        )
        self.body = approval_body(decision, checks, links.model_quality_url(self.model))
        return super().execute(context)


def _as_list(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, Mapping):
        return [dict(value)]
    return [v for v in value if isinstance(v, Mapping)]


def approval_body(decision: Mapping[str, Any], checks: list[Mapping[str, Any]], page: str) -> str:
    """What a person reads before answering (Markdown): each decision's figures."""
    lines = [
        f"**Gate: {decision.get('verdict')}** against {decision.get('reference')} "
        f"({decision.get('n_queries')} judged queries): {decision.get('reason')}",
        "",
    ]
    for m in decision.get("metrics") or []:
        if m.get("d") is not None:
            lines.append(
                f"- {m['metric']}: d {m['d']:+.3%}, interval [{m['ci_low']:+.3%}, "
                f"{m['ci_high']:+.3%}], {m['verdict']}"
            )
    for c in checks:
        lines += [
            "",
            f"**Search check of {c.get('corpus')}: {c.get('verdict')}**: {c.get('reason')}",
        ]
    lines += [
        "",
        f"Figures and history: [Model quality]({page}). Approve releases the candidate with "
        "its corpus embeddings, recorded with your name and reason; Reject, or no answer "
        "before the timeout, keeps the live release.",
    ]
    return "\n".join(lines)
